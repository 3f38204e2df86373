"""Sources that need no labels: the outcome itself, and GAE over a learned critic.

outcome   A_t = R - mean_batch(R)          (REINFORCE with a baseline), R = sum_t r_t; where
          episodes come in groups sharing a prompt (GRPO's, on a language model), the group's
          z-score (R - mean_g R) / (std_g R + 1e-6), std with ddof 1 (Tunix's
          `compute_advantages`, the same operations: NumPy in, NumPy float64 out)
gae       rlax GAE(lambda) over a critic V(x) trained beside the policy: the critic is the
          source's own trainable state (`init`), regressed on the GAE targets by its own
          loss term, value_coef x mean_t (V(x_t) - (A_t + V(x_t)))^2
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import rlax
from flax import nnx
from ml_collections import ConfigDict

from hindsight.policies.neural import critic as make_critic
from hindsight.rl.sources.base import (
  ConfigNode,
  CreditSource,
  Terms,
  register_config_node,
  register_source,
)
from hindsight.rl.sources.steps import Steps, StepSignal


def outcome_advantages(R, groups: int):
  """[E]: R - mean(R) (groups 0), or each consecutive group of `groups`' z-score. Written
  with the array's own methods, so a NumPy R is computed in NumPy (as Tunix does) and a jax
  one traces."""
  if not groups:
    return R - R.mean()
  grouped = R.reshape(-1, groups)
  mean = grouped.mean(axis=-1).repeat(groups)
  std = grouped.std(axis=-1, ddof=1).repeat(groups)
  return (R - mean) / (std + 1e-6)


@register_source
class Outcome(CreditSource):
  name = "outcome"
  summary = "R - mean R at every step (REINFORCE with a baseline; GRPO's z-score in groups)"
  trainers = ("symbolic", "text")
  unbiased = True
  standardised = True  # in groups: a z-score already

  def step_signal(self, steps: Steps, key) -> StepSignal:
    del key
    advantages = outcome_advantages(steps.outcome, steps.groups)
    return StepSignal(jnp.where(steps.mask, advantages[:, None], 0.0), steps.zero)


def _gae_config() -> ConfigDict:
  c = ConfigDict()
  c.lambda_ = 0.95  # GAE lambda
  c.value_coef = 0.5  # weight of the critic's regression in the loss
  return c


register_config_node(ConfigNode("gae", _gae_config))


@register_source
class Gae(CreditSource):
  name = "gae"
  summary = "GAE(lambda) with a learned critic V(x) (PPO's default)"

  def __init__(self, task, config):
    super().__init__(task, config)
    self.critic_graphdef, self._critic0 = make_critic(task.policy.feature_dim, config.policy.hidden)

  def init(self, policy_params):
    del policy_params
    return jax.tree.map(jnp.asarray, self._critic0), None

  def _values(self, critic, states) -> jax.Array:
    """V(x(s)) [E, T] of states with leaves [E, T, ...]."""
    return nnx.merge(self.critic_graphdef, critic)(self.task.step_features(states))[..., 0]

  def terms(self, aux, state, policy_params, traj, key) -> Terms:
    """(advantages, value targets) [E, H] by rlax GAE over V(s_0..s_H), V = 0 once done."""
    del aux, policy_params, key
    values = jnp.where(traj.states.done, 0.0, self._values(state[0], traj.states))
    discounts = self.config.ppo.gamma * (1.0 - traj.states.done[:, 1:].astype(jnp.float32))
    gae = jax.vmap(
      functools.partial(
        rlax.truncated_generalized_advantage_estimation, lambda_=self.config.gae.lambda_
      )
    )(traj.rewards, discounts, values=values)
    targets = jnp.where(traj.mask, gae + values[:, :-1], 0.0)
    return Terms(jnp.where(traj.mask, gae, 0.0), self.no_steps(), {"targets": targets})

  def loss(self, state, logits, batch, scale):
    del logits, scale
    mask = batch["mask"]
    valid = jnp.maximum(mask.sum(), 1)
    v = self._values(state[0], batch["states"])
    return self.config.gae.value_coef * jnp.sum(jnp.square(v - batch["targets"]) * mask) / valid
