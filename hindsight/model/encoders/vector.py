"""Vector observations: float features [D] per step, standardised by the training split's
statistics, then a small MLP (or one linear map):

  z_t = (o_t - mean) / std;   enc(o_t) = W_2 gelu(W_1 z_t + b_1) + b_2   (hidden width H)
                              enc(o_t) = W z_t + b                      (hidden None)
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.errors import HindsightError
from hindsight.model.encoders.base import ArrayObservations, padded_observations, register_encoder
from hindsight.model.variables import Constant


def observation_statistics(flat: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """(mean, std) of vector observations flat [N, D], per feature in float64; the std floored
  at 1e-6 (the model divides by it, and a feature can be constant)."""
  flat = np.asarray(flat, np.float64)
  return tuple(flat.mean(0).tolist()), tuple(np.maximum(flat.std(0), 1e-6).tolist())


class VectorModule(nnx.Module):
  """batch["observations"] float [B, T, D] -> [B, T, W] (module docstring)."""

  def __init__(self, encoder: VectorEncoder, width: int, hidden: int | None, *, rngs: nnx.Rngs):
    self.mean = Constant(jnp.asarray(encoder.mean, jnp.float32))
    self.std = Constant(jnp.asarray(encoder.std, jnp.float32))
    sizes = [encoder.dim, *([hidden] if hidden else []), width]
    self.layers = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in itertools.pairwise(sizes)])

  def __call__(self, batch: dict):
    z = (batch["observations"] - self.mean[...]) / self.std[...]
    *hidden, last = self.layers
    for layer in hidden:
      z = jax.nn.gelu(layer(z))
    return last(z)


@register_encoder
@dataclasses.dataclass(frozen=True)
class VectorEncoder(ArrayObservations):
  """A `StepEncoder` of float features (module docstring).

  dim: D; mean, std: per-feature statistics of the training split (std floored at 1e-6).
  """

  dim: int
  mean: tuple[float, ...]
  std: tuple[float, ...]

  kind: ClassVar[str] = "vector"
  episode_format: ClassVar[str] = "arrays"
  legacy_params: ClassVar[Mapping[str, tuple]] = {
    "obs_fc1": ("layers", 0),
    "obs_fc2": ("layers", 1),
    "obs_mean": ("mean",),
    "obs_std": ("std",),
  }

  @classmethod
  def matches(cls, example: Mapping[str, Any]) -> bool:
    obs = np.asarray(example["observations"])
    return not example.get("step_text") and np.issubdtype(obs.dtype, np.floating) and obs.ndim == 2

  @classmethod
  def of_observations(cls, flat: np.ndarray) -> VectorEncoder:
    """The record of observations flat [N, D]."""
    mean, std = observation_statistics(flat)
    return cls(int(np.shape(flat)[-1]), mean, std)

  @classmethod
  def fit(cls, examples: Sequence[Mapping[str, Any]], options: Mapping[str, Any]):
    del options
    return cls.of_observations(np.concatenate([np.asarray(e["observations"]) for e in examples]))

  def to_json(self) -> dict[str, Any]:
    return {"dim": self.dim, "mean": list(self.mean), "std": list(self.std)}

  @classmethod
  def from_json(cls, record: Mapping[str, Any]):
    return cls(int(record["dim"]), tuple(record["mean"]), tuple(record["std"]))

  def describe(self) -> str:
    return f"vector observations [{self.dim}]"

  @property
  def signature(self) -> tuple:
    return (self.kind, self.dim)

  def check_observations(self, observations: np.ndarray, n: int, where: str) -> np.ndarray:
    if observations.shape != (n, self.dim):
      raise HindsightError(
        f"{where}: 'observations' has shape {observations.shape}, the model needs {(n, self.dim)}"
      )
    if not np.issubdtype(observations.dtype, np.number):
      raise HindsightError(f"{where}: 'observations' must be numbers")
    if not np.all(np.isfinite(observations)):
      raise HindsightError(f"{where}: 'observations' must be finite (no NaN or inf)")
    return observations

  def reads_observation(self, dtype, shape: tuple[int, ...]) -> bool:
    floating = not jnp.issubdtype(dtype, jnp.integer)
    return floating and (shape[-1] if shape else 1) == self.dim

  def features(self, episodes: Sequence[Any], pad: int, shape=None) -> dict:
    del shape
    return {"observations": padded_observations(episodes, pad, (self.dim,), np.float32)}

  def module(self, width: int, *, rngs: nnx.Rngs, hidden: int | None = None) -> VectorModule:
    return VectorModule(self, width, hidden, rngs=rngs)
