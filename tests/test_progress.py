"""Progress bars: the first ETA is not dominated by compilation (hours at the first step)."""

import io
import time

from hindsight.progress import CompileAwareBar


def test_rate_and_eta_start_after_the_compiling_first_update():
  bar = CompileAwareBar(total=1000, desc="train", file=io.StringIO(), mininterval=0)
  assert bar.desc.startswith("train (compiling)")
  time.sleep(0.3)  # the first step compiles
  bar.update(1)
  assert "compiling" not in bar.desc
  bar.update(9)
  d = bar.format_dict
  assert d["elapsed"] < 0.25, d["elapsed"]  # the compile is not in the clock
  rate = (d["n"] - d["initial"]) / max(d["elapsed"], 1e-9)
  eta = (d["total"] - d["n"]) / rate
  assert eta < 1.0, eta  # with the compile counted: 990 / (10 / 0.3 s) = 30 s
  bar.close()


def test_a_disabled_bar_is_inert():
  bar = CompileAwareBar(total=3, desc="x", disable=True)
  bar.update(1)
  bar.update(2)
  bar.close()
