"""Behaviour policies: pure functions from (params, state) to a distribution over actions.

A policy sees the environment's *full* state so that scripted policies can read latent
variables (a latent competence, say); a policy that should only see observations calls
`env.observation(state, env_params)` itself. Sampling is inverse-CDF with one uniform per
draw, from an explicit key.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


class Policy(abc.ABC):
  """pi(a | s) for a discrete-action environment."""

  name: str = "policy"

  @abc.abstractmethod
  def default_params(self) -> PyTree:
    """The policy's parameters as a pytree of arrays."""

  @abc.abstractmethod
  def probs(self, params: PyTree, state: PyTree, env_params: PyTree) -> jax.Array:
    """float32 [A]: pi(. | state), zero on illegal actions, summing to 1."""


def sample_categorical(key: jax.Array, probs: jax.Array) -> jax.Array:
  """a ~ probs by inverse CDF: int32 [] from one uniform drawn with `key`."""
  return sample_categorical_from_uniform(jax.random.uniform(key), probs)


def sample_categorical_from_uniform(u: jax.Array, probs: jax.Array) -> jax.Array:
  """Inverse CDF: the action a with cdf[a-1] <= u * total < cdf[a], int32 [].

  Using the same u for two different distributions couples the draws monotonically, the
  strongest common-random-numbers coupling for a one-dimensional choice.
  """
  cdf = jnp.cumsum(probs)
  # Never return an action of zero probability because cdf[-1] fell just below u.
  last = probs.shape[-1] - 1 - jnp.argmax(probs[::-1] > 0)
  return jnp.minimum(jnp.sum(u * cdf[-1] > cdf), last).astype(jnp.int32)
