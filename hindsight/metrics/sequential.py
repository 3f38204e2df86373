"""Anytime-valid confidence sequences: the audit's alarm and RL's drift tests, read at every step.

A confidence sequence (CS) for a mean mu is a sequence of intervals C_1, C_2, ... with
P(mu in C_t for every t) >= 1 - alpha: unlike a fixed-n interval it stays valid however long
the audit runs and whenever it is read, so an alarm "C_t has left the tolerance band" fires
falsely with probability at most alpha over the whole (unbounded) audit.

`eb_confidence_sequence` is the predictable plug-in empirical-Bernstein CS of Waudby-Smith &
Ramdas (2024, "Estimating means of bounded random variables by betting", JRSS-B, Thm. 2)
for i.i.d. X_i in a known range [lo, hi]. With y_i = (X_i - lo) / (hi - lo) in [0, 1]:

  mu_t      = (1/2 + sum_{i<=t} y_i) / (t + 1)            sigma2_t = (1/4 + sum_{i<=t}
                                                                    (y_i - mu_i)^2) / (t + 1)
  lambda_t  = min(sqrt(2 log(2/alpha) / (sigma2_{t-1} t log(1 + t))), c)     (predictable)
  v_t       = 4 (y_t - mu_{t-1})^2,   psi(l) = (-log(1 - l) - l) / 4
  C_t       = sum lambda_i y_i / sum lambda_i  +-  (log(2/alpha) + sum v_i psi(lambda_i))
                                                   / sum lambda_i

mapped back to [lo, hi] and intersected over time (the running intersection of a CS is a
CS). Its width adapts to the variance but cannot beat (hi - lo) log(2/alpha) / (c t): a
bounded-range guarantee has to allow one future draw anywhere in the range, so a tight
range (the audit takes it from the pool's own predictions and return bounds) buys speed.

`asymptotic_confidence_sequence` needs no range: the Gaussian-mixture sequence of
Waudby-Smith et al. (2024), whose width follows the draws' sample standard deviation, valid
as their central limit takes hold. Where the only range known is far wider than the draws
spread (RL's gaps, bounded by the return range), it resolves moves a bounded sequence
cannot; `slice_sequences` builds either (`BOUNDARIES`).

`drift_alarm` watches two CSs at once, alpha/2 each (a union bound keeps the total at alpha):
  gap       the mean of g = prediction - rollout credit, two-sided: fires when the CS lies
            entirely outside [-tolerance, +tolerance];
  coverage  the share of rollout credits inside the model's central `level` interval,
            one-sided: fires when the CS lies entirely below level - coverage_tolerance
            (intervals that are too wide are wasteful, not dangerous).
Given slices (the audit's tags), a third family, and alpha/3 for each of the three:
  slices    per slice j (share p_j of the pool, known), the mean gap over the slice's own
            steps, from terms x = w g 1[step in j] / p_j (E x = the slice's mean gap), a
            two-sided CS at alpha / (3 m) for each of the m slices: fires when any slice's
            CS lies outside [-tolerance, +tolerance]. A signed mean over all steps lets
            opposite drifts cancel (one tag over-credited, another under); a slice cannot.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import special

from hindsight.errors import HindsightError

# The two kinds of sequence `slice_sequences` builds: "bounded" (`eb_confidence_sequence`:
# exact for draws in a known range, whatever their distribution) and "asymptotic"
# (`asymptotic_confidence_sequence`: no range, valid as the draws' CLT takes hold).
BOUNDARIES = ("bounded", "asymptotic")


def eb_confidence_sequence(
  x: np.ndarray, lo: float, hi: float, alpha: float, c: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
  """(lower [n], upper [n]): the running-intersection CS of the mean after each of x [n].

  x: i.i.d. draws in [lo, hi] (checked); alpha: the CS misses the mean at any time with
  probability <= alpha (each side alpha/2); c in (0, 1): the cap on the bet lambda_t.
  """
  x = np.asarray(x, np.float64)
  if not hi > lo:
    raise ValueError(f"the range [{lo}, {hi}] is empty")
  if x.size and (x.min() < lo - 1e-9 * (hi - lo) or x.max() > hi + 1e-9 * (hi - lo)):
    raise ValueError(f"a draw lies outside the stated range [{lo}, {hi}]")
  n = x.size
  if n == 0:
    return np.zeros(0), np.zeros(0)
  y = np.clip((x - lo) / (hi - lo), 0.0, 1.0)
  t = np.arange(1, n + 1, dtype=np.float64)
  mu = (0.5 + np.cumsum(y)) / (t + 1)  # mu_t, t = 1..n
  mu_prev = np.concatenate([[0.5], mu[:-1]])  # mu_{t-1}
  sigma2 = (0.25 + np.cumsum(np.square(y - mu))) / (t + 1)
  sigma2_prev = np.concatenate([[0.25], sigma2[:-1]])
  log_term = np.log(2.0 / alpha)
  lam = np.minimum(np.sqrt(2.0 * log_term / (sigma2_prev * t * np.log1p(t))), c)
  v = 4.0 * np.square(y - mu_prev)
  psi = (-np.log1p(-lam) - lam) / 4.0
  lam_sum = np.cumsum(lam)
  centre = np.cumsum(lam * y) / lam_sum
  margin = (log_term + np.cumsum(v * psi)) / lam_sum
  lower = np.maximum.accumulate(np.clip(centre - margin, 0.0, 1.0))
  upper = np.minimum.accumulate(np.clip(centre + margin, 0.0, 1.0))
  return lo + (hi - lo) * lower, lo + (hi - lo) * upper


def best_rho2(t_opt: float, alpha: float) -> float:
  """The mixture's rho^2 that minimises the margin of `asymptotic_confidence_sequence` at
  t_opt: with u = t_opt rho^2 the margin^2 is proportional to (u + 1) / u log((u + 1) /
  alpha^2), stationary where log((u + 1) / alpha^2) = u, i.e. u = -W_{-1}(-alpha^2 / e) - 1
  (W_{-1} the lower branch of Lambert's W)."""
  u = -float(np.real(special.lambertw(-(alpha**2) / np.e, k=-1))) - 1.0
  return u / float(t_opt)


def asymptotic_confidence_sequence(
  x: np.ndarray, alpha: float, t_opt: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """(lower [n], upper [n]): the Gaussian-mixture asymptotic CS of the mean after each of
  x [n] (Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas 2024, "Time-uniform central limit
  theory and asymptotic confidence sequences", Ann. Statist., Thm. 2.2):

    C_t = mean_t +- sd_t sqrt(2 (t rho^2 + 1) / (t^2 rho^2) log(sqrt(t rho^2 + 1) / alpha))

  sd_t the sample standard deviation (ddof 1; t = 1 gives the whole line), rho^2 =
  `best_rho2(t_opt, alpha)`, tightest at t_opt (default n, the time it is read). It needs no
  range: its coverage at every time together tends to 1 - alpha as the draws' central limit
  takes hold: the time-uniform counterpart of a z-interval, at t_opt 1.55 times as wide at
  alpha 0.05 (3.04 sd / sqrt(t) against 1.96) and 1.28 times at 0.001, and as blind to
  dependence between draws.
  """
  x = np.asarray(x, np.float64)
  n = x.size
  if n == 0:
    return np.zeros(0), np.zeros(0)
  t = np.arange(1, n + 1, dtype=np.float64)
  mean = np.cumsum(x) / t
  # Running variance about the running mean (shifted by x[0] against cancellation).
  d = x - x[0]
  ss = np.cumsum(np.square(d)) - t * np.square(np.cumsum(d) / t)
  with np.errstate(divide="ignore", invalid="ignore"):
    sd = np.where(t > 1, np.sqrt(np.maximum(ss, 0.0) / (t - 1)), np.inf)
  rho2 = best_rho2(t_opt or n, alpha)
  margin = sd * np.sqrt(
    2.0 * (t * rho2 + 1.0) / (t**2 * rho2) * np.log(np.sqrt(t * rho2 + 1.0) / alpha)
  )
  return mean - margin, mean + margin


@dataclasses.dataclass(frozen=True)
class AlarmConfig:
  """When the audit calls a model drifted (CLI: --gap-tolerance, --alpha, --coverage-*)."""

  gap_tolerance: float  # |mean gap| beyond this is drift (label units)
  alpha: float = 0.05  # false-alarm probability over the whole audit, however long
  level: float = 0.9  # the model's central predictive interval that is checked
  coverage_tolerance: float = 0.1  # coverage below level - this is drift

  def check(self) -> None:
    if not (np.isfinite(self.gap_tolerance) and self.gap_tolerance > 0):
      raise HindsightError(f"gap_tolerance must be > 0, got {self.gap_tolerance}")
    if not 0 < self.alpha < 1:
      raise HindsightError(f"alpha must be in (0, 1), got {self.alpha}")
    if not 0 < self.level < 1:
      raise HindsightError(f"coverage_level must be in (0, 1), got {self.level}")
    if not 0 < self.coverage_tolerance < self.level:
      raise HindsightError(
        f"coverage_tolerance must be in (0, {self.level}), got {self.coverage_tolerance}"
      )


@dataclasses.dataclass(frozen=True)
class SliceTerms:
  """The slices' unbiased terms: names [m], terms [m, n] (x of the module docstring) and
  the range [m, 2] every term of slice j can take over the pool."""

  names: tuple[str, ...]
  terms: np.ndarray
  ranges: np.ndarray


@dataclasses.dataclass(frozen=True)
class AlarmTrace:
  """The alarm after every audited draw (arrays [n]) and when it first fired."""

  gap_lower: np.ndarray
  gap_upper: np.ndarray
  coverage_upper: np.ndarray
  gap_fired: np.ndarray  # bool
  coverage_fired: np.ndarray  # bool
  first: int | None  # index of the first draw after which the alarm is on (None: never)
  reason: str  # "gap", "coverage", "slice NAME", joined by " and ", or "" (never fired)
  slice_fired: np.ndarray | None = None  # bool [n]: some slice's CS is outside the band
  slice_lower: np.ndarray | None = None  # [m, n]
  slice_upper: np.ndarray | None = None  # [m, n]
  slice_names: tuple[str, ...] = ()

  def final_slice_bounds(self) -> dict[str, tuple[float, float]]:
    """{tag: (lo, hi)}: each slice's confidence sequence after the last draw ({} without
    slices or draws)."""
    if not self.slice_names or self.slice_lower is None or not self.slice_lower.shape[1]:
      return {}
    return {
      name: (float(self.slice_lower[j, -1]), float(self.slice_upper[j, -1]))
      for j, name in enumerate(self.slice_names)
    }


def drift_alarm(
  gap_terms: np.ndarray,
  cover_terms: np.ndarray,
  gap_range: tuple[float, float],
  cover_range: tuple[float, float],
  cfg: AlarmConfig,
  slices: SliceTerms | None = None,
) -> AlarmTrace:
  """The alarm over draws whose unbiased terms are given (the audit's importance-weighted
  gaps and coverage indicators; each term's mean is the pool's mean gap / coverage).

  Fires after draw t when the gap CS is outside [-tol, tol], or the coverage CS's upper
  end is below level - coverage_tolerance, or (with `slices`) some slice's CS is outside
  [-tol, tol]: alpha/2 for each of the first two, alpha/3 for each of the three families
  with slices.
  """
  share = cfg.alpha / (3 if slices is not None and len(slices.names) else 2)
  g_lo, g_hi = eb_confidence_sequence(gap_terms, *gap_range, alpha=share)
  # A two-sided CS at 2 share has share on each side: its upper end alone is a one-sided
  # bound at `share`.
  _, c_hi = eb_confidence_sequence(cover_terms, *cover_range, alpha=2 * share)
  c_hi = np.minimum(c_hi, 1.0)  # a coverage (the terms' range reaches past 1 by the weights)
  gap_fired = (g_lo > cfg.gap_tolerance) | (g_hi < -cfg.gap_tolerance)
  cov_fired = c_hi < cfg.level - cfg.coverage_tolerance
  either = gap_fired | cov_fired
  s_lo = s_hi = s_fired = None
  names: tuple[str, ...] = ()
  if slices is not None and len(slices.names):
    names = tuple(slices.names)
    m = len(names)
    bounds = [
      eb_confidence_sequence(x, float(lo), float(hi), alpha=share / m)
      for x, (lo, hi) in zip(slices.terms, slices.ranges, strict=True)
    ]
    s_lo = np.array([b[0] for b in bounds]).reshape(m, -1)
    s_hi = np.array([b[1] for b in bounds]).reshape(m, -1)
    per_slice = (s_lo > cfg.gap_tolerance) | (s_hi < -cfg.gap_tolerance)  # [m, n]
    s_fired = per_slice.any(0)
    either = either | s_fired
  first = int(np.argmax(either)) if either.any() else None
  reason = ""
  if first is not None:
    parts = [n for n, f in (("gap", gap_fired), ("coverage", cov_fired)) if f[first]]
    if s_fired is not None and s_fired[first]:
      parts += [f"slice {names[j]}" for j in np.flatnonzero(per_slice[:, first])]
    reason = " and ".join(parts)
  return AlarmTrace(
    g_lo, g_hi, c_hi, gap_fired, cov_fired, first, reason, s_fired, s_lo, s_hi, names
  )


def spent_alpha(alpha: float, index: int) -> float:
  """The error budget of the index-th (0, 1, 2, ...) of a run's repeated tests: alpha /
  ((index + 1) (index + 2)), which sums to alpha over any number of them. Tests that each
  hold their share hold together with probability >= 1 - alpha, however long the run: the
  union bound over an unbounded sequence of reads (RL's evaluation points, `rl.refresh`)."""
  return alpha / ((index + 1) * (index + 2))


@dataclasses.dataclass(frozen=True)
class SliceBounds:
  """Each slice's confidence sequence of its mean after its last draw: names [m], lower,
  upper, mean and count [m] (`slice_sequences`)."""

  names: tuple[str, ...]
  lower: np.ndarray
  upper: np.ndarray
  mean: np.ndarray
  count: np.ndarray

  def as_dict(self) -> dict[str, list]:
    """{name: [mean, lower, upper, count]} (plain floats, for a run's history)."""
    return {
      n: [float(self.mean[j]), float(self.lower[j]), float(self.upper[j]), int(self.count[j])]
      for j, n in enumerate(self.names)
    }

  @classmethod
  def from_dict(cls, d: dict[str, list]) -> SliceBounds:
    names = tuple(d)
    col = lambda i: np.array([d[n][i] for n in names], np.float64)  # noqa: E731
    return cls(names, col(1), col(2), col(0), col(3).astype(np.int64))


def slice_sequences(
  x: np.ndarray,
  slices: np.ndarray,
  names,
  ranges: np.ndarray | None,
  alpha: float,
  min_draws: int = 2,
  boundary: str = "bounded",
) -> SliceBounds:
  """The confidence sequence of the mean of each slice's own draws, in the order given: x
  [n] the draws, slices int [n] their slice, alpha the budget of the whole family, alpha / m
  for each slice (a union bound), so every slice's sequence holds at every time together
  with probability >= 1 - alpha. boundary "bounded": the empirical-Bernstein sequence
  (`eb_confidence_sequence`) in ranges [m, 2], the range every draw of slice j can take
  (known before the draws); "asymptotic": the Gaussian-mixture sequence
  (`asymptotic_confidence_sequence`, tightest at the slice's own count; ranges unread).
  Slices with fewer than `min_draws` draws are left out."""
  if boundary not in BOUNDARIES:
    raise ValueError(f"boundary {boundary!r} is none of {BOUNDARIES}")
  x, slices = np.asarray(x, np.float64), np.asarray(slices)
  keep = [j for j in range(len(names)) if np.sum(slices == j) >= min_draws]
  m = max(len(keep), 1)
  lower, upper, mean, count = [], [], [], []
  for j in keep:
    xs = x[slices == j]
    if boundary == "asymptotic":
      cs_lo, cs_hi = asymptotic_confidence_sequence(xs, alpha / m)
    else:
      lo, hi = float(ranges[j][0]), float(ranges[j][1])
      if not hi > lo:
        hi = lo + 1e-9
      cs_lo, cs_hi = eb_confidence_sequence(xs, lo, hi, alpha / m)
    lower.append(cs_lo[-1])
    upper.append(cs_hi[-1])
    mean.append(xs.mean())
    count.append(xs.size)
  return SliceBounds(
    tuple(str(names[j]) for j in keep),
    np.asarray(lower, np.float64),
    np.asarray(upper, np.float64),
    np.asarray(mean, np.float64),
    np.asarray(count, np.int64),
  )
