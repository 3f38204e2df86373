"""Post-hoc calibration of the credit model's predicted spread, fitted on the validation split.

The model is trained with the beta-NLL (`model.loss`), whose weights trade calibrated
variances for fitted means; measured against the reference its intervals came out too narrow
(the demo's 95% intervals covered 0.909 of the true credits uncalibrated). One scalar fixes
it: a scale tau on the continuous part's standard deviation, fitted to the validation labels
with the label's own noise e_t added (so tau calibrates s_t against the *true* credit, not the
noisy label: the deconvolution the training loss makes), by two estimators:

  tau_ml   = argmax_tau sum_t log N(y_t; mu_t, tau^2 s_t^2 + e_t^2)          (the variance)
  tau_cov : mean_t 1[ |y_t - mu_t| <= z sqrt(tau^2 s_t^2 + e_t^2) ] = LEVEL  (the 95% quantile)

and tau = max(tau_ml, tau_cov). Each is biased low in a known way, so the larger is kept:
where the model's errors against the truth are not Gaussian with the shape of its predicted
spread (large errors where it predicts a small s_t), matching the variance leaves the 95%
interval short (demo: the likelihood scale, 1.13, covered 0.924 of the reference; the
coverage scale, 1.36, 0.944); where the labels' noise dwarfs the model's spread, their
coverage hardly depends on tau and the noisy stderrs drag tau_cov down (key corridor, K=64:
tau_cov 0.78 covered 0.886 of the DP; tau_ml 1.02 covers 0.937).

Both use the validation steps whose label is not exactly 0 (those belong to the atom at 0)
and whose stderr is a sample stderr: a nearly tied label carries the conservative tie bound
as its e_t, no noise level (such an interval covers its label whatever tau is).

Under the loss's `sample_noise` (text and agent labels: every one tie-bounded at small K) e_t
is each label's plain sample stderr, whose square is unbiased for the label's noise variance
but itself noisy (for Gaussian outcomes at K = 8 a chi-square with 7 degrees of freedom; 0/1
outcomes spread more, and are often exactly 0). Both estimators above read e_t step by step
and are pulled up by that noise (a synthetic check: tau_ml 1.78 where the truth is 1), so
the scale is matched in the mean instead, where the noise of e_t^2 averages out:

  tau_mm^2 = (mean_t (y_t - mu_t)^2 - mean_t e_t^2) / mean_t s_t^2          (`moment_sigma_scale`)

over the same steps, none left out for a tie (each e_t is a noise level), but the steps of
labels written before `credit_sample_stderr` existed whose stderr is a tie bound (their
batches fall back to it; counted as noise it would drive tau to its floor). Written into
the directory of the checkpoint step it was fitted for (`calibration.json`, covered by the
step's manifest), so a copied step keeps it; `Predictor.load` applies it (sigma, std) and
reports it.
"""

from __future__ import annotations

import json
import os

import numpy as np
from scipy import optimize, stats

from hindsight.errors import HindsightError

CALIBRATION_FILE = "calibration.json"
MIN_STEPS = 20  # fewer validation steps than this: no fit (tau = 1)
LEVEL = 0.95  # the central interval whose coverage tau matches
TAU_RANGE = (0.1, 10.0)
# The moment scale's range: a model trained on noisy labels may state a spread 10x too small.
MOMENT_TAU_RANGE = (0.01, 1000.0)


def fit_sigma_scale(mu, sigma, y, stderr, level: float = LEVEL, bounded=None) -> float:
  """tau = max(tau_ml, tau_cov) of the module docstring from validation columns [N] (finite
  labels); `bounded` [N] bool marks labels whose stderr is a tie bound (left out)."""
  mu, sigma, y, stderr = (np.asarray(a, np.float64) for a in (mu, sigma, y, stderr))
  use = np.isfinite(y) & np.isfinite(stderr) & (y != 0)
  if bounded is not None:
    use &= ~np.asarray(bounded, bool)
  if use.sum() < MIN_STEPS:
    return 1.0
  mu, sigma, y, stderr = mu[use], sigma[use], y[use], stderr[use]
  lo, hi = TAU_RANGE

  def nll(log_tau):
    scale = np.sqrt(np.exp(2 * log_tau) * sigma**2 + stderr**2)
    return -np.mean(stats.norm.logpdf(y, mu, np.maximum(scale, 1e-12)))

  tau_ml = float(
    np.exp(optimize.minimize_scalar(nll, bounds=np.log(TAU_RANGE), method="bounded").x)
  )
  residual, z = np.abs(y - mu), stats.norm.ppf(0.5 + level / 2)

  def excess(tau):  # coverage at tau minus the level: increasing in tau
    return np.mean(residual <= z * np.sqrt((tau * sigma) ** 2 + stderr**2)) - level

  if excess(lo) >= 0:  # the labels' noise alone covers them: no lower bound from coverage
    tau_cov = lo
  elif excess(hi) < 0:
    tau_cov = hi
  else:
    tau_cov = float(optimize.brentq(excess, lo, hi, xtol=1e-4))
  return max(tau_ml, tau_cov)


def moment_sigma_scale(mu, sigma, y, noise) -> float:
  """tau_mm of the module docstring from validation columns [N] whose `noise` is each label's
  sample stderr (its square an unbiased, noisy estimate of the label's noise variance); 1 with
  too few steps, MOMENT_TAU_RANGE's low end where the labels' noise explains every residual."""
  mu, sigma, y, noise = (np.asarray(a, np.float64) for a in (mu, sigma, y, noise))
  use = np.isfinite(y) & np.isfinite(noise) & (y != 0)
  if use.sum() < MIN_STEPS:
    return 1.0
  excess = np.mean(np.square(y[use] - mu[use])) - np.mean(np.square(noise[use]))
  lo, hi = MOMENT_TAU_RANGE
  if excess <= 0:
    return lo
  return float(np.clip(np.sqrt(excess / np.mean(np.square(sigma[use]))), lo, hi))


def calibration_text(step: int, sigma_scale: float, steps: int) -> str:
  """The calibration.json of checkpoint `step` (fitted on `steps` validation steps)."""
  record = {"step": int(step), "sigma_scale": float(sigma_scale), "validation_steps": int(steps)}
  return json.dumps(record, indent=1, sort_keys=True)


def read_sigma_scale(step_dir: str, step: int) -> float:
  """The scale fitted for checkpoint `step`, from its step directory `step_dir`, or 1 (none
  fitted, or the file names another step). A damaged file is a one-line error."""
  path = os.path.join(step_dir, CALIBRATION_FILE)
  if not os.path.isfile(path):
    return 1.0
  try:
    with open(path) as f:
      record = json.load(f)
    scale, fitted_step = float(record["sigma_scale"]), int(record["step"])
  except (OSError, ValueError, KeyError, TypeError):
    raise HindsightError(f"{path} is damaged (delete it to use the uncalibrated model)") from None
  if not (np.isfinite(scale) and scale > 0):
    raise HindsightError(f"{path}: sigma_scale {scale} is not a positive number")
  return scale if fitted_step == step else 1.0
