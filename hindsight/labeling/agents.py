"""Agent-level credit of one episode by coalition rollouts, for any multi-agent environment.

An environment declares its agents (`Environment.num_agents` > 0, `agent_of_step(time)`: who
acts at each step, and a `null_action`: a turn that does nothing). The value of a coalition
S of agents is the episode's return when the agents in S replay their actual actions and
the others' turns are replaced (`ablation`): "null" (the null action) or "resample" (a fresh
draw from the policy), rolled from the episode's initial state. Rollout k uses the same
environment randomness for every coalition (common random numbers).

  n <= MAX_ENUMERATED_AGENTS, no permutations: every coalition, K rollouts, exact Shapley
     values and pairwise interactions of each rollout's game, mean and stderr over k;
  otherwise: `shapley_sampled` over P random orders in antithetic pairs, pair p with its own
     rollout key (so the pairs are independent samples of both the order and the rollout:
     their stderr covers both), 2 (n + 1) rollouts per pair instead of 2^n per rollout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight.credit.coalition import interaction, memberships_to_index, shapley, shapley_sampled
from hindsight.credit.estimators import mean_stderr
from hindsight.envs.base import Environment
from hindsight.errors import HindsightError
from hindsight.policies.base import Policy, sample_categorical

# Up to this many agents the labeling job enumerates all 2^n coalitions by default.
MAX_ENUMERATED_AGENTS = 8
# Folded into an episode's coalition key: the reset (when no initial state is given) and the
# orders of sampled Shapley values.
_RESET_SALT, _ORDER_SALT = 0x5E7, 0x0DE5


def check_agents(env: Environment, ablation: str = "null") -> None:
  if not env.num_agents:
    raise HindsightError(f"environment '{env.name}' declares no agents")
  if ablation not in ("null", "resample"):
    raise HindsightError(f"ablation must be 'null' or 'resample', got {ablation!r}")
  if ablation == "null" and env.null_action is None:
    raise HindsightError(f"environment '{env.name}' has no null action: use ablation 'resample'")


def coalition_rollouts(
  env: Environment,
  policy: Policy,
  actions: jax.Array,
  key: jax.Array,
  num_rollouts: int,
  ablation: str = "null",
  env_params=None,
  policy_params=None,
  masks: jax.Array | None = None,
  initial_state=None,
) -> jax.Array:
  """The episode's return under every coalition S (or the bitmasks `masks` [...]), per
  rollout: float [2^n, K] (or [..., K]).

  actions: int32 [H], the episode's actions (agent `env.agent_of_step(t)` took action t).
  initial_state: where the rollouts start (default: a reset drawn from `key`, which is
    the episode's own start only for environments whose reset is deterministic).
  """
  check_agents(env, ablation)
  env_params = env.default_params() if env_params is None else env_params
  policy_params = policy.default_params() if policy_params is None else policy_params
  masks = jnp.arange(1 << env.num_agents) if masks is None else jnp.asarray(masks)
  if initial_state is None:
    initial_state = env.reset(jax.random.fold_in(key, _RESET_SALT), env_params)

  def rollout(mask, k):
    rollout_key = jax.random.fold_in(key, k)

    def body(state, t):
      k_env, k_pol = jax.random.split(jax.random.fold_in(rollout_key, t))
      member = (mask >> env.agent_of_step(t)) & 1
      if ablation == "null":
        replaced = jnp.int32(env.null_action)
      else:
        replaced = sample_categorical(k_pol, policy.probs(policy_params, state, env_params))
      action = jnp.where(member == 1, actions[t], replaced)
      new, reward, _ = env.step(k_env, state, action, env_params)
      # A finished episode stays finished (and pays nothing more).
      new = jax.tree.map(lambda a, b: jnp.where(state.done, b, a), new, state)
      return new, jnp.where(state.done, 0.0, reward)

    _, rewards = jax.lax.scan(body, initial_state, jnp.arange(env.horizon))
    return rewards.sum()

  per_rollout = jax.vmap(lambda m: jax.vmap(lambda k: rollout(m, k))(jnp.arange(num_rollouts)))
  return per_rollout(masks.reshape(-1)).reshape(*masks.shape, num_rollouts)


def coalition_values(
  env: Environment,
  policy: Policy,
  actions: jax.Array,
  key: jax.Array,
  num_rollouts: int,
  ablation: str = "null",
  env_params=None,
  policy_params=None,
  masks: jax.Array | None = None,
  initial_state=None,
) -> tuple[jax.Array, jax.Array]:
  """(mean, stderr) over rollouts of `coalition_rollouts`: v(S) for every coalition S of
  one episode, [2^n] (or the shape of `masks`)."""
  v = coalition_rollouts(
    env, policy, actions, key, num_rollouts, ablation, env_params, policy_params, masks,
    initial_state,
  )  # fmt: skip
  return mean_stderr(v)


def agent_credit(
  env: Environment,
  policy: Policy,
  actions: jax.Array,
  key: jax.Array,
  num_rollouts: int,
  ablation: str = "null",
  initial_state=None,
  num_permutations: int = 0,
) -> dict:
  """Agent-level credit of one episode (see the module docstring).

  Enumerated (num_permutations = 0): rollout k is one whole game v_k [2^n]; phi_k =
  shapley(v_k) and the stderr is that of the mean over k (exact for correlated coalitions,
  unlike propagating each v(S)'s own stderr). Returns float arrays agent_shapley [n],
  agent_shapley_stderr [n], agent_interaction [n, n], agent_interaction_stderr [n, n],
  coalition_values [2^n], coalition_stderr [2^n].
  Sampled (num_permutations = P, even, >= 4): agent_shapley and agent_shapley_stderr only
  (num_rollouts is not used: each of the P / 2 pairs is one rollout).
  """
  check_agents(env, ablation)
  if num_permutations:
    n, pairs = env.num_agents, num_permutations // 2
    pair_keys = jax.vmap(lambda p: jax.random.fold_in(key, p))(jnp.arange(pairs))
    row_keys = jnp.concatenate([pair_keys, pair_keys])  # both orders of a pair share it

    def value_fn(prefix):  # bool [P, n + 1, n] -> [P, n + 1]
      def one(members, k):
        masks = memberships_to_index(members)
        v = coalition_rollouts(env, policy, actions, k, 1, ablation, masks=masks,
                               initial_state=initial_state)  # fmt: skip
        return v[..., 0]

      return jax.vmap(one)(prefix, row_keys)

    mean, stderr = shapley_sampled(
      value_fn, n, num_permutations, jax.random.fold_in(key, _ORDER_SALT)
    )
    return {"agent_shapley": mean, "agent_shapley_stderr": stderr}

  per_rollout = jax.vmap(
    lambda k: coalition_rollouts(
      env, policy, actions, jax.random.fold_in(key, k), 1, ablation,
      initial_state=initial_state,
    )[:, 0]
  )(jnp.arange(num_rollouts))  # [K, 2^n]  # fmt: skip
  phi = jax.vmap(shapley)(per_rollout)  # [K, n]
  inter = jax.vmap(interaction)(per_rollout)  # [K, n, n]
  out = {}
  for name, stderr_name, x in (
    ("agent_shapley", "agent_shapley_stderr", phi),
    ("agent_interaction", "agent_interaction_stderr", inter),
    ("coalition_values", "coalition_stderr", per_rollout),
  ):
    out[name], out[stderr_name] = mean_stderr(x, axis=0)  # over the K rollouts
  return out
