"""Monte Carlo reductions and the load-bearing / decorative / harmful decision.

All functions act on one step's K branch returns ([K] arrays) and are vmapped outside.

A standard error of 0 means exact, nowhere else (`bounded_mean_stderr`). With common random
numbers most paired differences of a step are often exactly equal (both arms end alike), and
when the event that separates them is rare all K samples can tie: their sample standard
error is then 0 although the mean is not known exactly, and with one or two samples off the
tie it understates the spread. For such nearly-tied samples the stderr is raised to a
conservative bound built from the range the samples can take:

  m    = K - (size of the largest group of equal samples, at the value c)
  p+   = Clopper-Pearson upper bound, one-sided at `confidence`, on p = P(x != c) after
         m of K samples off c: p+ = Beta^{-1}(confidence; m + 1, K - m)  (3/K for m = 0,
         the rule of three)
  |E x - c| = |E[(x - c) 1{x != c}]| <= p * max(hi - c, c - lo)   for x in [lo, hi]
  stderr = max(sample stderr, p+ * max(hi - c, c - lo) / z)      if m < MIN_OFF_TIE

so the interval mean +- z stderr covers E x whenever p <= p+. With MIN_OFF_TIE or more
samples off the tie the sample stderr is used as it is: on the stress MDPs of
`eval/label_honesty.py` its z-scores against the DP then have RMS 0.87-1.11 at K = 16-128
(with 4 the realized credit's reached 1.8 on a few steps, with 10 most steps at K = 16 fell
under the bound). An unknown range (lo, hi infinite) makes a tied estimate's stderr
infinite.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

DECORATIVE, LOAD_BEARING, HARMFUL, UNDETERMINED = range(4)


def mean_stderr(x, axis: int = -1):
  """(mean, standard error) over `axis` (the last by default): x [..., K] -> ([...], [...]).

  stderr = std(x, ddof=1) / sqrt(K), the textbook standard error of a sample mean of K
  independent draws (branches are independent given the step; pairing is done by the caller
  passing differences).
  """
  k = x.shape[axis]
  return x.mean(axis), x.std(axis, ddof=1) / jnp.sqrt(k)


# Samples off the largest tie needed before the sample standard error is trusted as it is.
MIN_OFF_TIE = 5


def tie_upper_rates(num_samples: int, confidence: float) -> np.ndarray:
  """p+ for m = 0 .. MIN_OFF_TIE - 1 samples off the tie out of K, float32 [MIN_OFF_TIE].

  The one-sided Clopper-Pearson bound Beta^{-1}(confidence; m + 1, K - m) on the chance of a
  sample off the tie (1 where m >= K, which cannot be bounded).
  """
  # scipy.special, not scipy.stats (the same functions): the labeler starts 0.2 s sooner.
  from scipy import special

  m = np.arange(MIN_OFF_TIE)
  inside = m < num_samples
  # The beta quantile (scipy.stats.beta.ppf).
  upper = special.betaincinv(m + 1, np.maximum(num_samples - m, 1), confidence)
  return np.where(inside, upper, 1.0).astype(np.float32)


def largest_tie(x):
  """(count, value) of the largest group of equal samples of x [K] -> ([] int32, []), exact
  whenever that group leaves fewer than MIN_OFF_TIE samples off it (the only case the tie
  bound uses); otherwise a count that also leaves MIN_OFF_TIE or more off.

  Such a group holds more than K - MIN_OFF_TIE samples, so it holds one of the first
  MIN_OFF_TIE: counting the matches of just those candidates (MIN_OFF_TIE x K comparisons)
  finds it without sorting, which made this reduction as slow as the rollouts it reduces.
  """
  candidates = x[: min(MIN_OFF_TIE, x.shape[-1])]
  counts = (candidates[:, None] == x[None, :]).sum(-1).astype(jnp.int32)
  best = jnp.argmax(counts)
  return counts[best], candidates[best]


def bounded_mean_stderr(x, lo, hi, upper_rates, z: float):
  """(mean, stderr, bounded) of x [K] drawn from [lo, hi] (scalars): no false certainty.

  The sample mean and standard error, with the stderr raised to the tie bound of the module
  docstring when fewer than MIN_OFF_TIE samples differ from the largest tie (`bounded`: bool,
  the bound was the larger). upper_rates: `tie_upper_rates(K, confidence)`; z: the normal
  quantile of the same confidence, so that mean +- z stderr is the conservative interval. A
  stderr of 0 is returned only where x cannot vary at all (lo == hi, or c at both ends).
  """
  k = x.shape[-1]
  mean, se = mean_stderr(x)
  tied, c = largest_tie(x)
  off = k - tied
  reach = jnp.maximum(hi - c, c - lo)
  bound = upper_rates[jnp.minimum(off, MIN_OFF_TIE - 1)] * reach / z
  # inf * 0 (an unknown range that cannot matter) stays 0 rather than NaN.
  bound = jnp.where(reach > 0, bound, 0.0)
  bounded = (off < MIN_OFF_TIE) & (bound > se)
  return mean, jnp.where(bounded, bound, se), bounded


def z_value(confidence: float) -> float:
  """Two-sided normal quantile, e.g. 1.96 for confidence 0.95 (scipy.stats.norm.ppf)."""
  from scipy import special

  return float(special.ndtri(0.5 + confidence / 2.0))


def classify(credit, stderr, tolerance: float, z: float):
  """klass per step from the confidence interval [credit - z se, credit + z se].

  load_bearing  the interval lies above +tolerance
  harmful       the interval lies below -tolerance
  decorative    the interval lies inside [-tolerance, +tolerance] (an equivalence test: the
                step is shown to matter less than `tolerance`, not merely not shown to matter)
  undetermined  anything else (the interval is too wide to say), and NaN credit

  A bare threshold would call a noisy step decorative because its estimate happened to be
  small; this only says "decorative" when the data rule out a larger effect.
  """
  lo = credit - z * stderr
  hi = credit + z * stderr
  klass = jnp.full(jnp.shape(credit), UNDETERMINED, jnp.int32)
  klass = jnp.where((lo >= -tolerance) & (hi <= tolerance), DECORATIVE, klass)
  klass = jnp.where(lo > tolerance, LOAD_BEARING, klass)
  klass = jnp.where(hi < -tolerance, HARMFUL, klass)
  return jnp.where(jnp.isnan(credit), UNDETERMINED, klass)
