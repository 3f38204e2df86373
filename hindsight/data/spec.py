"""DataSpec: what a credit model must know about the data it was trained on.

Saved as JSON in every checkpoint step (`hindsight.model.predictor.model_files`), so a
step directory alone says which episodes the model can score and how to read them.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """What the model must know about a label dataset; saved as JSON beside checkpoints.

  obs_kind: "discrete" (one int id per step, embedded), "vector" (float [D], an MLP) or
    "text" (each step's text, tokenized and read by a step encoder).
  obs_dim: the number of ids (discrete) or D (vector; text: the dataset's position feature).
  obs_mean, obs_std: per-feature statistics of the training split (vector observations).
  value_scale: the standard deviation of the training split's finite credits; credits,
    rewards and returns are divided by it inside the model, so one config fits any scale.
  success_from_return: the environment's success is "return > success_threshold"
    (`Environment.success_from_return`). Only then may an episode given without `success`
    (JSON lines, HTTP) have it derived from its rewards; otherwise a missing `success` is
    an error naming the field (key_to_door's success is the door, not a return level).
  tokenizer: text models: the tokenizer's record (`hindsight.text.tokenizer.Tokenizer.to_json`),
    so a checkpoint alone restores the ids it was trained on; "" otherwise.
  step_tokens: text models: the tokens per step training batches are padded to (the bucket
    of the longest training step).
  max_step_tokens: text models: the longest step the model reads, in tokens; a longer step
    is refused with a one-line error.
  """

  obs_kind: str
  obs_dim: int
  num_actions: int
  max_length: int
  num_classes: int
  obs_mean: tuple[float, ...]
  obs_std: tuple[float, ...]
  value_scale: float
  num_agents: int = 0  # > 0: a multi-agent dataset with agent-level labels (`team`)
  # The labels' class rule (`credit.estimators.classify`): the Predictor classifies its own
  # predictive interval by the same tolerance and confidence.
  decorative_tolerance: float = 0.05
  confidence: float = 0.95
  success_threshold: float = 0.0
  success_from_return: bool = True
  tokenizer: str = ""
  step_tokens: int = 0
  max_step_tokens: int = 0

  @property
  def text(self) -> bool:
    return self.obs_kind == "text"

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> DataSpec:
    d = json.loads(text)
    d["obs_mean"], d["obs_std"] = tuple(d["obs_mean"]), tuple(d["obs_std"])
    return cls(**d)


def observation_statistics(flat: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """(obs_mean, obs_std) of vector observations flat [N, D], per feature in float64; the
  std floored at 1e-6 (the model divides by it, and a feature can be constant)."""
  flat = np.asarray(flat, np.float64)
  return tuple(flat.mean(0).tolist()), tuple(np.maximum(flat.std(0), 1e-6).tolist())


def value_scale(credits: np.ndarray) -> float:
  """The spread credits are divided by inside the model: the std of the finite credits, or
  1 when fewer than two are finite or they do not vary."""
  c = np.asarray(credits, np.float64).reshape(-1)
  c = c[np.isfinite(c)]
  return float(c.std()) if c.size > 1 and c.std() > 0 else 1.0


def token_bucket(n: int) -> int:
  """Tokens a step of n tokens is padded to: the next power of two, at least 16 (few shapes,
  so few compiles)."""
  return max(16, 1 << max(int(n) - 1, 0).bit_length())
