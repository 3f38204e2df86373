"""Credit among agents: Shapley values, interactions, dividends, COMA's baseline.

A cooperative game over n agents is a value per coalition, `values` float [2^n], indexed by
bitmask (bit i set = agent i present; docs/design.md section 1). Everything here is for one game;
vmap outside for a batch of them (rlax style).

  Shapley value       phi_i   = sum_{S not containing i} |S|! (n-|S|-1)! / n! [v(S+i) - v(S)]
  interaction index   I_ij    = sum_{S without i, j} |S|! (n-|S|-2)! / (n-1)! D_ij v(S),
                      D_ij v(S) = v(S+ij) - v(S+i) - v(S+j) + v(S)
                      (Grabisch & Roubens 1999; I_ii is phi_i by convention)
  Harsanyi dividend   d(S)    = sum_{T subset of S} (-1)^{|S|-|T|} v(T),  v(S) = sum_{T in S} d(T)
  pairwise term       I_AC    = v(AC) - v(A) - v(C) + v(empty)  (the background essay's term)
  COMA advantage      A_a     = Q(s, u) - sum_u' pi_a(u'|s) Q(s, (u', u_-a))  (Foerster et al.
                      2018: agent a's action against its own policy, the others held fixed)

Exact Shapley and interactions enumerate all 2^n coalitions (n up to about 20); for larger n,
`shapley_sampled` averages marginal contributions over random permutations, in antithetic
pairs (a permutation and its reverse).
"""

from __future__ import annotations

from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

from hindsight.credit.estimators import mean_stderr
from hindsight.errors import HindsightError

MAX_EXACT_AGENTS = 24


def num_agents(values) -> int:
  """n from a values array of length 2^n (a one-line error otherwise)."""
  size = int(np.shape(values)[-1])
  n = size.bit_length() - 1
  if size < 2 or 1 << n != size:
    raise HindsightError(f"coalition values need length 2^n for n >= 1 agents, got {size}")
  if n > MAX_EXACT_AGENTS:
    raise HindsightError(f"{n} agents are too many for exact values; use shapley_sampled")
  return n


def _sizes(n: int) -> jax.Array:
  """|S| for every bitmask S, int [2^n]."""
  masks = jnp.arange(1 << n, dtype=jnp.uint32)
  return jax.lax.population_count(masks).astype(jnp.int32)


def _log_factorial(k):
  return jax.lax.lgamma(jnp.asarray(k, jnp.float32) + 1.0)


def shapley(values: jax.Array) -> jax.Array:
  """Exact Shapley values, float [2^n] -> [n] (see the module docstring)."""
  values = jnp.asarray(values, jnp.float32)
  chex.assert_rank(values, 1)
  n = num_agents(values)
  masks = jnp.arange(1 << n, dtype=jnp.int32)
  size = _sizes(n)
  weight = jnp.exp(_log_factorial(size) + _log_factorial(n - size - 1) - _log_factorial(n))

  def one(i):
    bit = jnp.left_shift(1, i)
    without = (masks & bit) == 0
    gain = values[masks | bit] - values
    return jnp.sum(jnp.where(without, weight * gain, 0.0))

  return jax.lax.map(one, jnp.arange(n))


def interaction(values: jax.Array) -> jax.Array:
  """Pairwise Shapley interaction index, float [2^n] -> [n, n] (diagonal: Shapley values)."""
  values = jnp.asarray(values, jnp.float32)
  chex.assert_rank(values, 1)
  n = num_agents(values)
  if n < 2:
    return shapley(values)[:, None]
  masks = jnp.arange(1 << n, dtype=jnp.int32)
  size = _sizes(n)
  weight = jnp.exp(_log_factorial(size) + _log_factorial(n - size - 2) - _log_factorial(n - 1))

  def row(i):
    bi = jnp.left_shift(1, i)

    def cell(j):
      bj = jnp.left_shift(1, j)
      without = ((masks & bi) == 0) & ((masks & bj) == 0)
      delta = values[masks | bi | bj] - values[masks | bi] - values[masks | bj] + values
      return jnp.sum(jnp.where(without, weight * delta, 0.0))

    return jax.vmap(cell)(jnp.arange(n))

  off = jax.lax.map(row, jnp.arange(n))
  return jnp.where(jnp.eye(n, dtype=bool), jnp.diag(shapley(values)), off)


def dividends(values: jax.Array) -> jax.Array:
  """Harsanyi dividends (the Moebius transform), float [2^n] -> [2^n], by n butterfly passes."""
  d = jnp.asarray(values, jnp.float32)
  chex.assert_rank(d, 1)
  n = num_agents(d)
  for i in range(n):
    blocks = d.reshape(-1, 2, 1 << i)  # [..., bit i clear / set, lower bits]
    d = blocks.at[:, 1].add(-blocks[:, 0]).reshape(-1)
  return d


def pair_terms(values: jax.Array) -> jax.Array:
  """The essay's I_AC = v(AC) - v(A) - v(C) + v(empty) for every pair, [n, n] (diagonal 0)."""
  values = jnp.asarray(values, jnp.float32)
  n = num_agents(values)
  single = values[jnp.left_shift(1, jnp.arange(n))]
  pair = values[jnp.left_shift(1, jnp.arange(n))[:, None] | jnp.left_shift(1, jnp.arange(n))]
  terms = pair - single[:, None] - single[None, :] + values[0]
  return jnp.where(jnp.eye(n, dtype=bool), 0.0, terms)


def coma_advantage(q_values: jax.Array, policy: jax.Array, action: jax.Array) -> jax.Array:
  """COMA's counterfactual advantage of agent a's `action`, the other agents' actions fixed.

  q_values: float [A] Q(s, (u', u_-a)) for each of agent a's actions u';
  policy: float [A] pi_a(u'|s). Returns Q(s, u) - sum_u' pi_a(u'|s) Q(s, (u', u_-a)), [].
  """
  chex.assert_rank([q_values, policy], 1)
  chex.assert_equal_shape([q_values, policy])
  return q_values[action] - jnp.sum(policy * q_values)


def memberships_to_index(memberships: jax.Array) -> jax.Array:
  """bool [..., n] -> int [...] bitmask indices (bit i = agent i present)."""
  n = memberships.shape[-1]
  return jnp.sum(memberships.astype(jnp.int32) * jnp.left_shift(1, jnp.arange(n)), axis=-1)


def shapley_sampled(
  value_fn: Callable[[jax.Array], jax.Array], n: int, num_permutations: int, key: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Monte Carlo Shapley values over random orders of the agents, with antithetic pairs.

  value_fn: bool [..., n] memberships -> values [...] (a JAX function or any array function).
  Draws num_permutations / 2 orders and pairs each with its reverse; each pair's average
  marginal contributions are one sample. Returns (mean [n], stderr [n]) over the pairs.
  """
  if num_permutations < 4 or num_permutations % 2:
    raise HindsightError(f"num_permutations must be even and >= 4, got {num_permutations}")
  pairs = num_permutations // 2
  orders = jax.vmap(lambda k: jax.random.permutation(k, n))(jax.random.split(key, pairs))
  orders = jnp.concatenate([orders, orders[:, ::-1]])  # [P, n]: the antithetic halves
  # Coalition after the first k agents of each order, k = 0..n: rank[agent] < k.
  rank = jnp.argsort(orders, axis=-1)  # [P, n]
  prefix = rank[:, None, :] < jnp.arange(n + 1)[None, :, None]  # [P, n+1, n]
  v = jnp.asarray(value_fn(prefix), jnp.float32)  # [P, n+1]
  chex.assert_shape(v, (num_permutations, n + 1))
  gain_in_order = v[:, 1:] - v[:, :-1]  # [P, n]: the k-th agent's marginal contribution
  gain = jnp.take_along_axis(gain_in_order, rank, axis=-1)  # [P, n] per agent
  per_pair = 0.5 * (gain[:pairs] + gain[pairs:])
  return mean_stderr(per_pair, axis=0)  # over the P / 2 antithetic pairs
