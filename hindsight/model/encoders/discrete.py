"""Discrete observations: one int id per step (a tabular state), embedded.

  enc(o_t) = E[o_t]        E: [num_ids, W]

Ids outside [0, num_ids) are clamped to the nearest one the model knows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.errors import HindsightError
from hindsight.model.encoders.base import ArrayObservations, padded_observations, register_encoder


class DiscreteModule(nnx.Module):
  """batch["observations"] int [B, T] -> [B, T, W]."""

  def __init__(self, num_ids: int, width: int, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(num_ids, width, rngs=rngs)

  def __call__(self, batch: dict):
    return self.embed(batch["observations"])


@register_encoder
@dataclasses.dataclass(frozen=True)
class DiscreteEncoder(ArrayObservations):
  """A `StepEncoder` of int ids (module docstring). num_ids: how many ids it embeds."""

  num_ids: int

  kind: ClassVar[str] = "discrete"
  episode_format: ClassVar[str] = "arrays"
  legacy_params: ClassVar[Mapping[str, tuple]] = {"obs_embed": ("embed",)}

  @classmethod
  def matches(cls, example: Mapping[str, Any]) -> bool:
    obs = np.asarray(example["observations"])
    return not example.get("step_text") and np.issubdtype(obs.dtype, np.integer) and obs.ndim == 1

  @classmethod
  def fit(cls, examples: Sequence[Mapping[str, Any]], options: Mapping[str, Any]):
    del options
    return cls(int(max(int(np.max(e["observations"], initial=0)) for e in examples)) + 1)

  def to_json(self) -> dict[str, Any]:
    return {"num_ids": self.num_ids}

  @classmethod
  def from_json(cls, record: Mapping[str, Any]):
    return cls(int(record["num_ids"]))

  def describe(self) -> str:
    return f"discrete observations [{self.num_ids} ids]"

  @property
  def signature(self) -> tuple:
    return (self.kind, self.num_ids)

  def check_observations(self, observations: np.ndarray, n: int, where: str) -> np.ndarray:
    if observations.shape != (n,):
      raise HindsightError(
        f"{where}: 'observations' has shape {observations.shape}, the model needs {(n,)}"
      )
    if not np.issubdtype(observations.dtype, np.integer):
      raise HindsightError(f"{where}: 'observations' must be int ids for this model")
    return observations

  def reads_observation(self, dtype, shape: tuple[int, ...]) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.integer)) and len(shape) == 0

  def features(self, episodes: Sequence[Any], pad: int, shape=None) -> dict:
    del shape
    clamp = lambda obs: np.clip(obs, 0, self.num_ids - 1)  # noqa: E731
    return {"observations": padded_observations(episodes, pad, (), np.int32, clamp)}

  def module(self, width: int, *, rngs: nnx.Rngs, hidden: int | None = None) -> DiscreteModule:
    del hidden  # an embedding has no hidden layer
    return DiscreteModule(self.num_ids, width, rngs=rngs)
