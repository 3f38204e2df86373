"""What `hindsight audit` checks and how hard (light on imports: the CLI's flags come from
these fields)."""

from __future__ import annotations

import dataclasses

import numpy as np

from hindsight.errors import HindsightError

AUDIT_SALT = 0xA0D17  # folds the audit's keys off the root key of --seed


@dataclasses.dataclass(frozen=True)
class AuditConfig:
  """What `hindsight audit` checks and how hard (the CLI flags map onto these)."""

  checkpoint: str  # a training run's workdir
  budget: int  # env steps the rollouts may spend (text models: completions)
  out: str
  env: str | None = None  # audit fresh episodes of this spec ...
  trajectories: str | None = None  # ... or these (a label dataset dir or a JSON-lines file)
  step: str = "run"  # checkpoint step: run (the training run's choice), best, last or N
  episodes: int = 256  # pool size (--env), or the most trajectories read (0: all)
  rollouts: int = 32  # K branches per arm of every audited step
  gap_tolerance: float = 0.0  # |mean gap| allowed (0: a tenth of the model's credit scale)
  alpha: float = 0.05  # false-alarm probability, however long the audit
  coverage_level: float = 0.9  # the model's central interval checked
  coverage_tolerance: float = 0.1  # coverage allowed below the level
  shares: tuple[float, float, float] = (0.5, 0.25, 0.25)  # uniform, uncertain, disagreeing
  stop_at_alarm: bool = False  # stop spending rollouts once the alarm fires
  block: int = 64  # draws labeled per program call (speed only; results do not depend on it)
  seed: int = 0
  bootstrap: int = 400  # resamples of the slice CIs
  endpoint: str = ""  # text models: the completions endpoint the audited steps resample through
  progress: bool = True

  def check(self) -> None:
    if (self.env is None) == (self.trajectories is None):
      raise HindsightError("give exactly one of --env and --trajectories")
    if self.budget < 1:
      raise HindsightError(f"budget must be >= 1 env step, got {self.budget}")
    if self.episodes < 0 or (self.env is not None and self.episodes < 1):
      raise HindsightError(f"episodes must be >= 1, got {self.episodes}")
    if self.block < 1:
      raise HindsightError(f"--block must be >= 1, got {self.block}")
    if not 0 <= self.seed < 2**31 - AUDIT_SALT:
      raise HindsightError(f"seed must be in [0, 2^31), got {self.seed}")
    if self.bootstrap < 10:
      raise HindsightError(f"bootstrap must be >= 10, got {self.bootstrap}")
    if not (np.isfinite(self.gap_tolerance) and self.gap_tolerance >= 0):
      raise HindsightError(f"gap_tolerance must be >= 0 (0: the default), got {self.gap_tolerance}")
    # The alarm's other settings, checked before any work (the tolerance may still be 0).
    from hindsight.audit.design import check_shares
    from hindsight.metrics.sequential import AlarmConfig

    alarm = AlarmConfig(self.gap_tolerance or 1.0, self.alpha, self.coverage_level,
                        self.coverage_tolerance)  # fmt: skip
    alarm.check()
    check_shares(self.shares)
