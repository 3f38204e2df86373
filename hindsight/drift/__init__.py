"""The drift harness: a trained credit model against interventional truth (`hindsight eval`).

`run_drift(DriftConfig(...))` is the whole report; `held_out_split(WORKDIR)` and
`reference_credit(WORKDIR)` are its pieces for a notebook: a run's test episodes, and their
reference credit from the same cache the report uses.
"""

from hindsight._lazy import lazy_exports

_HOMES = {
  "DriftConfig": "hindsight.drift.config",
  "EpisodeSet": "hindsight.drift.harness",
  "held_out_split": "hindsight.drift.harness",
  "reference_credit": "hindsight.drift.harness",
  "run_drift": "hindsight.drift.harness",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
