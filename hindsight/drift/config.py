"""What `hindsight eval` evaluates and how hard (light on imports: the CLI's flags come from
these fields)."""

from __future__ import annotations

import dataclasses

from hindsight.errors import HindsightError

REFERENCES = ("auto", "exact", "resample")


@dataclasses.dataclass(frozen=True)
class DriftConfig:
  """What `hindsight eval` evaluates and how hard (CLI flags map onto these)."""

  checkpoint: str  # a training run's workdir (or its checkpoint directory); A,B,C an ensemble
  step: str = "run"  # checkpoint step: run (the training run's choice), best, last or N
  env: str | None = None  # evaluate fresh episodes of this spec instead of the test split
  episodes: int = 0  # evaluated episodes (0: the whole test split, or 256 with --env)
  reference_rollouts: int = 0  # K_ref (0: chosen so the reference's stderr is small)
  reference_fraction: float = 0.1  # ... its RMS stderr / the credit spread
  check_episodes: int = 64  # episodes of the second, independent reference pass
  shifts: tuple[str, ...] | None = None  # OOD env specs (None: the env family's shifts)
  # Episodes per shifted set (0: scaled to the evaluated set, `shift_episodes_for`).
  shift_episodes: int = 0
  # Optimizer steps of each learned baseline (-1: scaled to the training split,
  # `baselines.scaled_steps`; 0: no learned baselines).
  baseline_steps: int = -1
  # Tabular env spec of the policy-gradient table: "auto" = the run's own environment when
  # it is a tabular MDP, else none; "" = none.
  gradient_env: str = "auto"
  gradient_episodes: int = 1024
  gradient_rollouts: int = 16
  bootstrap: int = 400  # bootstrap resamples per CI
  seed: int = 0
  out: str = ""  # default: CHECKPOINT/drift
  # Cached episodes and references ("" = OUT/cache); one directory shared by several models
  # evaluated on the same episodes computes the reference once (keys name what it depends on).
  cache: str = ""
  # The reference credit: "exact" (dynamic programming: a tabular MDP, the text world),
  # "resample" (relabeled at K_ref with keys of its own), "auto" (exact where it exists).
  reference: str = "auto"
  # Runs whose labels were resampled through a completions endpoint (text): where the
  # reference resamples.
  endpoint: str = ""
  # Another training run scored on the same episodes against the same reference: a row of
  # its own ("other model (point)"), e.g. the step encoder beside the LM backbone on one
  # label set.
  versus: str = ""
  progress: bool = True

  def check(self) -> None:
    if self.reference not in REFERENCES:
      raise HindsightError(f"reference {self.reference!r}: expected one of {', '.join(REFERENCES)}")
    for name in ("episodes", "reference_rollouts", "shift_episodes"):
      if getattr(self, name) < 0:
        raise HindsightError(f"{name} must be >= 0")
    if self.baseline_steps < -1:
      raise HindsightError(
        f"baseline_steps must be >= 0 (or -1: scaled), got {self.baseline_steps}"
      )
    if self.reference_rollouts == 1:
      raise HindsightError("reference_rollouts must be >= 2 (or 0: chosen automatically)")
    if self.bootstrap < 10:
      raise HindsightError(f"bootstrap must be >= 10, got {self.bootstrap}")
    if not 0 < self.reference_fraction < 1:
      raise HindsightError("reference_fraction must be in (0, 1)")
    if self.check_episodes < 2:
      raise HindsightError("check_episodes must be >= 2")


# Shifted sets: as many episodes as the evaluated set, within these bounds.
MIN_SHIFT_EPISODES, MAX_SHIFT_EPISODES = 32, 128


def shift_episodes_for(cfg: DriftConfig, evaluated: int) -> int:
  """Episodes of each shifted set: cfg.shift_episodes, or (0) the evaluated set's count
  clipped to [MIN_SHIFT_EPISODES, MAX_SHIFT_EPISODES]."""
  if cfg.shift_episodes:
    return cfg.shift_episodes
  return int(min(max(evaluated, MIN_SHIFT_EPISODES), MAX_SHIFT_EPISODES))


def gradient_env_for(cfg: DriftConfig, evaluated_env: str, tabular: bool) -> str:
  """The policy-gradient table's environment: cfg.gradient_env, or for "auto" the evaluated
  environment where it is a tabular MDP (the table needs its DP), else none ("")."""
  if cfg.gradient_env == "auto":
    return evaluated_env if tabular else ""
  return cfg.gradient_env
