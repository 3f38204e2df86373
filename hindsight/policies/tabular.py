"""The tabular policy pi[S, A] stored in a tabular MDP file."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.policies.base import Policy


class TabularPolicy(Policy):
  """pi(a | s) = pi[s, a], read from the state's index."""

  name = "tabular"

  def __init__(self, pi: np.ndarray):
    self.pi = np.asarray(pi)

  def default_params(self) -> jax.Array:
    return jnp.asarray(self.pi, jnp.float32)

  def probs(self, params, state, env_params) -> jax.Array:
    del env_params
    return params[state.s]
