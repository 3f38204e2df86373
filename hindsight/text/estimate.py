"""Every label field of one text trace from its completions' outcomes (docs/design.md, section
1, read for text; docs/text.md).

A trace of T steps has T + 1 prefixes: x_j = the prompt and steps 0 .. j-1. From each x_j,
j < T, the labeler draws a pool of continuations of the policy; x_T is the trace itself, whose
outcome R is known. For step t:

  keep arm      the pool of x_{t+1} (the policy continuing after step t; R itself at t = T-1)
  phi arm       the pool of x_t: Phi(x_t) = E[R | x_t], the policy's value before step t
  replace arm   policy: the pool of x_t again (step t redrawn, then continued);
                policy_other / policy_no_repeat: the draws from x_t whose new step (and, for
                no_repeat, every later step) is not a restatement of step t;
                null: continuations of x_t followed by the null step

  credit           mean(keep) - mean(replace)
  credit_sample_stderr  sqrt(s_keep^2 + s_replace^2), the arms' plain sample stderrs (the
                   label's noise level; credit_stderr is its honest, tie-bounded stderr)
  credit_realized  R - mean(replace)
  progress         mean(keep) - mean(phi)          (= credit under `policy`)
  phi, phi_hard    mean(phi); 1 if any keep continuation succeeds

Common random numbers do not exist across HTTP samples: the arms of a step are independent
draws, so the variance of a difference is the sum of the arms' variances. Each arm's stderr
is `credit.estimators.bounded_mean_stderr` over outcomes in [0, 1] (the tie bound where
nearly all of an arm's outcomes agree); a difference takes the square root of the sum of
squares, or the plain sum when either arm's stderr is a tie bound (a bound does not add in
quadrature). A replace arm with fewer than 2 draws is undefined (NaN credit and the
`undefined` flag), as policy_other is where pi(a_t) = 1.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.credit.estimators import (
  UNDETERMINED,
  bounded_mean_stderr,
  classify,
  tie_upper_rates,
  z_value,
)
from hindsight.credit.fields import hard_estimate

SUCCESS_THRESHOLD = 0.5


def _padded(n: int) -> int:
  """Rows padded to a power of two (at least 8): a handful of compiled shapes, not one per
  trace length."""
  return max(8, 1 << (n - 1).bit_length())


@functools.partial(jax.jit, static_argnames="z")
def _bounded_rows(x, rates, z: float):
  """bounded_mean_stderr of every row of outcomes x [R, K] in [0, 1]."""
  return jax.vmap(lambda r: bounded_mean_stderr(r, 0.0, 1.0, rates, z))(x)


_hard_rows = jax.jit(hard_estimate)


def sample_stderr(rows: list[np.ndarray]) -> np.ndarray:
  """The plain sample stderr std(x, ddof=1) / sqrt(K) [R] of each row (inf under 2 samples,
  as `row_stats`): its square is unbiased for the row mean's variance; given also where
  `row_stats` bounds the stderr."""
  return np.array([np.std(r, ddof=1) / np.sqrt(len(r)) if len(r) >= 2 else np.inf
                   for r in (np.asarray(r, np.float64) for r in rows)])  # fmt: skip


def row_stats(rows: list[np.ndarray], confidence: float):
  """(mean, stderr, bounded) [R] of rows of outcomes in [0, 1] (any lengths; NaN, inf,
  False for rows under 2 samples)."""
  R = len(rows)
  mean, se = np.full(R, np.nan), np.full(R, np.inf)
  bounded = np.zeros(R, bool)
  z = z_value(confidence)
  groups = collections.defaultdict(list)
  for i, row in enumerate(rows):
    if len(row) >= 2:
      groups[len(row)].append(i)
  for k, members in groups.items():
    x = np.zeros((_padded(len(members)), k), np.float32)
    x[: len(members)] = np.stack([np.asarray(rows[i], np.float32) for i in members])
    m, s, b = (np.asarray(v)[: len(members)] for v in _bounded_rows(x, _rates(k, confidence), z))
    mean[members], se[members], bounded[members] = m, s, b
  return mean, se, bounded


@functools.cache
def _rates(k: int, confidence: float):
  return jnp.asarray(tie_upper_rates(k, confidence))


def difference(a, b):
  """(mean, stderr, bounded) of the difference of two independent estimates."""
  (ma, sa, ba), (mb, sb, bb) = a, b
  either = ba | bb
  se = np.where(either, sa + sb, np.sqrt(sa**2 + sb**2))
  return ma - mb, se, either


def _hard(keep: list[np.ndarray], confidence: float):
  """phi_hard [T] and its stderr (`credit.fields.hard_estimate`, per pool size); keep[T-1]
  is the finished trace's own outcome, which cannot vary."""
  T = len(keep)
  phi_hard, se = np.zeros(T), np.zeros(T)
  groups = collections.defaultdict(list)
  for t, row in enumerate(keep):
    groups[len(row)].append(t)
  for k, members in groups.items():
    R = _padded(len(members))
    success = np.zeros((R, k), bool)
    success[: len(members)] = [np.asarray(keep[t]) > SUCCESS_THRESHOLD for t in members]
    # After step t the outcome can vary, except after the last step of a finished trace.
    bounds = np.zeros((R + 1, 2), np.float32)
    bounds[1 : len(members) + 1, 1] = [t != T - 1 for t in members]
    h, s = _hard_rows(success, bounds, _rates(k, confidence))
    phi_hard[members], se[members] = np.asarray(h)[: len(members)], np.asarray(s)[: len(members)]
  return phi_hard, se


def text_step_fields(
  keep: list[np.ndarray],
  phi: list[np.ndarray],
  replace: list[np.ndarray],
  outcome: float,
  *,
  tolerance: float,
  confidence: float,
) -> dict[str, np.ndarray]:
  """The label fields of one trace (module docstring), float32 [T] each, and its scalars.

  keep, phi, replace: T rows of outcomes in [0, 1] (keep[T-1] holds the trace's own outcome:
  exact); outcome: R, the trace's own outcome.
  """
  T = len(keep)
  k_mean, k_se, k_bnd = row_stats(keep[:-1], confidence) if T > 1 else (np.zeros(0),) * 3
  keep_stats = (
    np.append(k_mean, outcome),
    np.append(k_se, 0.0),
    np.append(k_bnd, False).astype(bool),
  )
  phi_stats = row_stats(phi, confidence)
  rep_stats = row_stats(replace, confidence)
  undefined = np.array([len(r) < 2 for r in replace])
  credit, credit_se, credit_bounded = difference(keep_stats, rep_stats)
  # The noise level beside the honest stderr: the arms' sample variances add (independent).
  keep_sample = np.append(sample_stderr(keep[:-1]), 0.0)  # the last: R itself, exact
  credit_sample_se = np.sqrt(keep_sample**2 + sample_stderr(replace) ** 2)
  progress, progress_se, progress_bounded = difference(keep_stats, phi_stats)
  realized, realized_se, realized_bounded = outcome - rep_stats[0], rep_stats[1], rep_stats[2]
  credit = np.where(undefined, np.nan, credit)
  realized = np.where(undefined, np.nan, realized)
  credit_se = np.where(undefined, np.nan, credit_se)
  credit_sample_se = np.where(undefined, np.nan, credit_sample_se)
  realized_se = np.where(undefined, np.nan, realized_se)
  phi_hard, phi_hard_se = _hard(keep, confidence)
  klass = np.asarray(classify(credit, credit_se, tolerance, z_value(confidence)))
  f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
  rewards = np.zeros(T, np.float32)
  rewards[-1] = outcome
  return {
    "credit": f32(credit),
    "credit_stderr": f32(credit_se),
    "credit_realized": f32(realized),
    "credit_realized_stderr": f32(realized_se),
    "progress": f32(progress),
    "progress_stderr": f32(progress_se),
    "phi_hard": f32(phi_hard),
    "phi_hard_stderr": f32(phi_hard_se),
    "return_to_go": np.full(T, outcome, np.float32),
    "phi": f32(phi_stats[0]),
    "phi_stderr": f32(phi_stats[1]),
    "credit_sample_stderr": f32(credit_sample_se),
    "klass": np.where(undefined, UNDETERMINED, klass).astype(np.int64),
    "undefined": undefined,
    "credit_bounded": credit_bounded & ~undefined,
    "credit_realized_bounded": realized_bounded & ~undefined,
    "progress_bounded": progress_bounded,
    "rewards": rewards,
    "length": np.int32(T),
    "return": np.float32(outcome),
    "success": bool(outcome > SUCCESS_THRESHOLD),
  }
