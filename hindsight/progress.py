"""Progress bars whose ETA is not dominated by XLA compilation."""

from __future__ import annotations

from tqdm import tqdm

from hindsight import interrupts


class CompileAwareBar(tqdm):
  """tqdm whose rate and ETA count only the work after the first update.

  The first unit of work (a labeling chunk, a training step) pays for compiling its XLA
  program, seconds to minutes: counted in, it made the first ETA read hours. Until the first
  update the description says "(compiling)" and no rate or ETA is shown; from then on the
  rate is the average over what followed (smoothing 0: steady work, and no moving average
  that remembers the compile). The elapsed clock runs from the start, compile included.
  `compiles=False`: the description never says "(compiling)" (the rate still counts from the
  first update).
  """

  def __init__(self, *args, desc: str = "", compiles: bool = True, **kwargs):
    kwargs.setdefault("smoothing", 0.0)
    # The terminal's width at every refresh: a line wider than the terminal wraps, and the
    # next refresh rewrites only its last row (two interleaved copies of the bar).
    kwargs.setdefault("dynamic_ncols", True)
    self._plain_desc = desc
    self._origin: tuple[float, float] | None = None  # (n, time) the rate counts from
    # compiles False: work that compiles nothing (requests to a server) is not "compiling".
    super().__init__(*args, desc=f"{desc} (compiling)" if compiles else desc, **kwargs)

  @property
  def format_dict(self):
    d = super().format_dict
    rate = None
    if self._origin is not None:
      n0, t0 = self._origin
      dt = self._time() - t0
      rate = (d["n"] - n0) / dt if d["n"] > n0 and dt > 0 else None
    d["rate"] = rate
    if rate is None:
      d["initial"] = d["n"]  # format_meter's fallback rate (n - initial) / elapsed is then 0
    return d

  def update(self, n=1):
    interrupts.check()  # a Ctrl-C the interpreter swallowed still stops the job here
    if self._origin is None and not self.disable:
      self.n += n  # the first unit: counted, not printed with a rate that holds the compile
      self._origin = (self.n, self._time())
      self.set_description(self._plain_desc)  # refreshes
      return True
    return super().update(n)
