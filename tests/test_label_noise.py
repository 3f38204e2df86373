"""The label's noise level beside its honest stderr (`credit_sample_stderr`), and the credit
model's loss and calibration taking it out (`loss.sample_noise`).

At small K every text label's stderr is the conservative tie bound (fewer than 5 of K
outcomes off the largest tie is certain for 0/1 outcomes at K = 8), about twice the label's
noise: a loss that takes the bound out leaves the model's own spread nothing to explain.
The sample stderrs here are computed with the standard library's `statistics`, apart from
the project's reductions."""

import math
import statistics

import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.credit.estimators import tie_upper_rates, z_value
from hindsight.credit.fields import step_fields
from hindsight.credit.names import KLASS_NAMES
from hindsight.data.episode import Episode
from hindsight.model.batching import episodes_batch
from hindsight.model.calibration import fit_sigma_scale, moment_sigma_scale
from hindsight.model.encoders.discrete import DiscreteEncoder
from hindsight.model.loss import credit_loss, gaussian_nll
from hindsight.model.spec import DataSpec
from hindsight.text.estimate import text_step_fields


def _stderr(x) -> float:
  return statistics.stdev(map(float, x)) / math.sqrt(len(x))


def test_text_labels_carry_their_sample_stderr_beside_the_tie_bound():
  rng = np.random.default_rng(0)
  K, T = 8, 4
  keep = [rng.integers(0, 2, K).astype(float) for _ in range(T - 1)] + [np.array([1.0])]
  phi = [rng.integers(0, 2, K).astype(float) for _ in range(T)]
  fields = text_step_fields(keep, phi, phi, 1.0, tolerance=0.05, confidence=0.95)
  assert fields["credit_bounded"].all()  # 0/1 outcomes at K = 8: every arm is tie-bounded
  want = [math.hypot(_stderr(keep[t]), _stderr(phi[t])) for t in range(T - 1)]
  want.append(_stderr(phi[-1]))  # the last step's keep arm is the trace's own outcome: exact
  np.testing.assert_allclose(fields["credit_sample_stderr"], want, rtol=1e-5)
  assert (fields["credit_stderr"] > fields["credit_sample_stderr"]).all()


def test_symbolic_labels_carry_the_paired_sample_stderr_also_where_bounded():
  rng = np.random.default_rng(1)
  H, K = 3, 16
  G = rng.normal(size=(H, K, 3)).astype(np.float32)
  G[1, :, 1] = G[1, :, 0]  # step 1: every pair tied but two, so the tie bound replaces it
  G[1, :2, 1] += 1.0
  w = np.array([0.0, 0.0, 0.25], np.float32)  # step 2: a stratified replacement
  fields = step_fields(
    jnp.asarray(G), jnp.zeros(H), jnp.ones(H, bool), jnp.zeros((H, K), bool),
    jnp.zeros(H, bool), keep_share=jnp.asarray(w), bounds=jnp.tile(jnp.array([-5.0, 5.0]),
    (H + 1, 1)), upper_rates=jnp.asarray(tie_upper_rates(K, 0.95)), gamma=1.0,
    tolerance=0.05, z=z_value(0.95),
  )  # fmt: skip
  assert bool(fields["credit_bounded"][1]) and not bool(fields["credit_bounded"][0])
  want = [(1 - w[t]) * _stderr(G[t, :, 0] - G[t, :, 1]) for t in range(H)]
  np.testing.assert_allclose(fields["credit_sample_stderr"], want, rtol=1e-5)
  assert float(fields["credit_stderr"][1]) > float(fields["credit_sample_stderr"][1])


def _episode(stderr, sample):
  T = len(stderr)
  return Episode(observations=np.zeros(T, np.int32), actions=np.zeros(T, np.int32),
                 rewards=np.zeros(T, np.float32), success=False, credit=np.full(T, 0.2),
                 credit_stderr=np.asarray(stderr, np.float32), progress=np.zeros(T),
                 klass=np.zeros(T, np.int32), credit_sample_stderr=sample)  # fmt: skip


def test_the_batch_reads_the_sample_stderr_where_the_labels_carry_one():
  spec = DataSpec(encoder=DiscreteEncoder(4), num_actions=2, max_length=3,
                  num_classes=len(KLASS_NAMES), value_scale=1.0)  # fmt: skip
  eps = [
    _episode([0.4, 0.4, 0.0], np.array([0.1, np.nan, 0.0], np.float32)),
    _episode([0.3, 0.3, 0.3], None),
  ]  # fmt: skip  (labels written before the field)
  batch = episodes_batch(eps, 3, spec)
  np.testing.assert_allclose(batch["credit_noise"], [[0.1, 0.4, 0.0], [0.3, 0.3, 0.3]])
  np.testing.assert_allclose(batch["credit_stderr"], [[0.4, 0.4, 0.0], [0.3, 0.3, 0.3]])


def test_sample_noise_is_the_noise_the_nll_takes_out():
  mask = jnp.ones((1, 3), bool)
  batch = {"credit": jnp.array([[0.0, 0.2, 0.3]]), "credit_stderr": jnp.array([[0.0, 0.4, 0.5]]),
           "credit_noise": jnp.array([[0.0, 0.1, 0.2]]), "klass": jnp.zeros((1, 3), jnp.int32),
           "mask": mask, "label_mask": mask}  # fmt: skip
  out = {"mu": jnp.full((1, 3), 0.1), "log_var": jnp.full((1, 3), -4.0),
         "zero_logit": jnp.zeros((1, 3)), "logits": jnp.zeros((1, 3, 4)),
         "credit": jnp.zeros((1, 3))}  # fmt: skip
  scale = jnp.float32(1.0)
  _, bound = credit_loss(out, batch, scale, class_weight=0.0)
  _, sample = credit_loss(out, batch, scale, class_weight=0.0, sample_noise=True)
  for metrics, noise in ((bound, "credit_stderr"), (sample, "credit_noise")):
    want = gaussian_nll(out["mu"], out["log_var"], batch["credit"], batch[noise], scale).mean()
    np.testing.assert_allclose(metrics["nll"], want, rtol=1e-6)
  # The exact-zero target still reads the honest stderr (0: the replacement cannot differ).
  np.testing.assert_allclose(sample["zero_bce"], bound["zero_bce"])


@pytest.mark.parametrize("broken", [0.5, 1.0, 2.0])
def test_calibration_on_sample_noise_covers_the_truth_where_the_bound_cannot(broken):
  """Known truth c; a model off by N(0, 0.1^2) whose stated spread is `broken` x 0.1; labels
  c + noise of 0.25 whose honest stderr is a bound twice that, and a K = 8 sample stderr.
  Matched in the mean on the sample noise, the 95% intervals cover 0.95 of the truth whatever
  the stated spread; the per-step fit is pulled up by the sample stderrs' own noise; on the
  bound (every step bounded, so left out) no fit is made and the broken spread stands."""
  rng = np.random.default_rng(2)
  n = 4000
  truth = rng.normal(0, 0.3, n)
  mu = truth + rng.normal(0, 0.1, n)
  sigma = np.full(n, 0.1 * broken)
  noise = 0.25
  y = truth + rng.normal(0, noise, n)
  sample = noise * np.sqrt(rng.chisquare(7, n) / 7)  # a K = 8 sample stderr of the noise

  def covered(tau):
    return np.mean(np.abs(truth - mu) <= 1.96 * tau * sigma)

  tau = moment_sigma_scale(mu, sigma, y, sample)
  assert 0.93 <= covered(tau) <= 0.97, (broken, tau, covered(tau))
  assert covered(fit_sigma_scale(mu, sigma, y, sample)) > 0.99  # too wide
  assert fit_sigma_scale(mu, sigma, y, np.full(n, 2 * noise), bounded=np.ones(n, bool)) == 1.0
  assert (broken == 1.0) or not 0.90 <= covered(1.0) <= 0.97
  # Noise that explains every residual leaves no spread to scale: the lowest tau.
  assert moment_sigma_scale(mu, sigma, truth + 0.5 * (y - truth), np.full(n, 1.0)) == 0.01
