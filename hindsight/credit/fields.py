"""Every per-step label field of docs/design.md section 1 from one episode's branch returns.

Shared by the JAX labeler and the adapters' process-pool labeler (NumPy arrays in, JAX
arrays out; jit- and vmap-safe). Written for one episode; vmap outside.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from hindsight.credit.estimators import UNDETERMINED, bounded_mean_stderr, classify, mean_stderr
from hindsight.credit.replacement import DEGENERATE

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


def _bounded_rows(x, lo, hi, upper_rates, z):
  """`bounded_mean_stderr` of x [R, H, K] with ranges lo, hi [R, H]: ([R, H],) x 3.

  One vmapped call for all rows, so the program holds one copy of the tie search rather
  than five (less to compile)."""
  flat = functools.partial(bounded_mean_stderr, upper_rates=upper_rates, z=z)
  R, H, K = x.shape
  out = jax.vmap(flat)(x.reshape(R * H, K), lo.reshape(-1), hi.reshape(-1))
  return tuple(v.reshape(R, H) for v in out)


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


def paired_credit(diff, keep_share, lo, hi, *, upper_rates, z: float):
  """(credit, stderr, bounded) of one step from its K paired differences.

  diff [K]: d_k = G^keep_k - G^rep_k of branches sharing continuation keys; keep_share: w =
  q(a_t | s_t) when the replace arm was drawn from q restricted to a' != a_t (else 0); lo, hi:
  bounds of the return-to-go from s_t (so d is in [lo - hi, hi - lo]). With the identity
  Delta_t = (1 - w) E_{a' ~ q_-}[Q(a_t) - Q(a')]: credit = (1 - w) mean_k d_k, its stderr
  (1 - w) x the stderr of the mean, raised to the tie bound where the branches nearly all
  tie (`bounded`). w = 1 (a_t is the only action q can draw): exactly 0, stderr 0.
  """
  mean, se, bounded = bounded_mean_stderr(diff, lo - hi, hi - lo, upper_rates, z)
  return _scaled_credit(keep_share, mean, se, bounded)


def _scaled_credit(keep_share, mean, se, bounded):
  """(1 - w) x (the paired mean, its stderr), exactly 0 where w = 1 (see paired_credit)."""
  scale = jnp.where(keep_share >= DEGENERATE, 0.0, 1.0 - keep_share)
  return scale * mean, jnp.where(scale > 0, scale * se, 0.0), bounded & (scale > 0)


def step_fields(
  G: jax.Array,
  r: jax.Array,
  mask: jax.Array,
  success: jax.Array,
  undefined: jax.Array,
  *,
  keep_share: jax.Array,
  bounds: jax.Array,
  upper_rates: jax.Array,
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
    keep_share: [H] w_t = q(a_t | s_t) when the replace arm was drawn from q restricted to
      a' != a_t (stratified), 0 when it was drawn from q itself.
    bounds: [H + 1, 2] (lo, hi) of the return-to-go from s_t (s_H: after the last step;
      (0, 0) once the episode is over), for the tie bound (`bounded_mean_stderr`).
    upper_rates: `tie_upper_rates(K, confidence)`; z: the quantile of that confidence.
    exact: optional (credit, credit_realized, progress) [H] from dynamic programming; their
      stderrs are then 0.

  Returns: dict of [H] arrays (NaN on padding) plus `length`, `return` scalars. With
  d_k = G^keep_k - G^rep_k and the identity (q_- = q restricted to a' != a_t)
    Delta_t = Q(a_t) - E_q Q(a') = (1 - q(a_t)) E_{a' ~ q_-}[Q(a_t) - Q(a')]:
    credit          (1 - w) mean_k d_k                       (1 - w) x its stderr
    credit_realized G_t(tau) - mean_k [w G^keep + (1 - w) G^rep]   stderr of that mean
    progress        r_t + gamma Phi(s_{t+1}) - Phi(s_t)     Phi at t and t+1 come from
                                                            different branch keys: se^2 adds
    phi_hard        1 if any k succeeds; stderr sqrt(h (1 - h)), h = 1 - (1 - p)^K with p
                    the share of successful continuations (the indicator's plug-in spread;
                    p = 0 or 1 is replaced by its rule-of-three bound unless the
                    continuation from s_{t+1} cannot vary)
  Every stderr is 0 only where the estimate is exact (w = 1, or a range of width 0).
  `credit_bounded`, `credit_realized_bounded`, `progress_bounded` [H] bool: that field's
  stderr is the tie bound of `credit.estimators`, not the sample stderr.
  `credit_sample_stderr` [H]: the credit's plain sample stderr (its square unbiased for the
  label's Monte Carlo noise variance; also where the tie bound replaced it, and 0 where every
  paired difference tied): the label's noise level, which the credit model's loss may take
  out (`model.loss`, `sample_noise`).
  """
  H, K = G.shape[0], G.shape[1]
  chex.assert_shape(G, (H, K, None))
  chex.assert_shape([r, mask, undefined, keep_share], (H,))
  chex.assert_shape(bounds, (H + 1, 2))
  chex.assert_shape(success, (H, K))
  lo, hi = bounds[:H, 0], bounds[:H, 1]
  g_tau = returns_to_go(r, gamma)
  if exact is not None:
    est = _exact_estimates(G, lo, hi, upper_rates, z, exact)
  else:
    est = _mc_estimates(G, r, g_tau, keep_share, lo, hi, upper_rates, z, gamma)
  phi_hard, phi_hard_se = hard_estimate(success, bounds, upper_rates)
  return _label_fields(est, phi_hard, phi_hard_se, g_tau, mask, undefined, tolerance, z)


def _exact_estimates(G, lo, hi, upper_rates, z, exact) -> dict:
  """credit, credit_realized and progress from the DP (stderr 0); Phi still from the
  branches (for its own fields)."""
  H = G.shape[0]
  phi, phi_se, phi_bounded = _bounded_rows(G[None, ..., -1], lo[None], hi[None], upper_rates, z)
  credit, realized, progress = exact
  zeros, no = jnp.zeros((H,), jnp.float32), jnp.zeros((H,), bool)
  return {
    "credit": (credit, zeros, no),
    "credit_sample_stderr": zeros,
    "realized": (realized, zeros, no),
    "progress": (progress, zeros, no),
    "phi": (phi[0], phi_se[0], phi_bounded[0]),
  }


def _mc_estimates(G, r, g_tau, keep_share, lo, hi, upper_rates, z, gamma) -> dict:
  """(value, stderr, bounded) [H] of credit, credit_realized, progress and Phi from the
  branch returns G [H, K, 3] (arms keep, replace, phi): step_fields' equations."""
  w = keep_share
  # w = 1: a_t is the only action q can draw, so the arms are identical by construction.
  scale = jnp.where(w >= DEGENERATE, 0.0, 1.0 - w)
  # The baseline mixes the arms with weights (w, 1 - w). A rare event in the heavier arm
  # can hide behind the spread of the other, so a nearly tied arm bounds the mixture by
  # the sum of the arms' stderrs (sd(aX + bY) <= a sd(X) + b sd(Y)).
  mix = w[:, None] * G[..., 0] + (1.0 - w[:, None]) * G[..., 1]
  # Five estimates of [H, K] samples, reduced together: phi, the paired difference (range
  # [lo - hi, hi - lo]), the mixture, the keep arm, the replace arm.
  rows = jnp.stack([G[..., -1], G[..., 0] - G[..., 1], mix, G[..., 0], G[..., 1]])
  los = jnp.stack([lo, lo - hi, lo, lo, lo])
  his = jnp.stack([hi, hi - lo, hi, hi, hi])
  means, ses, bnds = _bounded_rows(rows, los, his, upper_rates, z)
  phi, phi_se, phi_bounded = means[0], ses[0], bnds[0]
  credit = _scaled_credit(w, means[1], ses[1], bnds[1])
  # The paired difference's plain sample stderr, also where the tie bound replaced it.
  credit_sample_se = _scaled_credit(w, means[1], mean_stderr(rows[1])[1], bnds[1])[1]
  rep_mean, mix_se, mix_bounded = means[2], ses[2], bnds[2]
  keep_se, keep_bounded, rep_se, rep_bounded = ses[3], bnds[3], ses[4], bnds[4]
  arm_bounded = (keep_bounded & (w > 0)) | (rep_bounded & (scale > 0))
  arm_sum = jnp.where(w > 0, w * keep_se, 0.0) + jnp.where(scale > 0, scale * rep_se, 0.0)
  realized_se = jnp.where(arm_bounded, jnp.maximum(mix_se, arm_sum), mix_se)
  realized = (g_tau - rep_mean, realized_se, mix_bounded | arm_bounded)
  phi_next = jnp.append(phi[1:], 0.0)  # Phi after the end is 0: those states are done
  phi_next_se = jnp.append(phi_se[1:], 0.0)
  progress = (
    r + gamma * phi_next - phi,
    jnp.sqrt(phi_se**2 + (gamma * phi_next_se) ** 2),
    phi_bounded | jnp.append(phi_bounded[1:], False),
  )
  return {
    "credit": credit,
    "credit_sample_stderr": credit_sample_se,
    "realized": realized,
    "progress": progress,
    "phi": (phi, phi_se, phi_bounded),
  }


def hard_estimate(success, bounds, upper_rates):
  """phi_hard [H] (any of K continuations from s_{t+1} succeeds) and its plug-in stderr."""
  K = success.shape[1]
  hits = success.sum(-1)
  p_success = hits / K
  tie_rate = upper_rates[0]
  can_vary = bounds[1:, 1] > bounds[1:, 0]
  p_spread = jnp.where(can_vary & (hits == 0), tie_rate, p_success)
  p_spread = jnp.where(can_vary & (hits == K), 1.0 - tie_rate, p_spread)
  phi_hard = (hits > 0).astype(jnp.float32)
  h = 1.0 - (1.0 - p_spread) ** K
  return phi_hard, jnp.sqrt(h * (1.0 - h))


def _label_fields(est, phi_hard, phi_hard_se, g_tau, mask, undefined, tolerance, z) -> dict:
  """The estimates as step_fields' output: NaN on padding and where q is undefined, the
  class of each step, the bounded flags."""
  H = mask.shape[0]
  credit, credit_se, credit_bounded = est["credit"]
  realized, realized_se, realized_bounded = est["realized"]
  progress, progress_se, progress_bounded = est["progress"]
  phi, phi_se, _ = est["phi"]
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
  out["credit_bounded"] = credit_bounded & mask
  out["credit_realized_bounded"] = realized_bounded & mask
  out["progress_bounded"] = progress_bounded & mask
  out["undefined"] = undefined & mask
  out["return_to_go"] = jnp.where(mask, g_tau, nan)
  out["phi"] = jnp.where(mask, phi, nan)
  out["phi_stderr"] = jnp.where(mask, phi_se, nan)
  out["credit_sample_stderr"] = jnp.where(mask & ~undefined, est["credit_sample_stderr"], nan)
  out["length"] = mask.sum().astype(jnp.int32)
  out["return"] = g_tau[0]
  return out
