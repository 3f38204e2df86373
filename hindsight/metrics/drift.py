"""Metrics of a credit signal against the reference credit, each with a bootstrap CI.

Every array is per step, flat [N] over the evaluated steps, with `episode` [N] the episode
each step belongs to. Confidence intervals come from `scipy.stats.bootstrap` over *episodes*
(steps of one episode are not independent): each resample draws episodes with replacement
and recomputes the statistic on all their steps; percentile intervals.

Ranking and error metrics (`point_metrics`), per signal s against the reference c:
  spearman, pearson, kendall    pooled over all steps
  mae, rmse                     mean |s - c|, sqrt(mean (s - c)^2)
  mean_gap                      mean (s - c): the bias `hindsight audit` watches
  within_spearman               mean over episodes (>= 3 steps, neither side constant) of
                                the Spearman of s and c inside the episode
  pairwise_accuracy             over ordered pairs of steps of one episode whose reference
                                differs: the share s orders the same way (a tie in s: 1/2)
Calibration of a predictive mixture p0 delta_0 + (1 - p0) N(mu, sigma^2) (`pit`): the
probability integral transform u = F(c) (randomised over the atom at 0); a central interval
of level a covers c iff |u - 1/2| <= a/2, so coverage(a) = mean(|u - 1/2| <= a/2).
Equivalent rollouts (`equivalent_rollouts`): Monte Carlo labels with K branches have error
variance ~ 1/K, so with the labels' excess MSE m_L = mean (y - c)^2 - mean se_c^2 at K_L and
the model's m_M the same way, a label of K* = K_L m_L / m_M branches errs as much as the model
(the reference's noise se_c^2 counts 0 on steps whose stderr is a tie bound: all its
branches tied, and the bound is conservative, not a noise level).
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from scipy import stats

from hindsight.metrics.credit_fit import correlation

POINT_METRICS = (
  "spearman",
  "pearson",
  "kendall",
  "mae",
  "rmse",
  "within_spearman",
  "pairwise_accuracy",
  "mean_gap",
)
COVERAGE_LEVELS = (0.5, 0.8, 0.95)
# The bootstrap resamples episodes: with one, no interval exists.
MIN_EPISODES = 2
RELIABILITY_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A statistic and its bootstrap confidence interval."""

  value: float
  lo: float
  hi: float

  def as_dict(self) -> dict:
    return {"value": self.value, "lo": self.lo, "hi": self.hi}


class EpisodeSteps:
  """Steps grouped by episode: `gather(idx)` gives the step indices of a resample of
  episodes (with repeats), in O(steps) with no Python loop over episodes."""

  def __init__(self, episode: np.ndarray):
    episode = np.asarray(episode)
    self.order = np.argsort(episode, kind="stable")
    self.ids, self.starts, self.counts = np.unique(
      episode[self.order], return_index=True, return_counts=True
    )
    self.num_episodes = int(self.ids.size)

  def gather(self, idx: np.ndarray) -> np.ndarray:
    counts = self.counts[idx]
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    within = np.arange(int(counts.sum())) - offsets
    return self.order[np.repeat(self.starts[idx], counts) + within]

  def episode_slices(self):
    """(episode position, step indices) for each episode."""
    for j in range(self.num_episodes):
      yield j, self.order[self.starts[j] : self.starts[j] + self.counts[j]]


def pairwise_counts(pred: np.ndarray, ref: np.ndarray) -> tuple[float, int]:
  """(correct, pairs) over the pairs i < j of one episode with ref_i != ref_j; a tie in
  pred counts 1/2."""
  dr = np.sign(ref[:, None] - ref[None, :])
  dp = np.sign(pred[:, None] - pred[None, :])
  upper = np.triu(np.ones(dr.shape, bool), 1) & (dr != 0)
  agree = np.where(dp == 0, 0.5, (dp == dr).astype(float))
  return float(agree[upper].sum()), int(upper.sum())


def per_episode(pred: np.ndarray, ref: np.ndarray, steps: EpisodeSteps) -> np.ndarray:
  """[E, 3]: pairwise correct, pairs, within-episode Spearman (NaN where undefined)."""
  out = np.zeros((steps.num_episodes, 3))
  for j, sel in steps.episode_slices():
    correct, pairs = pairwise_counts(pred[sel], ref[sel])
    rho = correlation(stats.spearmanr, pred[sel], ref[sel]) if sel.size >= 3 else float("nan")
    out[j] = (correct, pairs, rho)
  return out


def point_metrics(
  pred: np.ndarray, ref: np.ndarray, episodes: np.ndarray | None = None
) -> np.ndarray:
  """POINT_METRICS of one signal, a vector in that order. `episodes`: per_episode rows of
  the same steps (for the within-episode metrics; NaN without)."""
  err = pred - ref
  within, pairwise = float("nan"), float("nan")
  if episodes is not None and episodes.size:
    rho = episodes[:, 2]
    within = float(np.mean(rho[np.isfinite(rho)])) if np.isfinite(rho).any() else float("nan")
    pairs = episodes[:, 1].sum()
    pairwise = float(episodes[:, 0].sum() / pairs) if pairs else float("nan")
  return np.array(
    [
      correlation(stats.spearmanr, pred, ref),
      correlation(stats.pearsonr, pred, ref),
      correlation(stats.kendalltau, pred, ref),
      float(np.mean(np.abs(err))),
      float(np.sqrt(np.mean(np.square(err)))),
      within,
      pairwise,
      float(np.mean(err)),
    ]
  )


def bootstrap(
  num_episodes: int,
  statistic,
  n_resamples: int = 400,
  seed: int = 0,
  confidence: float = 0.95,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """statistic(idx int [E']) -> vector, over episodes resampled with replacement.

  Returns (value on all episodes, lo, hi, the bootstrap distribution [n_resamples, ...]).
  """
  idx = np.arange(num_episodes)
  value = np.asarray(statistic(idx), float)
  with warnings.catch_warnings():
    # A resample where a metric is undefined (a constant slice) gives NaN: its CI is NaN.
    warnings.simplefilter("ignore")
    res = stats.bootstrap(
      (idx,),
      lambda i: np.asarray(statistic(np.asarray(i, int)), float),
      n_resamples=n_resamples,
      vectorized=False,
      method="percentile",
      confidence_level=confidence,
      rng=np.random.default_rng(seed),
    )
  dist = np.asarray(res.bootstrap_distribution).T  # [n_resamples, ...]
  # Percentiles of the resamples where the statistic is defined (scipy's own interval is
  # NaN as soon as one resample is, e.g. a correlation of a constant slice).
  tail = 50 * (1 - confidence)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # all-NaN columns stay NaN
    lo, hi = np.nanpercentile(dist, [tail, 100 - tail], axis=0)
  return value, lo, hi, dist


def estimates(names, value, lo, hi) -> dict:
  return {
    n: Estimate(float(v), float(a), float(b))
    for n, v, a, b in zip(names, value, lo, hi, strict=True)
  }


def metric_table(
  signals: dict[str, np.ndarray],
  ref: np.ndarray,
  episode: np.ndarray,
  n_resamples: int = 400,
  seed: int = 0,
) -> dict[str, dict[str, Estimate]]:
  """{signal: {metric: Estimate}} for every signal against the reference (same steps,
  same episode resamples: the seed is shared, so rows compare pairwise)."""
  steps = EpisodeSteps(episode)
  out = {}
  for name, pred in signals.items():
    pred = np.asarray(pred, float)
    per_ep = per_episode(pred, ref, steps)

    def stat(idx, pred=pred, per_ep=per_ep):
      sel = steps.gather(idx)
      return point_metrics(pred[sel], ref[sel], per_ep[idx])

    out[name] = estimates(
      POINT_METRICS, *bootstrap(steps.num_episodes, stat, n_resamples, seed)[:3]
    )
  return out


def pit(
  y: np.ndarray,
  p0: np.ndarray,
  mu: np.ndarray,
  sigma: np.ndarray,
  seed: int = 0,
  v: np.ndarray | None = None,
) -> np.ndarray:
  """u = F(y) of the mixture p0 delta_0 + (1 - p0) N(mu, sigma^2), randomised uniformly
  between F(y-) and F(y) where y sits on the atom (y == 0): u = F(y-) + v (F(y) - F(y-)),
  v ~ U(0, 1) drawn from `seed` unless given (same shape as y)."""
  cont = (1.0 - p0) * stats.norm.cdf((y - mu) / np.maximum(sigma, 1e-12))
  below = cont + p0 * (y > 0)
  at = cont + p0 * (y >= 0)
  if v is None:
    v = np.random.default_rng(seed).random(np.shape(y))
  return below + v * (at - below)


def coverage(u: np.ndarray, levels=COVERAGE_LEVELS) -> np.ndarray:
  """Share of steps inside the central interval of each level, given their PIT values."""
  return np.array([float(np.mean(np.abs(u - 0.5) <= level / 2)) for level in levels])


def equivalent_rollouts(
  model_err2: np.ndarray, label_err2: np.ndarray, ref_var: np.ndarray, label_rollouts: int
) -> float:
  """K* = K_L (mean e_L^2 - mean se_c^2) / (mean e_M^2 - mean se_c^2) (module docstring);
  NaN when the labels' excess error is <= 0 (exact labels: no Monte Carlo noise level to
  scale by; `k_star_undefined` says why), else inf when the model's is."""
  noise = float(np.mean(ref_var))
  m_label = float(np.mean(label_err2)) - noise
  m_model = float(np.mean(model_err2)) - noise
  if m_label <= 0:
    return float("nan")
  if m_model <= 0:
    return float("inf")
  return label_rollouts * m_label / m_model


def k_star_undefined(
  model_err2: np.ndarray, label_err2: np.ndarray, ref_var: np.ndarray
) -> str | None:
  """Why K* (`equivalent_rollouts`) has no finite value on these steps, or None."""
  noise = float(np.mean(ref_var))
  if float(np.mean(label_err2)) - noise <= 0:
    return (
      "the training labels' error does not exceed the reference's noise (exact labels): "
      "there is no Monte Carlo noise level to compare the model with"
    )
  if float(np.mean(model_err2)) - noise <= 0:
    return "the model's error is within the reference's noise: any K would be as good"
  return None


def confusion(pred_klass: np.ndarray, ref_klass: np.ndarray, num_classes: int) -> np.ndarray:
  """int [C, C]: rows the reference class, columns the predicted one."""
  m = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(m, (ref_klass.astype(int), pred_klass.astype(int)), 1)
  return m


def top_k_recall(pred: np.ndarray, ref: np.ndarray, episode: np.ndarray, k: int = 3) -> float:
  """Mean over episodes of more than k steps of |top-k(|pred|) & top-k(|ref|)| / k, the
  top k of each by |credit| within the episode (thought-anchors' frugal variant reports
  97.7% of this); flat steps with `episode` [N] their episode ids. NaN without such an
  episode."""
  hits = []
  for e in np.unique(episode):
    sel = episode == e
    p, r = np.abs(pred[sel]), np.abs(ref[sel])
    if r.size <= k:
      continue
    top_p = set(np.argsort(-p, kind="stable")[:k].tolist())
    top_r = set(np.argsort(-r, kind="stable")[:k].tolist())
    hits.append(len(top_p & top_r) / k)
  return float(np.mean(hits)) if hits else float("nan")
