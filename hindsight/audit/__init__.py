"""Auditing a served credit model: spot checks by rollouts, an anytime-valid drift alarm,
and the audited steps as labels to repair the model with (`hindsight audit`)."""

from hindsight._lazy import lazy_exports

_HOMES = {
  "AlarmConfig": "hindsight.metrics.sequential",
  "AuditConfig": "hindsight.audit.config",
  "drift_alarm": "hindsight.metrics.sequential",
  "eb_confidence_sequence": "hindsight.metrics.sequential",
  "run_audit": "hindsight.audit.runner",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
