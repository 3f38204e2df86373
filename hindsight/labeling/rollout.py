"""Rollouts: trajectories by `lax.scan`, branch continuations by a work queue of lanes.

Keys. Every random number is a function of an explicit key and the *absolute* time index of
the step it serves. Two arms of a branch that start from the same s_t with the same
continuation key therefore consume the same random numbers at the same time steps: common
random numbers, so their paired difference has low variance. Within a continuation, step j
draws its numbers as one Threefry-2x32 hash of the counter (j, c) under the continuation's
key (`step_randomness`): one hash gives the policy's uniform and the environment's, so no key is
derived per step.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hindsight import pytree
from hindsight.envs.base import Environment
from hindsight.policies.base import Policy, sample_categorical, sample_categorical_from_uniform

PyTree = Any

# roll_branches refills its lanes once 1 / _REFILL_FRACTION of them have ended.
_REFILL_FRACTION = 8


@pytree.dataclass
class Trajectory:
  """One episode padded to the horizon H (batch dims are added by vmap).

  states:  pytree, leaves [H + 1, ...]: s_t, the full state *before* action t, and last
           the state after step H - 1. After the episode ends its final state is
           repeated (its `done` flag set), so states[H] is always the final state.
  actions: int32 [H], a_t (0 on padding).
  rewards: float32 [H], r_t (0 on padding).
  mask:    bool [H], t < T (the step happened).
  success: bool [], `env.success(states[H], R)` with R = sum_t r_t: whether the episode
           succeeded, decided once, by the environment, where it was sampled (every
           episode built from the trajectory carries it).
  """

  states: PyTree
  actions: jax.Array
  rewards: jax.Array
  mask: jax.Array
  success: jax.Array


def _where_tree(pred, new, old):
  """Leaf by leaf, new where pred else old; pred's axes are the leaves' leading axes."""

  def pick(n, o):
    return jnp.where(pred.reshape(pred.shape + (1,) * (n.ndim - pred.ndim)), n, o)

  return jax.tree.map(pick, new, old)


def sample_episode(
  env: Environment, policy: Policy, env_params, policy_params, key: jax.Array
) -> Trajectory:
  """Rolls pi from s_0 ~ reset for H steps. key: the episode's trajectory key."""
  reset_key, steps_key = jax.random.split(key)
  state0 = env.reset(reset_key, env_params)

  def body(state, _):
    action, next_state, reward = _episode_step(env, policy, env_params, policy_params,
                                               steps_key, state)  # fmt: skip
    alive = ~state.done
    out = (state, jnp.where(alive, action, 0), jnp.where(alive, reward, 0.0), alive)
    return _where_tree(alive, next_state, state), out

  final, (states, actions, rewards, mask) = jax.lax.scan(body, state0, length=env.horizon)
  states = jax.tree.map(lambda xs, x: jnp.concatenate([xs, x[None]]), states, final)
  rewards = rewards.astype(jnp.float32)
  success = jnp.asarray(env.success(final, rewards.sum()), bool)
  return Trajectory(states=states, actions=actions, rewards=rewards, mask=mask, success=success)


def _episode_step(env, policy, env_params, policy_params, steps_key, state):
  """Step `state.time` of a sampled episode: (action, next state, reward).

  A key per step (not `step_randomness`): episodes labeled by earlier versions still
  regenerate from their seeds (the drift harness's reference relies on it). The key depends
  on the step's time only, never on the horizon, so a shorter horizon that the episode
  never reaches samples the same episode."""
  k_pol, k_env = jax.random.split(jax.random.fold_in(steps_key, state.time))
  action = sample_categorical(k_pol, policy.probs(policy_params, state, env_params))
  next_state, reward, _ = env.step(k_env, state, action, env_params)
  return action, next_state, reward


def episode_length(
  env: Environment, policy: Policy, env_params, policy_params, key: jax.Array
) -> jax.Array:
  """int32 [], the length T of the episode `sample_episode` samples from `key`, without
  keeping its states (a `while_loop` that stops at the episode's end or the horizon)."""
  reset_key, steps_key = jax.random.split(key)

  def body(state):
    return _episode_step(env, policy, env_params, policy_params, steps_key, state)[1]

  final = jax.lax.while_loop(
    lambda s: ~s.done & (s.time < env.horizon), body, env.reset(reset_key, env_params)
  )
  return jnp.minimum(final.time, env.horizon).astype(jnp.int32)


# -- random numbers of one step ------------------------------------------------------------


_ROTATIONS = (np.array([13, 15, 26, 6], np.uint32), np.array([17, 29, 16, 24], np.uint32))
# Hashes of up to this many counter pairs are unrolled (see `threefry_pairs`).
_MAX_UNROLLED_PAIRS = 2


def _rotate_left(x, r):
  return jax.lax.shift_left(x, r) | jax.lax.shift_right_logical(x, np.uint32(32) - r)


def _four_rounds(x, rotations):
  for r in rotations:
    x0 = x[0] + x[1]
    x = [x0, x0 ^ _rotate_left(x[1], r)]
  return x


def threefry_pairs(key_words: jax.Array, x1: jax.Array, x2: jax.Array, rolled: bool):
  """Threefry-2x32 (20 rounds) of the counter pairs (x1, x2) uint32 [m] under key_words
  uint32 [2]: the bits of `jax.extend.random.threefry_2x32(key, concat([x1, x2]))`.

  `rolled` runs the five 4-round blocks as a fori_loop (how JAX lowers Threefry on CPU),
  else as straight-line code (how it does on accelerators). Inside the work queue's loop
  the choice is the hash's size (`hash_words`): on 2 CPU cores, unrolled hashes of at most
  two pairs ran key_to_door 1.5x faster and compiled the tabular program sooner, while an
  unrolled hash of four pairs ran reasoning at 0.6x.
  """
  k1, k2 = key_words[0], key_words[1]
  ks = [k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA)]
  x = [x1 + ks[0], x2 + ks[1]]
  if rolled:

    def block(i, state):
      x, ks, rotations = state
      x = _four_rounds(x, rotations[0])
      x = [x[0] + ks[0], x[1] + ks[1] + (i + 1).astype(jnp.uint32)]
      return x, ks[1:] + ks[:1], rotations[1:] + rotations[:1]

    rotations = [jnp.asarray(r) for r in _ROTATIONS]
    x, _, _ = jax.lax.fori_loop(0, 5, block, (x, ks[1:] + ks[:1], rotations))
    return x
  for i in range(5):
    x = _four_rounds(x, _ROTATIONS[i % 2])
    x = [x[0] + ks[(i + 1) % 3], x[1] + ks[(i + 2) % 3] + np.uint32(i + 1)]
  return x


def hash_words(key_words: jax.Array, counter: jax.Array, n_words: int) -> jax.Array:
  """uint32 [n_words]: Threefry-2x32 of the counters (counter, c), c = 0, 1, ... under
  key_words uint32 [2] (two words per hash). A pure function of (key, counter)."""
  m = -(-n_words // 2)
  x1, x2 = jnp.full((m,), counter, jnp.uint32), jnp.arange(m, dtype=jnp.uint32)
  y1, y2 = threefry_pairs(key_words, x1, x2, rolled=m > _MAX_UNROLLED_PAIRS)
  return jnp.concatenate([y1, y2])[:n_words]


def unit_uniforms(bits: jax.Array) -> jax.Array:
  """uint32 -> float32 in [0, 1) from the top 23 bits (as jax.random.uniform does)."""
  mantissa = jax.lax.shift_right_logical(bits, jnp.uint32(9)) | jnp.uint32(0x3F800000)
  return jax.lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0


def step_randomness(env: Environment, key_words: jax.Array, time: jax.Array):
  """(u_pol float32 [], env_input) for the step at `time` of a stream keyed by key_words:
  the policy's uniform and either the environment's uniforms [num_step_uniforms] or, for an
  environment that steps from a key, a key. One hash for up to two words."""
  n_env = env.num_step_uniforms
  words = hash_words(key_words, time.astype(jnp.uint32), 1 + (n_env or 2))
  if n_env:
    return unit_uniforms(words[0]), unit_uniforms(words[1:])
  return unit_uniforms(words[0]), jax.random.wrap_key_data(words[1:3])


def _env_step(env: Environment, env_params, env_input, state, action):
  if env.num_step_uniforms:
    return env.step_from_uniforms(env_input, state, action, env_params)
  return env.step(env_input, state, action, env_params)


# -- branch continuations ------------------------------------------------------------------


@pytree.dataclass
class Branch:
  """One continuation in flight: do(a_t = first_action) at s_t, then pi.

  key: uint32 [2], the continuation's key words; step j uses `step_randomness(key, j)`, so
  arms that share the key share their random numbers step for step (common random numbers).
  steps: env steps taken so far; max_steps: the most it may take (H - t).
  ret, discount: sum_j gamma^j r_{t+j} so far, and gamma^steps.
  banned: the content class the continuation may not take after its first step (-1: none).
  offset, scale: the episode return the branch implies is offset + scale * ret (for
  env.success: R_{<t} and gamma^t).
  """

  state: PyTree
  first_action: jax.Array
  key: jax.Array
  steps: jax.Array
  max_steps: jax.Array
  ret: jax.Array
  discount: jax.Array
  banned: jax.Array
  offset: jax.Array
  scale: jax.Array


def start_branch(state, first_action, key_words, max_steps, banned=-1, offset=0.0, scale=1.0):
  """A Branch that has taken no step yet (scalars; vmap for many)."""
  f32 = functools.partial(jnp.asarray, dtype=jnp.float32)
  return Branch(
    state=state,
    first_action=jnp.asarray(first_action, jnp.int32),
    key=jnp.asarray(key_words, jnp.uint32),
    steps=jnp.int32(0),
    max_steps=jnp.asarray(max_steps, jnp.int32),
    ret=jnp.float32(0.0),
    discount=jnp.float32(1.0),
    banned=jnp.asarray(banned, jnp.int32),
    offset=f32(offset),
    scale=f32(scale),
  )


def advance(
  env: Environment,
  policy: Policy,
  env_params,
  policy_params,
  gamma: float,
  use_banned: bool,
  br: Branch,
) -> tuple[Branch, jax.Array]:
  """One step of one branch: (branch after it, ended bool []). Step 0 takes the forced
  first action; later steps sample pi (without the banned class if `use_banned`)."""
  u_pol, env_input = step_randomness(env, br.key, br.steps)
  probs = policy.probs(policy_params, br.state, env_params)
  if use_banned:
    probs = _without_class(env, env_params, br.state, probs, br.banned)
  sampled = sample_categorical_from_uniform(u_pol, probs)
  action = jnp.where(br.steps == 0, br.first_action, sampled)
  state, reward, _ = _env_step(env, env_params, env_input, br.state, action)
  steps = br.steps + 1
  br = br.replace(
    state=state, steps=steps, ret=br.ret + br.discount * reward, discount=br.discount * gamma
  )
  return br, state.done | (steps >= br.max_steps)


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
  """G_t of do(a_t = first_action) at `state`, then pi to the end of the episode (alone:
  one `while_loop`; the labeler rolls many at once with `roll_branches`).

  Args:
    state: s_t (time t). A state that is already done yields G = 0.
    first_action: int32 [], the action forced at s_t.
    key: the continuation key (a typed key). Step j of the branch uses random numbers that
      depend on (key, j) only, so arms that start from the same s_t with the same key use
      common random numbers.
    gamma: discount (static).
    max_steps: bound on the steps left (default: the horizon).
    banned_class: int32 [] or None. If given (>= 0), the continuation after the first step
      never takes an action whose `env.action_class` equals it (pi renormalised over the
      rest; if nothing is left, pi itself). -1 bans nothing.

  Returns:
    G: float32 [], sum_{u>=t} gamma^(u-t) r_u.
    steps: int32 [], env steps simulated before the episode ended.
    final_state: the state the branch ended in (for `env.success`).
  """
  br = start_branch(
    state,
    first_action,
    jax.random.key_data(key),
    env.horizon if max_steps is None else max_steps,
    -1 if banned_class is None else banned_class,
  )
  step = functools.partial(
    advance, env, policy, env_params, policy_params, gamma, banned_class is not None
  )
  br = jax.lax.while_loop(
    lambda b: ~b.state.done & (b.steps < b.max_steps), lambda b: step(b)[0], br
  )
  return br.ret, br.steps, br.state


def roll_branches(
  env: Environment,
  policy: Policy,
  env_params,
  policy_params,
  load,
  order: jax.Array,
  count: jax.Array,
  success0: jax.Array,
  *,
  num_lanes: int,
  gamma: float,
  use_banned: bool,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Rolls branches 0..B-1 to their ends with a work queue of `num_lanes` lanes.

  Every iteration advances the running lanes one step (vmapped `advance`); a lane whose
  branch has ended holds its results until 1 / _REFILL_FRACTION of the lanes are free (or
  none runs), when they are written and the free lanes take the next branches of `order`.
  So lanes idle at most that long while work is left, where a lock-step batch would wait for
  its longest branch, and the gathers and scatters of a refill are paid once per batch.

  Args:
    load: fn(ids int32 [W]) -> Branch [W], the start of those branches (ids in [0, B)).
    order: int32 [B], branch ids in the order they are taken (longest first keeps the tail
      short); the first `count` are rolled, the rest (already ended) keep G = 0, 0 steps.
    success0: bool [B], env.success of branches that are never rolled.

  Returns (G float32 [B], steps int32 [B], success bool [B]: env.success of the branch's
  final state and the episode return offset + scale * G it implies).
  Results depend only on each branch's start and key, never on lanes or order.
  """
  B = order.shape[0]
  W = min(num_lanes, B)
  step = jax.vmap(
    functools.partial(advance, env, policy, env_params, policy_params, gamma, use_banned)
  )
  succeeded = jax.vmap(env.success)
  batch = max(1, W // _REFILL_FRACTION)

  def refill(carry):
    """Lanes whose branch has ended write its results and take the next branches."""
    ids, lanes, ended, head, (G, steps, success) = carry
    done_ids = jnp.where(ended, ids, B)  # out of range: dropped
    G = G.at[done_ids].set(lanes.ret, mode="drop")
    steps = steps.at[done_ids].set(lanes.steps, mode="drop")
    won = succeeded(lanes.state, lanes.offset + lanes.scale * lanes.ret)
    success = success.at[done_ids].set(won, mode="drop")
    free = ended | (ids >= B)
    pos = head + jnp.cumsum(free) - 1
    taken = free & (pos < count)
    new_ids = jnp.where(taken, order[jnp.minimum(pos, B - 1)], B)
    lanes = _where_tree(taken, load(jnp.minimum(new_ids, B - 1)), lanes)
    ids = jnp.where(free, new_ids, ids)
    return ids, lanes, jnp.zeros_like(ended), head + taken.sum(), (G, steps, success)

  def body(carry):
    ids, lanes, ended, head, out = carry
    running = (ids < B) & ~ended
    moved, now_ended = step(lanes)
    lanes = _where_tree(running, moved, lanes)  # an ended lane keeps its results
    ended = ended | (running & now_ended)
    free = ended | (ids >= B)
    # Refill once a batch of lanes is free (gathers and scatters cost as much as a step),
    # or when nothing runs any more.
    due = (free.sum() >= batch) | (free.all())
    return jax.lax.cond(due, refill, lambda c: c, (ids, lanes, ended, head, out))

  out = (jnp.zeros((B,), jnp.float32), jnp.zeros((B,), jnp.int32), success0)
  ids = jnp.full((W,), B, jnp.int32)
  lanes = load(jnp.zeros((W,), jnp.int32))
  carry = refill((ids, lanes, jnp.zeros((W,), bool), jnp.int32(0), out))
  _, _, _, _, out = jax.lax.while_loop(lambda c: (c[0] < B).any(), body, carry)
  return out


def _without_class(env, env_params, state, probs, banned_class):
  """pi renormalised over actions whose content class is not `banned_class`."""
  actions = jnp.arange(env.num_actions)
  classes = jax.vmap(env.action_class, (None, 0, None))(state, actions, env_params)
  kept = probs * (classes != banned_class)
  total = kept.sum()
  return jnp.where(total > 0, kept / jnp.where(total > 0, total, 1.0), probs)
