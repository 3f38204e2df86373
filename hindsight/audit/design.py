"""Which steps the audit checks: a defensive mixture design with importance weights.

The pool is every valid step i = 1..N of the audited trajectories. Draws are i.i.d. from

  p_i = u / N  +  s * unc_i / sum(unc)  +  d * dis_i / sum(dis),     u + s + d = 1

uniform (u), the model's own uncertainty unc_i (its predictive std), and its disagreement
with a cheap progress signal dis_i = |credit_i - outcome_i| (outcome_i = the episode's return,
centred on the pool's mean and spread evenly over its steps: what an outcome-only method
would credit). The uniform share keeps every step reachable and every weight
w_i = 1 / (N p_i) <= 1 / u bounded (Owen & Zhou 2000, "safe and effective importance
sampling"), which is what the confidence sequences need: E_p[w_i g_i] = (1/N) sum_i g_i, so
the weighted gap of every draw is an unbiased term for the pool's mean gap (Hansen-Hurwitz).
A score that is 0 everywhere gives its share to the uniform part.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from hindsight.errors import HindsightError


@dataclasses.dataclass(frozen=True)
class Design:
  """Draw probabilities p [N] over the pool's steps and what they were made of."""

  probs: np.ndarray
  shares: tuple[float, float, float]  # (uniform, uncertainty, disagreement) as used

  @property
  def weights(self) -> np.ndarray:
    """w_i = 1 / (N p_i): E_p[w g] is the pool's plain mean of g."""
    return 1.0 / (self.probs.size * self.probs)

  @property
  def max_weight(self) -> float:
    return float(self.weights.max())

  def draw(self, key: jax.Array, block: int, size: int) -> np.ndarray:
    """Pool indices of draws block*size .. (block+1)*size - 1 (i.i.d. with replacement).

    Draw j's index depends on (key, j // size) only: any number of blocks, in any order,
    gives the same sequence."""
    k = jax.random.fold_in(key, block)
    return np.asarray(jax.random.choice(k, self.probs.size, (size,), p=self.probs))


def check_shares(shares) -> tuple[float, float, float]:
  """(u, s, d) as floats, or a one-line error: three shares >= 0 summing to 1, u > 0 (the
  uniform part bounds every weight by 1 / u)."""
  u, s, d = (float(x) for x in shares)
  if min(u, s, d) < 0 or not np.isclose(u + s + d, 1.0) or u <= 0:
    raise HindsightError(
      f"--shares must be three numbers >= 0 summing to 1 with uniform > 0, got {shares}"
    )
  return u, s, d


def mixture_design(
  uncertainty: np.ndarray, disagreement: np.ndarray, shares=(0.5, 0.25, 0.25)
) -> Design:
  """The design of the module docstring for scores [N] (>= 0)."""
  u, s, d = check_shares(shares)
  n = uncertainty.size
  if n == 0:
    raise HindsightError("the audited trajectories hold no step to check")
  used = [u, 0.0, 0.0]
  probs = np.full(n, u / n)
  for j, (share, score) in enumerate(((s, uncertainty), (d, disagreement)), start=1):
    score = np.nan_to_num(np.maximum(np.asarray(score, np.float64), 0.0))
    total = score.sum()
    if total > 0:
      probs += share * score / total
      used[j] = share
    else:  # no signal: its share goes to the uniform part
      probs += share / n
      used[0] += share
  return Design(probs=probs / probs.sum(), shares=tuple(used))


def outcome_signal(returns: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """Per episode [E]: (R_e - mean R) / T_e, the outcome spread evenly over its steps."""
  return (returns - returns.mean()) / np.maximum(lengths, 1)
