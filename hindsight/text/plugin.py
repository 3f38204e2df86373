"""The text package as a plug-in (`hindsight.plugins`): importing this module registers, with
the core's registries, everything that makes text traces work end to end:

  - the environment family `text` (`--env text:FILE.jsonl`: traces labeled by resampling,
    not a functional environment) and its label source (`text.source.TextSource`) with the
    family's own job options (`text.options.TextOptions`, the flags of `hindsight label`);
  - the trace format (`text.episodes.parse_text_episode`: steps, text or step_text with an
    outcome) as the episode format of text models;
  - the audit and the eval of text runs (`text.audit`, `text.evaluate`): steps resampled
    through a completions endpoint, and the text world's exact reference.

JAX-free: only the registrations happen here; each piece is imported when it is first used.
"""

from __future__ import annotations

from hindsight.audit.backend import AuditBackend, register_audit_backend
from hindsight.data.formats import register_format
from hindsight.drift.backend import DriftBackend, register_drift_backend
from hindsight.envs.families import EnvFamily, register
from hindsight.labeling.source import SourceEntry, register_label_source
from hindsight.text.options import TextOptions

FAMILY = "text"


def _text_source(job, out_dir: str):
  from hindsight.text.source import TextSource

  return TextSource(job, out_dir)


def _parse_trace(episode, spec, where: str):
  from hindsight.text.episodes import parse_text_episode

  return parse_text_episode(episode, spec, where)


def _open_eval(cfg, run, predictor, out: str):
  from hindsight.text.evaluate import open_text

  return open_text(cfg, run, predictor, out)


def _prepare_audit(cfg, predictor, metadata, out: str):
  from hindsight.text.audit import prepare_text_audit

  return prepare_text_audit(cfg, predictor, metadata, out)


register(EnvFamily(FAMILY, "text:FILE.jsonl"))
register_label_source(FAMILY, SourceEntry(_text_source, options=TextOptions))
register_format(FAMILY, _parse_trace)
register_drift_backend(FAMILY, DriftBackend(_open_eval))
# Resampled steps have no environment trajectories to write as a label dataset.
register_audit_backend(FAMILY, AuditBackend(_prepare_audit, writes_labels=False))
