"""Monte Carlo reductions and the load-bearing / decorative / harmful decision.

All functions act on one step's K branch returns ([K] arrays) and are vmapped outside.
"""

from __future__ import annotations

import jax.numpy as jnp
from scipy import stats

KLASS_NAMES = ("decorative", "load_bearing", "harmful", "undetermined")
DECORATIVE, LOAD_BEARING, HARMFUL, UNDETERMINED = range(4)


def mean_stderr(x):
  """(mean, standard error) over the last axis: x [..., K] -> ([...], [...]).

  stderr = std(x, ddof=1) / sqrt(K), the textbook standard error of a sample mean of K
  independent draws (branches are independent given the step; pairing is done by the caller
  passing differences).
  """
  k = x.shape[-1]
  return x.mean(-1), x.std(-1, ddof=1) / jnp.sqrt(k)


def z_value(confidence: float) -> float:
  """Two-sided normal quantile, e.g. 1.96 for confidence 0.95."""
  return float(stats.norm.ppf(0.5 + confidence / 2.0))


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
