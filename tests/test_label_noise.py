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
from hindsight.model.loss import credit_loss, gaussian_nll, total_variance
from hindsight.model.spec import DataSpec
from hindsight.text.estimate import text_step_fields


def _stderr(x) -> float:
  return statistics.stdev(map(float, x)) / math.sqrt(len(x))


def test_text_labels_carry_their_sample_stderr_beside_the_tie_bound():
  rng = np.random.default_rng(0)
  K, T = 8, 5
  keep = [rng.integers(0, 2, K).astype(float) for _ in range(T - 1)] + [np.array([1.0])]
  phi = [rng.integers(0, 2, K).astype(float) for _ in range(T)]
  replace = [rng.integers(0, 2, K).astype(float) for _ in range(T)]
  replace[2] = np.array([1.0])  # one draw: no replacement estimate, the credit undefined
  fields = text_step_fields(keep, phi, replace, 1.0, tolerance=0.05, confidence=0.95)
  defined = np.arange(T) != 2
  assert fields["credit_bounded"][defined].all()  # 0/1 outcomes at K = 8: every arm bounded
  want = [math.hypot(_stderr(keep[t]), _stderr(replace[t])) for t in (0, 1, 3)]
  want.append(_stderr(replace[-1]))  # the last step's keep arm is the trace's own outcome
  np.testing.assert_allclose(fields["credit_sample_stderr"][defined], want, rtol=1e-5)
  assert np.isnan(fields["credit_sample_stderr"][2]) and np.isnan(fields["credit"][2])
  assert (fields["credit_stderr"][defined] > fields["credit_sample_stderr"][defined]).all()


def test_symbolic_labels_carry_the_paired_sample_stderr_also_where_bounded():
  rng = np.random.default_rng(1)
  H, K = 5, 16
  G = rng.normal(size=(H, K, 3)).astype(np.float32)
  G[1, :, 1] = G[1, :, 0]  # step 1: every pair tied but two, so the tie bound replaces it
  G[1, :2, 1] += 1.0
  w = np.array([0.0, 0.0, 0.25, 1.0, 0.0], np.float32)  # 2: stratified; 3: a_t the only action
  undefined = np.array([False, False, False, False, True])
  mask = np.array([True, True, True, True, True])
  fields = step_fields(
    jnp.asarray(G), jnp.zeros(H), jnp.asarray(mask), jnp.zeros((H, K), bool),
    jnp.asarray(undefined), keep_share=jnp.asarray(w),
    bounds=jnp.tile(jnp.array([-5.0, 5.0]), (H + 1, 1)),
    upper_rates=jnp.asarray(tie_upper_rates(K, 0.95)), gamma=1.0, tolerance=0.05,
    z=z_value(0.95),
  )  # fmt: skip
  sample = np.asarray(fields["credit_sample_stderr"])
  assert bool(fields["credit_bounded"][1]) and not bool(fields["credit_bounded"][0])
  want = [(1 - w[t]) * _stderr(G[t, :, 0] - G[t, :, 1]) for t in range(3)]
  np.testing.assert_allclose(sample[:3], want, rtol=1e-5)
  assert float(fields["credit_stderr"][1]) > sample[1]
  assert sample[3] == 0.0  # q(a_t) = 1: the arms are one, the credit exactly 0
  assert np.isnan(sample[4])  # undefined: no credit, no noise level
  padded = step_fields(
    jnp.asarray(G), jnp.zeros(H), jnp.asarray(np.arange(H) < 3), jnp.zeros((H, K), bool),
    jnp.zeros(H, bool), keep_share=jnp.zeros(H), bounds=jnp.tile(jnp.array([-5.0, 5.0]),
    (H + 1, 1)), upper_rates=jnp.asarray(tie_upper_rates(K, 0.95)), gamma=1.0,
    tolerance=0.05, z=z_value(0.95),
  )  # fmt: skip
  assert np.isnan(np.asarray(padded["credit_sample_stderr"])[3:]).all()  # padding: NaN


def _episode(stderr, sample, credit=None):
  T = len(stderr)
  credit = np.full(T, 0.2) if credit is None else np.asarray(credit, np.float32)
  return Episode(observations=np.zeros(T, np.int32), actions=np.zeros(T, np.int32),
                 rewards=np.zeros(T, np.float32), success=False, credit=credit,
                 credit_stderr=np.asarray(stderr, np.float32), progress=np.zeros(T),
                 klass=np.zeros(T, np.int32), credit_sample_stderr=sample)  # fmt: skip


def test_the_batch_reads_the_sample_stderr_where_the_labels_carry_one():
  spec = DataSpec(encoder=DiscreteEncoder(4), num_actions=2, max_length=4,
                  num_classes=len(KLASS_NAMES), value_scale=1.0)  # fmt: skip
  eps = [
    # a sample stderr; none (NaN: the bound stays); 0 where every branch tied (a noise level
    # of 0, not "missing"); a NaN credit (no label: 0, out of label_mask)
    _episode([0.4, 0.4, 0.3, 0.2], np.array([0.1, np.nan, 0.0, 0.1], np.float32),
             credit=[0.2, 0.2, 0.0, np.nan]),
    _episode([0.3, 0.3], None),  # labels written before the field, two steps of four
  ]  # fmt: skip
  batch = episodes_batch(eps, 4, spec)
  np.testing.assert_allclose(batch["credit_noise"], [[0.1, 0.4, 0.0, 0.0], [0.3, 0.3, 0, 0]])
  np.testing.assert_allclose(batch["credit_stderr"], [[0.4, 0.4, 0.3, 0.0], [0.3, 0.3, 0, 0]])
  assert batch["label_mask"].tolist() == [[True, True, True, False], [True, True, False, False]]


def test_sample_noise_is_the_noise_the_nll_and_its_weight_take_out():
  mask = jnp.ones((1, 3), bool)
  batch = {"credit": jnp.array([[0.0, 0.2, 0.3]]), "credit_stderr": jnp.array([[0.3, 0.4, 0.5]]),
           "credit_noise": jnp.array([[0.0, 0.1, 0.2]]), "klass": jnp.zeros((1, 3), jnp.int32),
           "mask": mask, "label_mask": mask}  # fmt: skip
  out = {"mu": jnp.full((1, 3), 0.1), "log_var": jnp.full((1, 3), -4.0),
         "zero_logit": jnp.full((1, 3), 2.0), "logits": jnp.zeros((1, 3, 4)),
         "credit": jnp.zeros((1, 3))}  # fmt: skip
  scale, beta, zero_weight = jnp.float32(1.0), 0.5, 0.1
  kwargs = {"class_weight": 0.0, "beta": beta, "zero_weight": zero_weight}
  _, bound = credit_loss(out, batch, scale, **kwargs)
  _, sample = credit_loss(out, batch, scale, sample_noise=True, **kwargs)
  for metrics, noise in ((bound, "credit_stderr"), (sample, "credit_noise")):
    nll = gaussian_nll(out["mu"], out["log_var"], batch["credit"], batch[noise], scale)
    np.testing.assert_allclose(metrics["nll"], nll.mean(), rtol=1e-6)
    weight = total_variance(out["log_var"], batch[noise], scale) ** beta
    want = (weight * nll).mean() + zero_weight * metrics["zero_bce"]
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-6)
  # The exact-zero target reads the honest stderr: the label 0 with a tie bound (its noise
  # level 0) is not a step whose replacement cannot differ.
  np.testing.assert_allclose(sample["zero_bce"], np.log1p(np.exp(2.0)), rtol=1e-6)  # all 0
  np.testing.assert_allclose(sample["zero_bce"], bound["zero_bce"])


@pytest.mark.parametrize("broken", [0.5, 2.0])
def test_calibration_on_sample_noise_scales_the_spread_to_the_truth(broken):
  """Known truth c; a model off by N(0, s_t^2) with s_t from 0.02 to 0.3 whose stated spread
  is `broken` x s_t; labels c + noise of 0.25 whose honest stderr is a bound twice that, and
  a K = 8 sample stderr. Matched in the mean on the sample noise, tau = 1 / broken and the
  95% intervals cover 0.95 of the truth; the per-step fit is pulled up by the sample
  stderrs' own noise; on the bound (every step bounded, so left out) no fit is made."""
  rng = np.random.default_rng(2)
  n = 20_000
  truth = rng.normal(0, 0.3, n)
  spread = rng.uniform(0.02, 0.3, n)
  mu = truth + spread * rng.normal(size=n)
  sigma = broken * spread
  noise = 0.25
  y = truth + rng.normal(0, noise, n)
  sample = noise * np.sqrt(rng.chisquare(7, n) / 7)  # a K = 8 sample stderr of the noise

  def covered(tau):
    return np.mean(np.abs(truth - mu) <= 1.96 * tau * sigma)

  tau = moment_sigma_scale(mu, sigma, y, sample)
  assert tau * broken == pytest.approx(1.0, abs=0.05)
  assert 0.94 <= covered(tau) <= 0.96, (broken, tau, covered(tau))
  assert covered(fit_sigma_scale(mu, sigma, y, sample)) > 0.98  # too wide
  assert fit_sigma_scale(mu, sigma, y, np.full(n, 2 * noise), bounded=np.ones(n, bool)) == 1.0
  assert not 0.90 <= covered(1.0) <= 0.97  # the stated spread, uncalibrated
  # Noise that explains every residual leaves no spread to scale: the lowest tau.
  assert moment_sigma_scale(mu, sigma, truth + 0.5 * (y - truth), np.full(n, 1.0)) == 0.01


def test_the_calibration_takes_out_the_noise_the_loss_took_out(monkeypatch):
  """`SigmaScaleEvaluator` under sample_noise: the moment scale on the sample noise, the
  steps whose only noise level is a tie bound (labels written before the field) left out;
  otherwise the per-step fit on the stderr, bounded steps left out."""
  import types

  from hindsight.evaluators import label_fit
  from hindsight.model.loss import LossConfig

  rng = np.random.default_rng(3)
  n = 4000
  truth = rng.normal(0, 0.3, n)
  mu = truth + rng.normal(0, 0.1, n)
  noise = np.full(n, 0.25)
  steps = {"pred_mu": mu, "pred_var": np.full(n, 0.05**2), "label": truth + rng.normal(0, 0.25, n),
           "noise": noise, "stderr": 2 * noise, "bounded": np.ones(n, bool),
           "sampled": np.ones(n, bool)}  # fmt: skip
  monkeypatch.setattr(label_fit, "predict_split", lambda *a: ({}, dict(steps)))

  def scale(sample_noise, **change):
    steps.update(change)
    programs = types.SimpleNamespace(loss=LossConfig(sample_noise=sample_noise))
    return label_fit.SigmaScaleEvaluator(programs, *[None] * 5).run(None)[0]

  assert scale(True) == pytest.approx(2.0, rel=0.1)  # the model's error is 2x its spread
  assert scale(False) == 1.0  # every label tie-bounded: no fit
  # Half the steps lost their sample stderr and fell back to the bound (0.5 counted as noise
  # would leave no excess): left out, the same scale from the rest.
  half = np.arange(n) < n // 2
  fallback = np.where(half, noise, 2 * noise)
  assert scale(True, noise=fallback, sampled=half) == pytest.approx(2.0, rel=0.15)
