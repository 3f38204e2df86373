"""Every per-step label field of DESIGN section 1 from one episode's branch returns.

Shared by the JAX labeler and the adapters' process-pool labeler (NumPy arrays in, JAX
arrays out; jit- and vmap-safe). Written for one episode; vmap outside.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight.credit.estimators import UNDETERMINED, classify, mean_stderr

# Per-step float fields, in the order they are written.
STEP_FIELDS = (
  "credit",
  "credit_stderr",
  "credit_realized",
  "credit_realized_stderr",
  "progress",
  "progress_stderr",
  "phi_hard",
  "phi_hard_stderr",
)


def returns_to_go(rewards: jax.Array, gamma: float = 1.0) -> jax.Array:
  """G_t = r_t + gamma G_{t+1}, float32 [H] -> [H] (padding rewards are 0)."""

  def body(g_next, r_t):
    g_t = r_t + gamma * g_next
    return g_t, g_t

  _, g = jax.lax.scan(body, jnp.float32(0.0), jnp.asarray(rewards, jnp.float32), reverse=True)
  return g


def continuation_totals(G_phi: jax.Array, r: jax.Array, gamma: float) -> jax.Array:
  """R_{<=t} + gamma^{t+1} G^phi_{t+1,k}: episode returns if the policy continued from
  s_{t+1} along branch k, [H, K] (after the last step the continuation adds 0)."""
  H, K = G_phi.shape
  discounts = gamma ** jnp.arange(H, dtype=jnp.float32)
  prefix = jnp.cumsum(discounts * r)
  G_next = jnp.concatenate([G_phi[1:], jnp.zeros((1, K), G_phi.dtype)], axis=0)
  return prefix[:, None] + gamma * discounts[:, None] * G_next


def step_fields(
  G: jax.Array,
  r: jax.Array,
  mask: jax.Array,
  success: jax.Array,
  undefined: jax.Array,
  *,
  gamma: float,
  tolerance: float,
  z: float,
  exact: tuple[jax.Array, jax.Array, jax.Array] | None = None,
) -> dict[str, jax.Array]:
  """The label fields of one episode.

  Args:
    G: [H, K, n_arms] branch returns; arms (keep, replace, phi), or just (phi,) with `exact`.
    r: [H] rewards; mask: [H] bool, t < T; undefined: [H] bool, q does not exist.
    success: [H, K] bool, "the episode succeeds if the policy continues from s_{t+1} along
      branch k" (Math-Shepherd hard estimate).
    exact: optional (credit, credit_realized, progress) [H] from dynamic programming; their
      stderrs are then 0.

  Returns: dict of [H] arrays (NaN on padding) plus `length`, `return` scalars.
    credit          mean_k (G^keep - G^rep)                stderr of the paired mean
    credit_realized G_t(tau) - mean_k G^rep                 stderr of mean_k G^rep
    progress        r_t + gamma Phi(s_{t+1}) - Phi(s_t)     Phi at t and t+1 come from
                                                            different branch keys: se^2 adds
    phi_hard        1 if any k succeeds; stderr sqrt(h (1 - h)), h = 1 - (1 - p)^K with p
                    the share of successful continuations (the indicator's plug-in spread)
  """
  H, K = G.shape[0], G.shape[1]
  g_tau = returns_to_go(r, gamma)
  phi, phi_se = mean_stderr(G[..., -1])
  if exact is not None:
    credit, realized, progress = exact
    credit_se = realized_se = progress_se = jnp.zeros((H,), jnp.float32)
  else:
    credit, credit_se = mean_stderr(G[..., 0] - G[..., 1])
    rep_mean, realized_se = mean_stderr(G[..., 1])
    realized = g_tau - rep_mean
    phi_next = jnp.append(phi[1:], 0.0)  # Phi after the end is 0: those states are done
    phi_next_se = jnp.append(phi_se[1:], 0.0)
    progress = r + gamma * phi_next - phi
    progress_se = jnp.sqrt(phi_se**2 + (gamma * phi_next_se) ** 2)

  p_success = success.mean(-1)
  phi_hard = success.any(-1).astype(jnp.float32)
  h = 1.0 - (1.0 - p_success) ** K
  phi_hard_se = jnp.sqrt(h * (1.0 - h))

  credit = jnp.where(undefined, jnp.nan, credit)
  realized = jnp.where(undefined, jnp.nan, realized)
  values = (
    credit,
    credit_se,
    realized,
    realized_se,
    progress,
    progress_se,
    phi_hard,
    phi_hard_se,
  )
  nan = jnp.full((H,), jnp.nan, jnp.float32)
  out = {
    name: jnp.where(mask, v, nan).astype(jnp.float32)
    for name, v in zip(STEP_FIELDS, values, strict=True)
  }
  klass = classify(credit, credit_se, tolerance, z)
  out["klass"] = jnp.where(mask, klass, UNDETERMINED)
  out["undefined"] = undefined & mask
  out["return_to_go"] = jnp.where(mask, g_tau, nan)
  out["phi"] = jnp.where(mask, phi, nan)
  out["phi_stderr"] = jnp.where(mask, phi_se, nan)
  out["length"] = mask.sum().astype(jnp.int32)
  out["return"] = g_tau[0]
  return out
