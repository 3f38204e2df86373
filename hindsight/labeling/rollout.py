"""Rollouts: one `lax.scan` per trajectory, vmapped outside (gymnax / purejaxrl style).

Keys. Every random number is a function of an explicit key and the *absolute* time index of
the step it serves (`fold_in(key, state.time)`). Two arms of a branch that start from the same
s_t with the same continuation key therefore consume the same random numbers at the same
time steps: common random numbers, so their paired difference has low variance.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from hindsight.envs.base import Environment
from hindsight.policies.base import Policy, sample_categorical, sample_categorical_from_uniform

PyTree = Any


@struct.dataclass
class Trajectory:
  """One episode padded to the horizon H (batch dims are added by vmap).

  states:  pytree, leaves [H + 1, ...]: s_t, the full state *before* action t, and last
           the state after step H - 1. After the episode ends its final state is
           repeated (its `done` flag set), so states[H] is always the final state.
  actions: int32 [H], a_t (0 on padding).
  rewards: float32 [H], r_t (0 on padding).
  mask:    bool [H], t < T (the step happened).
  """

  states: PyTree
  actions: jax.Array
  rewards: jax.Array
  mask: jax.Array


def _where_tree(pred, new, old):
  return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def sample_episode(
  env: Environment, policy: Policy, env_params, policy_params, key: jax.Array
) -> Trajectory:
  """Rolls pi from s_0 ~ reset for H steps. key: the episode's trajectory key."""
  reset_key, steps_key = jax.random.split(key)
  state0 = env.reset(reset_key, env_params)

  def body(state, _):
    k_pol, k_env = jax.random.split(jax.random.fold_in(steps_key, state.time))
    action = sample_categorical(k_pol, policy.probs(policy_params, state, env_params))
    next_state, reward, _ = env.step(k_env, state, action, env_params)
    alive = ~state.done
    out = (state, jnp.where(alive, action, 0), jnp.where(alive, reward, 0.0), alive)
    return _where_tree(alive, next_state, state), out

  final, (states, actions, rewards, mask) = jax.lax.scan(body, state0, length=env.horizon)
  states = jax.tree.map(lambda xs, x: jnp.concatenate([xs, x[None]]), states, final)
  return Trajectory(states=states, actions=actions, rewards=rewards.astype(jnp.float32), mask=mask)


def continuation_return(
  env: Environment,
  policy: Policy,
  env_params,
  policy_params,
  state,
  first_action: jax.Array,
  key: jax.Array,
  gamma: float = 1.0,
  max_steps: int | None = None,
  banned_class: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, PyTree]:
  """G_t of do(a_t = first_action) at `state`, then pi to the end of the episode.

  Args:
    state: s_t (time t). A state that is already done yields G = 0.
    first_action: int32 [], the action forced at s_t.
    key: the continuation key. Step j of the branch (time t + j) uses random numbers that
      depend on (key, j) only, so arms that start from the same s_t with the same key use
      common random numbers.
    gamma: discount (static).
    max_steps: static bound on the steps left (default: the horizon); the caller knows it
      from the start step, and it sizes the bulk draw of random numbers.
    banned_class: int32 [] or None. If given (>= 0), the continuation after the first step
      never takes an action whose `env.action_class` equals it (pi renormalised over the
      rest; if nothing is left, pi itself). -1 bans nothing.

  Returns:
    G: float32 [], sum_{u>=t} gamma^(u-t) r_u.
    steps: int32 [], env steps simulated before the episode ended.
    final_state: the state the branch ended in (for `env.success`).

  A `while_loop` rather than a fixed-length scan: under vmap it runs until the last branch
  of the batch has ended, so a batch of late or short branches stops early.
  """
  n = env.horizon if max_steps is None else max_steps
  n_env = env.num_step_uniforms
  if n_env:
    # One bulk draw for the whole branch: several times cheaper than a key per step.
    u = jax.random.uniform(key, (n, 1 + n_env))
    u_pol = u[:, 0]
    env_step = lambda j, s, a: env.step_from_uniforms(u[j, 1:], s, a, env_params)  # noqa: E731
  else:
    k_pol, k_env = jax.random.split(key)
    u_pol = jax.random.uniform(k_pol, (n,))
    env_step = lambda j, s, a: env.step(jax.random.fold_in(k_env, j), s, a, env_params)  # noqa: E731

  def cond(carry):
    state, _, _, steps = carry
    return ~state.done & (steps < n)

  def body(carry):
    state, ret, discount, steps = carry
    probs = policy.probs(policy_params, state, env_params)
    if banned_class is not None:
      probs = _without_class(env, env_params, state, probs, banned_class)
    sampled = sample_categorical_from_uniform(u_pol[steps], probs)
    action = jnp.where(steps == 0, first_action, sampled)
    next_state, reward, _ = env_step(steps, state, action)
    return next_state, ret + discount * reward, discount * gamma, steps + 1

  init = (state, jnp.float32(0.0), jnp.float32(1.0), jnp.int32(0))
  final, ret, _, steps = jax.lax.while_loop(cond, body, init)
  return ret, steps, final


def _without_class(env, env_params, state, probs, banned_class):
  """pi renormalised over actions whose content class is not `banned_class`."""
  actions = jnp.arange(env.num_actions)
  classes = jax.vmap(env.action_class, (None, 0, None))(state, actions, env_params)
  kept = probs * (classes != banned_class)
  total = kept.sum()
  return jnp.where(total > 0, kept / jnp.where(total > 0, total, 1.0), probs)
