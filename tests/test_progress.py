"""Progress bars: the first ETA is not dominated by compilation (hours at the first step)."""

import contextlib
import io

import pytest

from hindsight.progress import CompileAwareBar


class _Clock:
  """A clock the test moves by hand (tqdm reads `time.time` as imported by tqdm.std)."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_rate_and_eta_start_after_the_compiling_first_update(monkeypatch):
  clock = _Clock()
  monkeypatch.setattr("tqdm.std.time", clock)
  out = io.StringIO()
  bar = CompileAwareBar(total=1000, desc="train", file=out, mininterval=0)
  assert bar.desc.startswith("train (compiling)")
  clock.now += 30.0  # the first step compiles
  bar.update(1)
  assert "compiling" not in bar.desc
  # The line printed at the first update has no ETA (it read 47:01 from the compile).
  assert str(bar).endswith("[00:30<?, ?it/s]"), str(bar)
  clock.now += 1.0  # nine steady steps in one second
  bar.update(9)
  d = bar.format_dict
  assert d["elapsed"] == pytest.approx(31.0)  # the clock runs from the start, compile included
  assert d["rate"] == pytest.approx(9.0)  # the rate from the end of the first step
  # 990 steps left at 9/s: 110 s (with the compile counted it would read 990 / (10 / 31 s)).
  assert "00:31<01:50" in str(bar), str(bar)
  bar.close()


def test_a_disabled_bar_is_inert():
  out = io.StringIO()
  bar = CompileAwareBar(total=3, desc="x", disable=True, file=out)
  bar.update(1)
  bar.update(2)
  bar.close()
  assert out.getvalue() == ""  # prints nothing
  assert bar.n == 0  # and counts nothing


def test_a_ctrl_c_the_interpreter_swallowed_still_stops_at_the_next_update(monkeypatch):
  """SIGINT inside a callback whose exceptions the interpreter drops (JAX's GC hook): the
  KeyboardInterrupt is lost there, but the next progress update raises it again."""
  import signal

  from hindsight import interrupts

  monkeypatch.setattr(interrupts, "_pending", False)
  previous = signal.getsignal(signal.SIGINT)
  try:
    interrupts.install()
    assert signal.getsignal(signal.SIGINT) is interrupts._handler
    bar = CompileAwareBar(total=3, file=io.StringIO())
    bar.update(1)  # no interrupt yet: nothing happens
    with contextlib.suppress(KeyboardInterrupt):  # what "Exception ignored in" amounts to
      signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
      bar.update(1)
    bar.close()
  finally:
    signal.signal(signal.SIGINT, previous)
