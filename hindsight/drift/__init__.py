"""The drift harness: a trained credit model against interventional truth (`hindsight eval`).

`run_drift(DriftConfig(...))` is the whole report; `held_out_split(WORKDIR)` and
`reference_credit(WORKDIR)` are its pieces for a notebook: a run's test episodes, and their
reference credit from the same cache the report uses.
"""

from hindsight.drift.harness import (
  DriftConfig,
  EpisodeSet,
  held_out_split,
  reference_credit,
  run_drift,
)

__all__ = ["DriftConfig", "EpisodeSet", "held_out_split", "reference_credit", "run_drift"]
