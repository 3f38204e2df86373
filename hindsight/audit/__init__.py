"""Auditing a served credit model: spot checks by rollouts, an anytime-valid drift alarm,
and the audited steps as labels to repair the model with (`hindsight audit`)."""

from hindsight.audit.runner import AuditConfig, run_audit
from hindsight.audit.sequential import AlarmConfig, drift_alarm, eb_confidence_sequence

__all__ = ["AlarmConfig", "AuditConfig", "drift_alarm", "eb_confidence_sequence", "run_audit"]
