"""The drift harness: a trained credit model against interventional truth (`hindsight eval`)."""

from hindsight.drift.harness import DriftConfig, run_drift

__all__ = ["DriftConfig", "run_drift"]
