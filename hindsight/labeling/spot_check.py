"""The credit of one chosen step of a trajectory, alone: the audit's spot check.

The keep and replace arms of docs/design.md section 1 (no phi arm), K branches; branch k
takes its keys from split(fold_in(key, k)): the replacement action's key and the
continuation key both arms share (common random numbers). The estimator is the labeling
engine's (stratified replacement, paired differences, tie bounds); only the key scheme is
its own, because the audit draws one step at a time with keys of its own stream.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from hindsight.credit.estimators import classify
from hindsight.credit.fields import paired_credit
from hindsight.credit.replacement import replacement_probs, without_taken
from hindsight.envs.base import Environment
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.rollout import Trajectory, continuation_return
from hindsight.policies.base import Policy, sample_categorical

PyTree = Any


def return_bounds(env: Environment, env_params: PyTree, state) -> jax.Array:
  """(lo, hi) of G_t from one state, float32 [2]; (0, 0) once the episode is over."""
  bounds = jnp.asarray(env.return_bounds(state, env_params), jnp.float32)
  return jnp.where(state.done, 0.0, bounds)


def label_one_step(
  env: Environment,
  policy: Policy,
  config: LabelConfig,
  env_params: PyTree,
  policy_params: PyTree,
  traj: Trajectory,
  t: jax.Array,
  key: jax.Array,
  *,
  upper_rates: jax.Array,
  z: float,
) -> dict[str, jax.Array]:
  """The credit of step t of one trajectory (leaves unbatched).

  Returns float32 [] credit, credit_stderr, bool [] credit_bounded and undefined, int32 []
  klass and rollout_steps (env steps simulated). A step past the episode's end (mask[t]
  false) gets NaN credit and costs nothing.
  """
  K = config.num_rollouts
  state = jax.tree.map(lambda x: x[t], traj.states)
  # t = H (one past the last step) is a valid index of states but not of the steps.
  a, valid = traj.actions[t], (t < env.horizon) & traj.mask[jnp.minimum(t, env.horizon - 1)]
  pi = policy.probs(policy_params, state, env_params)
  legal = env.legal_actions(state, env_params)
  q, undefined = replacement_probs(config.replacement, pi, legal, a, env.null_action)
  if config.stratify:
    keep_share = q[a]
    rest, mass = without_taken(q, a)
    q_draw = jnp.where(mass > 0, rest, q)
  else:
    keep_share, q_draw = jnp.float32(0.0), q

  def branch(k):
    k_rep, k_cont = jax.random.split(jax.random.fold_in(key, k))
    return jnp.stack([a, sample_categorical(k_rep, q_draw)]), k_cont

  firsts, conts = jax.vmap(branch)(jnp.arange(K))  # [K, 2], [K]
  banned = None
  if config.replacement == "policy_no_repeat":
    # Only the replace arm's continuation avoids a_t's content class.
    banned = jnp.stack([jnp.int32(-1), env.action_class(state, a, env_params).astype(jnp.int32)])
    banned = jnp.broadcast_to(banned, (K, 2)).reshape(-1)
  run = functools.partial(
    continuation_return, env, policy, env_params, policy_params, gamma=config.gamma
  )
  states = jax.tree.map(lambda x: jnp.broadcast_to(x, (2 * K, *x.shape)), state)
  keys = jnp.repeat(conts, 2)  # both arms of branch k share its continuation key
  G, steps, _ = jax.vmap(run)(states, firsts.reshape(-1), keys, banned_class=banned)
  G = G.reshape(K, 2)
  lo, hi = return_bounds(env, env_params, state)
  credit, se, bounded = paired_credit(
    G[:, 0] - G[:, 1], keep_share, lo, hi, upper_rates=upper_rates, z=z
  )
  undefined = undefined | ~valid
  credit = jnp.where(undefined, jnp.nan, credit)
  return {
    "credit": credit.astype(jnp.float32),
    "credit_stderr": jnp.where(valid, se, jnp.nan).astype(jnp.float32),
    "credit_bounded": bounded & valid,
    "undefined": undefined & valid,
    "klass": classify(credit, se, config.decorative_tolerance, z),
    "rollout_steps": jnp.where(valid, steps.sum(), 0).astype(jnp.int32),
  }
