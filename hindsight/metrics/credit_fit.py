"""How well predicted credit matches labeled credit, over the steps of held-out episodes.

Inputs are flat per-step arrays [N] over valid steps with a finite label. The headline
Spearman / Pearson / MAE / RMSE score the point prediction (the model's median, which is exactly 0
where it expects an exact tie); `spearman_mu` scores its continuous part's mean mu instead. Besides
them it reports what bounds them:
  label_reliability = 1 - mean(e_t^2) / var(y_t): the share of the labels' variance that is
    signal rather than Monte Carlo noise; a perfect predictor's Pearson is about its root.
  z_rms = sqrt(mean((y - mu)^2 / (s^2 + e^2))): 1 when the predicted spread is honest.
  exact_zero_share: labels exactly 0 (every branch pair tied, or a step that cannot differ:
    ties no continuous prediction can match; the exact-zero head learns them).
  progress_spearman: the same ranking test for P(success | history) ("looks good"), the
    process-reward baseline the model should beat.
  constant_mae: the MAE of the best constant prediction (the labels' median), the floor any
    model that learned something beats.
A correlation is NaN where the predictions (or labels) are constant: there is no ranking.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def correlation(fn, x, y) -> float:
  """fn(x, y).statistic (scipy.stats spearmanr or pearsonr); NaN when either is constant."""
  if x.size < 2 or np.std(x) == 0 or np.std(y) == 0:
    return float("nan")
  return float(fn(x, y).statistic)


def prediction_metrics(
  pred: np.ndarray,
  pred_mu: np.ndarray,
  pred_var: np.ndarray,
  label: np.ndarray,
  stderr: np.ndarray,
  progress: np.ndarray,
) -> dict:
  """The metrics of the module docstring, as a flat dict of floats."""
  total_var = pred_var + np.square(stderr)
  z = (label - pred_mu) / np.sqrt(np.maximum(total_var, 1e-12))
  var_y = float(np.var(label))
  return {
    "steps": int(label.size),
    "spearman": correlation(stats.spearmanr, pred, label),
    "pearson": correlation(stats.pearsonr, pred, label),
    "mae": float(np.mean(np.abs(pred - label))),
    "constant_mae": float(np.mean(np.abs(label - np.median(label)))),
    "rmse": float(np.sqrt(np.mean(np.square(pred - label)))),
    "spearman_mu": correlation(stats.spearmanr, pred_mu, label),
    "exact_zero_share": float(np.mean(label == 0)),
    "z_rms": float(np.sqrt(np.mean(np.square(z)))),
    "coverage_95": float(np.mean(np.abs(z) < stats.norm.ppf(0.975))),
    "label_reliability": float(1.0 - np.mean(np.square(stderr)) / var_y) if var_y > 0 else 0.0,
    "progress_spearman": correlation(stats.spearmanr, progress, label),
  }


def per_tag(tags: np.ndarray, pred: np.ndarray, label: np.ndarray) -> dict:
  """{tag: {steps, label, predicted}}: mean labeled and predicted credit per step tag."""
  out = {}
  for tag in sorted(set(tags.tolist())):
    sel = tags == tag
    out[tag] = {
      "steps": int(sel.sum()),
      "label": float(label[sel].mean()),
      "predicted": float(pred[sel].mean()),
    }
  return out
