"""DataSpec: what a credit model must know about the data it was trained on.

Saved as JSON in every checkpoint step (`hindsight.model.predictor.model_files`), so a
step directory alone says which episodes the model can score and how to read them.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from hindsight.model.encoders import (
  DiscreteEncoder,
  StepEncoder,
  TextEncoder,
  VectorEncoder,
  encoder_class,
)


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """What the model must know about a label dataset; saved as JSON beside checkpoints.

  encoder: how it reads each step (`model.encoders`: discrete ids, float vectors, text),
    with what it learned from the training split (its record).
  num_actions, max_length: the action ids it embeds and the longest episode it knows.
  num_classes: the class head's size (`credit.names.KLASS_NAMES`).
  value_scale: the standard deviation of the training split's finite credits; credits,
    rewards and returns are divided by it inside the model, so one config fits any scale.
  num_agents: > 0: a multi-agent dataset with agent-level labels (`team`).
  decorative_tolerance, confidence: the labels' class rule (`credit.estimators.classify`):
    the Predictor classifies its own predictive interval by the same tolerance and level.
  success_threshold, success_from_return: the environment's success is "return >
    success_threshold" (`Environment.success_from_return`). Only then may an episode given
    without `success` (JSON lines, HTTP) have it derived from its rewards; otherwise a
    missing `success` is an error naming the field (key_to_door's success is the door, not a
    return level).
  """

  encoder: StepEncoder
  num_actions: int
  max_length: int
  num_classes: int
  value_scale: float
  num_agents: int = 0
  decorative_tolerance: float = 0.05
  confidence: float = 0.95
  success_threshold: float = 0.0
  success_from_return: bool = True
  label_options: str = ""

  def to_json(self) -> str:
    d: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["encoder"] = {"kind": self.encoder.kind, **self.encoder.to_json()}
    return json.dumps(d, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> DataSpec:
    """A spec `to_json` wrote, or one of a checkpoint saved before step encoders were
    modules (`obs_kind`, `obs_dim`, ... at the top level)."""
    d = json.loads(text)
    if "obs_kind" in d:
      return cls._from_flat(d)
    record = dict(d.pop("encoder"))
    d["encoder"] = encoder_class(record.pop("kind")).from_json(record)
    return cls(**d)

  @classmethod
  def _from_flat(cls, d: dict) -> DataSpec:
    """The flat layout of checkpoint format 2: one record for every kind."""
    kind, dim = d.pop("obs_kind"), int(d.pop("obs_dim"))
    mean, std = tuple(d.pop("obs_mean")), tuple(d.pop("obs_std"))
    text = {k: d.pop(k, None) for k in ("tokenizer", "step_tokens", "max_step_tokens")}
    if kind == "discrete":
      encoder: StepEncoder = DiscreteEncoder(dim)
    elif kind == "vector":
      encoder = VectorEncoder(dim, mean, std)
    else:
      encoder = TextEncoder.from_json(text)
    return cls(encoder=encoder, **d)


def value_scale(credits: np.ndarray) -> float:
  """The spread credits are divided by inside the model: the std of the finite credits, or
  1 when fewer than two are finite or they do not vary."""
  c = np.asarray(credits, np.float64).reshape(-1)
  c = c[np.isfinite(c)]
  return float(c.std()) if c.size > 1 and c.std() > 0 else 1.0
