"""The server's model, batching and limits (light on imports: the CLI's flags come from these
fields)."""

from __future__ import annotations

import dataclasses

from hindsight.errors import HindsightError


@dataclasses.dataclass(frozen=True)
class ServeConfig:
  """The server's model, batching and limits (the `hindsight serve` flags)."""

  checkpoint: str
  step: str = "best"
  window_ms: float = 2.0  # how long the first waiting request waits for company
  max_batch: int = 64  # trajectories scored together at most
  max_body_bytes: int = 8 << 20
  max_trajectories: int = 256  # per request
  # per trajectory (0: the model's max_length, the longest episode it was trained on; more
  # opts in to scoring longer ones, whose positions past it reuse the last one it knows)
  max_steps: int = 0
  warmup: bool = True  # compile every bucket before /readyz says ready

  def __post_init__(self):
    """One-line errors for limits the server cannot run with (the flags map onto these)."""
    for name in ("window_ms", "max_batch", "max_body_bytes", "max_trajectories", "max_steps"):
      value = getattr(self, name)
      if value < 0 or (name != "max_steps" and value == 0):
        raise HindsightError(f"--{name.replace('_', '-')} must be > 0, got {value}")

  def steps_limit(self, spec) -> int:
    """Steps per trajectory served (and warmed up): max_steps, or the model's max_length."""
    return self.max_steps or spec.max_length
