"""Progress bars whose first ETA is not dominated by XLA compilation."""

from __future__ import annotations

from tqdm import tqdm

from hindsight import interrupts


class CompileAwareBar(tqdm):
  """tqdm whose rate and ETA count only the work after the first update.

  The first unit of work (a labeling chunk, a training step) pays for compiling its XLA
  program, seconds to minutes: counted in, it made the first ETA read hours. Until the first
  update the description says "(compiling)"; from then on the rate is the average over what
  followed (smoothing 0: steady work, and no moving average that remembers the compile).
  """

  def __init__(self, *args, desc: str = "", **kwargs):
    kwargs.setdefault("smoothing", 0.0)
    self._plain_desc = desc
    self._compiled = False
    super().__init__(*args, desc=f"{desc} (compiling)", **kwargs)

  def update(self, n=1):
    interrupts.check()  # a Ctrl-C the interpreter swallowed still stops the job here
    shown = super().update(n)
    if not self._compiled and not self.disable:
      self._compiled = True
      self.initial = self.n  # format_meter's rate is (n - initial) / (now - start_t)
      self.start_t = self.last_print_t = self._time()
      self.set_description(self._plain_desc)
    return shown
