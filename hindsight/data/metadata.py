"""The metadata of a label dataset, typed: one record that the labeling job, the audit and the
thought-anchors importer write and every reader reads (`Labels.metadata`).

It is stored as TFDS's metadata dict (JSON types). `to_dict` writes every field but the
optional ones left unset (None), which only some writers have (an audit's `partial`, a text
job's `completions`); `from_dict` reads any dataset's dict, an older one's too: a missing key
takes its default, and a key this version does not know is kept in `extra` and written back.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from hindsight.credit.names import KLASS_NAMES


@dataclasses.dataclass(frozen=True)
class LabelMetadata:
  """A label dataset's metadata.

  job: the job's description as JSON (`LabelJob.describe`: what a rerun into the same --out
    must match; an audit's and an import's own description likewise).
  env: the --env spec the episodes come from; env_name, policy: the environment's and the
    behaviour policy's names.
  replacement, rollouts (K), exact, seed, gamma, decorative_tolerance, confidence, stratify:
    how it was labeled (`LabelConfig`'s fields and the job's seed).
  horizon: the longest episode the labels can hold; num_actions; null_action (-1: none).
  success_threshold, success_from_return: what success is (`Environment.success`).
  tag_names, agent_names, klass_names: names of the tag ids, the agents, the classes.
  shapley_permutations: sampled agent orders of the Shapley values (0: every coalition).
  Optional (written only when set):
  partial: only the steps with `labeled` carry labels (an audit's dataset);
  audited_steps: how many steps an audit labeled;
  completions: the completions a text job or import spent;
  text: a text job's options as JSON.
  tool_calls: the tool calls an agent-trace job's environment executed (`--tools`).
  context_ends, turn_ends: its continuations that ended because their text filled the
  model's context, or at --max-turns; tool_checked: those --tool-check ran again.
  extra: keys of other writers, kept as they are.
  """

  job: str = ""
  env: str = ""
  env_name: str = ""
  policy: str = ""
  replacement: str = "policy"
  rollouts: int = 0
  exact: bool = False
  seed: int = 0
  gamma: float = 1.0
  horizon: int = 0
  num_actions: int = 0
  null_action: int = -1
  success_threshold: float = 0.0
  success_from_return: bool = True
  decorative_tolerance: float = 0.05
  confidence: float = 0.95
  stratify: bool = True
  tag_names: tuple[str, ...] = ()
  agent_names: tuple[str, ...] = ()
  shapley_permutations: int = 0
  klass_names: tuple[str, ...] = KLASS_NAMES
  partial: bool | None = None
  audited_steps: int | None = None
  completions: int | None = None
  text: str | None = None
  tool_calls: int | None = None
  context_ends: int | None = None
  turn_ends: int | None = None
  tool_checked: int | None = None
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def job_description(self) -> dict:
    """The job's description as a dict ({} when the dataset records none)."""
    return json.loads(self.job) if self.job else {}

  @property
  def text_options(self) -> dict:
    """A text job's options as a dict ({} otherwise)."""
    return json.loads(self.text) if self.text else {}

  def to_dict(self) -> dict[str, Any]:
    """The stored dict: JSON types, unset optional fields left out, `extra` merged in."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name == "extra" or (value is None and f.default is None):
        continue
      out[f.name] = list(value) if isinstance(value, tuple) else value
    out.update(self.extra)
    return out

  @classmethod
  def from_dict(cls, stored: Mapping[str, Any]) -> LabelMetadata:
    """Any dataset's stored metadata (module docstring); values cast to the fields' types."""
    known = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
    values: dict[str, Any] = {}
    for name, value in stored.items():
      field = known.get(name)
      if field is None or value is None:
        continue
      default = field.default
      if isinstance(default, tuple):
        values[name] = tuple(str(x) for x in value)
      elif name in ("partial",):
        values[name] = bool(value)
      elif name in ("audited_steps", "completions", "tool_calls", "context_ends", "turn_ends",
                    "tool_checked"):  # fmt: skip
        values[name] = int(value)
      elif isinstance(default, bool):
        values[name] = bool(value)
      elif isinstance(default, int):
        values[name] = int(value)
      elif isinstance(default, float):
        values[name] = float(value)
      else:
        values[name] = str(value)
    extra = {k: v for k, v in stored.items() if k not in known and k != "extra"}
    return cls(**values, extra=extra)

  def replace(self, **changes) -> LabelMetadata:
    return dataclasses.replace(self, **changes)
