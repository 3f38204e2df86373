"""Post-hoc calibration of the predicted spread (`hindsight.model.calibration`)."""

import json

import numpy as np
import pytest

from hindsight.errors import HindsightError
from hindsight.model.calibration import calibration_text, fit_sigma_scale, read_sigma_scale


@pytest.mark.parametrize("tau", [0.5, 1.0, 1.7])
def test_fit_recovers_the_scale_with_label_noise_deconvolved(tau):
  rng = np.random.default_rng(0)
  n = 20_000
  mu = rng.normal(0, 1, n)
  sigma = rng.uniform(0.05, 0.3, n)  # the model's own (mis-scaled) spread
  stderr = rng.uniform(0.0, 0.3, n)  # the labels' noise, known
  truth = mu + tau * sigma * rng.normal(size=n)
  y = truth + stderr * rng.normal(size=n)
  assert fit_sigma_scale(mu, sigma, y, stderr) == pytest.approx(tau, rel=0.05)
  # Exact ties (label 0 with stderr 0) belong to the atom and are left out of the fit.
  y2, se2 = y.copy(), stderr.copy()
  y2[:5000], se2[:5000] = 0.0, 0.0
  assert fit_sigma_scale(mu, sigma, y2, se2) == pytest.approx(tau, rel=0.06)
  # So are labels 0 because every branch tied, whose stderr is a conservative tie bound: at
  # steps the model puts at 0 such a label's residual is far below its "noise", and counted
  # as noise it would pull tau down.
  mu3, se3 = mu.copy(), se2.copy()
  mu3[:5000], se3[:5000] = 0.0, 0.3
  assert fit_sigma_scale(mu3, sigma, y2, se3) == pytest.approx(tau, rel=0.06)
  assert fit_sigma_scale(mu[:5], sigma[:5], y[:5], stderr[:5]) == 1.0  # too few: no fit


def test_fit_covers_the_truth_where_the_spread_has_the_wrong_shape():
  """The model predicts one spread everywhere; the truth is off by 0.1 on half the steps and
  by 1.0 on the other half. Matching the variance alone (likelihood) leaves the 95%
  intervals covering about 0.92 of the truth; the fitted tau covers 0.95."""
  rng = np.random.default_rng(1)
  n = 40_000
  mu, sigma = np.zeros(n), np.ones(n)
  truth = rng.normal(size=n) * np.where(np.arange(n) % 2 == 0, 0.1, 1.0)
  stderr = np.full(n, 0.05)
  y = truth + stderr * rng.normal(size=n)
  tau = fit_sigma_scale(mu, sigma, y, stderr)
  covered = np.mean(np.abs(truth) <= 1.96 * tau * sigma)
  ml_covered = np.mean(np.abs(truth) <= 1.96 * np.sqrt(np.mean(truth**2)))
  assert ml_covered < 0.93 and 0.945 <= covered <= 0.96, (ml_covered, covered, tau)


def test_calibration_file_belongs_to_its_step(tmp_path):
  assert read_sigma_scale(str(tmp_path), 100) == 1.0  # none written
  (tmp_path / "calibration.json").write_text(calibration_text(100, 1.3, 500))
  assert read_sigma_scale(str(tmp_path), 100) == pytest.approx(1.3)
  assert read_sigma_scale(str(tmp_path), 200) == 1.0  # fitted for another step
  (tmp_path / "calibration.json").write_text("{not json")
  with pytest.raises(HindsightError, match=r"calibration\.json is damaged"):
    read_sigma_scale(str(tmp_path), 100)
  (tmp_path / "calibration.json").write_text(json.dumps({"step": 100, "sigma_scale": -1}))
  with pytest.raises(HindsightError, match="not a positive number"):
    read_sigma_scale(str(tmp_path), 100)
