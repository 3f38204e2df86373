"""`hindsight audit`: the step labeler against the DP, the confidence sequences' false-alarm
rate, the alarm on a damaged model, the repair loop (audit -> fine-tune -> drift harness),
and one-line errors.

The statistical tests hold the machinery against known truths: the exact DP of a tabular MDP
(a predictor that *is* the DP shifted by exactly the tolerance sits on the boundary of the
null hypothesis, the hardest case for the false-alarm rate), and simulated streams.
"""

import dataclasses
import json
import math
import os

import jax
import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, run_cli
from scipy import stats

from hindsight.audit import (
  AlarmConfig,
  AuditConfig,
  drift_alarm,
  eb_confidence_sequence,
  run_audit,
)
from hindsight.audit import pool as pool_lib
from hindsight.audit.report import build_report
from hindsight.audit.runner import audit_pool
from hindsight.data import open_labels
from hindsight.drift import DriftConfig, run_drift
from hindsight.envs import make
from hindsight.errors import HindsightError
from hindsight.labeling import trajectories as tr
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.engine import Labeler, episode_key
from hindsight.metrics.sequential import SliceTerms
from hindsight.model.batching import EpisodeReader
from hindsight.model.predictor import Predictor

# Only the tests that share the module's trained run need one worker (xdist loadgroup);
# the others spread freely.
shares_the_run = pytest.mark.xdist_group("audit")

MDP = os.path.join(ROOT, "data", "key_corridor.npz")


# -- the step labeler ---------------------------------------------------------------------


@pytest.mark.parametrize("replacement", ["policy", "policy_other"])
def test_label_steps_is_unbiased_against_the_dp(replacement):
  env, policy = make(f"tabular:{MDP}")
  mc = Labeler(env, policy, LabelConfig(num_rollouts=64, replacement=replacement))
  exact = Labeler(env, policy, LabelConfig(num_rollouts=2, replacement=replacement, exact=True))
  keys = jax.vmap(episode_key, (None, 0))(0, np.arange(96))
  traj = mc.sample(keys)
  truth = np.asarray(exact.label(traj, keys)["credit"])
  lengths = np.asarray(traj.mask).sum(1)
  t = np.arange(96) % lengths  # a valid step of every episode
  t[-1] = int(lengths[-1])  # ... but past the end in the last one (if shorter than H)
  step_keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(7), i))(np.arange(96))
  out = jax.device_get(mc.label_steps(traj, t.astype(np.int32), step_keys))
  c, se, bounded = out["credit"], out["credit_stderr"], out["credit_bounded"]
  if lengths[-1] < env.horizon:
    assert np.isnan(c[-1]) and out["rollout_steps"][-1] == 0
  ref = truth[np.arange(96), np.minimum(t, env.horizon - 1)]
  ok = np.isfinite(c) & np.isfinite(ref) & (se > 0) & ~bounded
  z = (c - ref)[ok] / se[ok]
  assert ok.sum() >= 20
  assert 0.6 < np.sqrt(np.mean(z**2)) < 1.5, np.sqrt(np.mean(z**2))
  # A tie-bounded stderr is conservative: the DP lies inside its 95% interval on at least
  # 95% of those steps (over 5 step-key seeds: 1 of 190 outside, at z = 2.02).
  tied = np.isfinite(c) & bounded
  outside = np.abs(c - ref)[tied] > 1.96 * se[tied] + 1e-6
  assert tied.sum() >= 20 and outside.mean() <= 0.05, (outside.sum(), tied.sum())
  assert np.all(out["rollout_steps"][np.isfinite(c)] > 0)


# -- confidence sequences -----------------------------------------------------------------


def _cs_by_the_formula(x, lo, hi, alpha, c=0.5):
  """The module docstring's confidence sequence, step by step in plain Python (an oracle
  written apart from the vectorised one)."""
  ys, lams, vpsi = [], [], []
  mu_prev, sigma2_prev, best_lo, best_hi = 0.5, 0.25, 0.0, 1.0
  sum_y, sum_sq = 0.0, 0.0
  out_lo, out_hi = [], []
  for t, xi in enumerate(x, start=1):
    y = (xi - lo) / (hi - lo)
    lam = min(math.sqrt(2 * math.log(2 / alpha) / (sigma2_prev * t * math.log(1 + t))), c)
    v = 4 * (y - mu_prev) ** 2
    psi = (-math.log(1 - lam) - lam) / 4
    ys.append(y)
    lams.append(lam)
    vpsi.append(v * psi)
    centre = sum(l * yy for l, yy in zip(lams, ys, strict=True)) / sum(lams)
    margin = (math.log(2 / alpha) + sum(vpsi)) / sum(lams)
    best_lo = max(best_lo, min(max(centre - margin, 0.0), 1.0))
    best_hi = min(best_hi, min(max(centre + margin, 0.0), 1.0))
    out_lo.append(lo + (hi - lo) * best_lo)
    out_hi.append(lo + (hi - lo) * best_hi)
    sum_y += y
    mu = (0.5 + sum_y) / (t + 1)
    sum_sq += (y - mu) ** 2
    mu_prev, sigma2_prev = mu, (0.25 + sum_sq) / (t + 1)
  return np.array(out_lo), np.array(out_hi)


def test_confidence_sequence_is_the_documented_formula():
  rng = np.random.default_rng(0)
  x = np.where(rng.random(300) < 0.02, 3.0, np.clip(rng.normal(-0.05, 0.05, 300), -4, 4))
  for alpha in (0.05, 0.2):
    lo, hi = eb_confidence_sequence(x, -4.0, 4.0, alpha)
    want_lo, want_hi = _cs_by_the_formula(x, -4.0, 4.0, alpha)
    np.testing.assert_allclose(lo, want_lo, rtol=0, atol=1e-12)
    np.testing.assert_allclose(hi, want_hi, rtol=0, atol=1e-12)
  with pytest.raises(ValueError, match="outside the stated range"):
    eb_confidence_sequence(np.array([5.0]), -4.0, 4.0, 0.1)


def _asymptotic_by_the_formula(x, alpha, t_opt):
  """Waudby-Smith, Arbour, Sinha, Kennedy & Ramdas (2024), Thm 2.2, step by step: the sample
  mean and standard deviation (ddof 1) of the first t draws, and the Gaussian mixture's
  margin sd_t sqrt(2 (t rho^2 + 1) / (t^2 rho^2) log(sqrt(t rho^2 + 1) / alpha)), rho^2
  the one whose margin at t_opt is least, found by a numerical search (not the closed
  form through Lambert's W that the code uses)."""
  from scipy import optimize

  def margin(t, sd, rho2):
    return sd * math.sqrt(2 * (t * rho2 + 1) / (t**2 * rho2) * math.log(math.sqrt(t * rho2 + 1)
                                                                        / alpha))  # fmt: skip

  found = optimize.minimize_scalar(
    lambda r: margin(t_opt, 1.0, math.exp(r)), bounds=(-20, 5), method="bounded",
    options={"xatol": 1e-10},
  )  # fmt: skip
  rho2 = math.exp(found.x)
  lo, hi = [], []
  for t in range(1, len(x) + 1):
    sd = float(np.std(x[:t], ddof=1)) if t > 1 else math.inf
    m = margin(t, sd, rho2)
    lo.append(float(np.mean(x[:t])) - m)
    hi.append(float(np.mean(x[:t])) + m)
  return np.array(lo), np.array(hi), rho2


def test_asymptotic_confidence_sequence_is_theorem_2_2():
  """The Gaussian-mixture sequence against the theorem's formula computed apart: a margin
  k times too wide, or rho^2 tuned at another time (n = 1), fails; and at t_opt and alpha
  0.05 its half-width is 3.04 sd / sqrt(t), as documented."""
  from hindsight.metrics.sequential import asymptotic_confidence_sequence, best_rho2

  rng = np.random.default_rng(1)
  x = rng.gamma(2.0, 0.3, 400)
  for alpha, t_opt in ((0.05, 400), (0.01, 100), (0.2, 37)):
    lo, hi = asymptotic_confidence_sequence(x, alpha, t_opt)
    want_lo, want_hi, rho2 = _asymptotic_by_the_formula(x, alpha, t_opt)
    assert best_rho2(t_opt, alpha) == pytest.approx(rho2, rel=1e-5)
    np.testing.assert_allclose(lo[1:], want_lo[1:], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(hi[1:], want_hi[1:], rtol=1e-6, atol=1e-7)
    assert np.isneginf(lo[0]) and np.isposinf(hi[0])  # one draw: no spread, the whole line
  lo, hi = asymptotic_confidence_sequence(x, 0.05)  # t_opt defaults to n
  t = x.size
  assert (hi[-1] - lo[-1]) / 2 == pytest.approx(3.04 * np.std(x, ddof=1) / math.sqrt(t), rel=2e-3)


def test_confidence_sequence_misses_about_alpha_over_the_whole_stream():
  """Its miss rate over whole streams of a skewed law: at most alpha, and not vacuous (the
  same streams at a 4x larger alpha miss more often; at alpha=0.4 about 0.05, measured)."""
  rng = np.random.default_rng(0)
  streams, n = 400, 1500
  mean = 0.02 * 3.0 + 0.98 * -0.05  # a skewed bounded law: rare large values
  xs = [np.where(rng.random(n) < 0.02, 3.0, np.clip(rng.normal(-0.05, 0.05, n), -4, 4))
        for _ in range(streams)]  # fmt: skip

  def miss_rate(alpha):
    misses = 0
    for x in xs:
      lo, hi = eb_confidence_sequence(x, -4.0, 4.0, alpha)
      assert np.all(np.diff(lo) >= 0) and np.all(np.diff(hi) <= 0)  # running intersection
      misses += bool(np.any((lo > mean) | (hi < mean)))
    return misses / streams, hi[-1] - lo[-1]

  rate, width = miss_rate(0.1)
  assert rate <= 0.1 * 0.5, rate  # conservative (the bound allows alpha; it spends less)
  loose, _ = miss_rate(0.4)
  assert rate < loose <= 0.4, (rate, loose)
  # ... and it narrows: after 1500 draws (spread ~0.4) about 0.07 wide, in a range of 8.
  assert 0.04 < width < 0.12, width


def test_drift_alarm_at_the_tolerance_boundary_and_beyond():
  """Streams whose mean gap sits exactly on +tolerance (the null's edge): the alarm fires in
  at most alpha of them however long they run, and more often at a larger alpha (the rate
  is the alpha's, not zero); at three times the tolerance it fires, and says why."""
  rng = np.random.default_rng(1)
  streams, n = 300, 1000
  gaps = [np.clip(rng.normal(0.1, 0.3, n), -2, 2) for _ in range(streams)]
  covers = [(rng.random(n) < 0.8).astype(float) for _ in range(streams)]  # at the floor

  def fired_rate(alpha):
    cfg = AlarmConfig(gap_tolerance=0.1, alpha=alpha, level=0.9, coverage_tolerance=0.1)
    fired = sum(drift_alarm(g, c, (-2.0, 2.0), (0.0, 1.0), cfg).first is not None
                for g, c in zip(gaps, covers, strict=True))  # fmt: skip
    return fired / streams

  strict_rate, loose_rate = fired_rate(0.1), fired_rate(0.8)
  assert strict_rate <= 0.1 and strict_rate < loose_rate, (strict_rate, loose_rate)
  cfg = AlarmConfig(gap_tolerance=0.1, alpha=0.1, level=0.9, coverage_tolerance=0.1)
  drifted = np.clip(rng.normal(0.3, 0.3, 4000), -2, 2)
  trace = drift_alarm(drifted, np.ones(4000), (-2.0, 2.0), (0.0, 1.0), cfg)
  assert trace.first is not None and trace.reason == "gap"
  assert trace.gap_lower[trace.first] > cfg.gap_tolerance
  assert trace.first == 0 or trace.gap_lower[trace.first - 1] <= cfg.gap_tolerance  # the first
  undercovered = drift_alarm(np.zeros(4000), (rng.random(4000) < 0.5) * 1.0, (-2.0, 2.0),
                             (0.0, 1.0), cfg)  # fmt: skip
  assert undercovered.reason == "coverage"


def _sliced(gaps_by_slice: tuple[float, ...], n: int, rng):
  """Uniform draws over a pool of equal slices whose mean gaps are given: (gap terms,
  SliceTerms) as the audit builds them (w = 1, p_j = 1/m)."""
  m = len(gaps_by_slice)
  which = rng.integers(0, m, n)
  g = np.clip(np.asarray(gaps_by_slice)[which] + rng.normal(0, 0.2, n), -1, 1)
  terms = np.stack([np.where(which == j, g, 0.0) * m for j in range(m)])
  ranges = np.tile([-1.0 * m, 1.0 * m], (m, 1))
  return g, SliceTerms(tuple(f"s{j}" for j in range(m)), terms, ranges)


def test_slice_alarm_sees_drift_that_cancels_and_keeps_alpha_at_the_boundary():
  """Two tags off by +-3 tolerances: the mean gap is 0 and its test stays quiet, the
  slices fire and name the tag. Every slice exactly on the tolerance (the null's edge):
  at most alpha of the streams fire."""
  rng = np.random.default_rng(4)
  cfg = AlarmConfig(gap_tolerance=0.02, alpha=0.1, level=0.9, coverage_tolerance=0.1)
  g, sl = _sliced((0.06, -0.06, 0.0), 20000, rng)
  trace = drift_alarm(g, np.ones(g.size), (-1.0, 1.0), (0.0, 1.0), cfg, sl)
  assert not trace.gap_fired.any()
  assert trace.first is not None and trace.reason.startswith("slice s")
  assert "s2" not in trace.reason
  without = drift_alarm(g, np.ones(g.size), (-1.0, 1.0), (0.0, 1.0), cfg)
  assert without.first is None  # the old alarm: the two drifts cancel
  fired = 0
  for _ in range(100):
    g, sl = _sliced((0.02, -0.02, 0.02), 3000, rng)
    fired += drift_alarm(g, np.ones(g.size), (-1.0, 1.0), (0.0, 1.0), cfg, sl).first is not None
  assert fired / 100 <= 0.1, fired
  # The rate above is far under alpha (confidence sequences are conservative), so it would
  # survive a lost alpha split: check the split itself. Each slice's sequence runs at
  # alpha / (3 m), the union bound over the three families and the m slices.
  from hindsight.metrics.sequential import eb_confidence_sequence

  trace = drift_alarm(g, np.ones(g.size), (-1.0, 1.0), (0.0, 1.0), cfg, sl)
  m, final = len(sl.names), trace.final_slice_bounds()
  for j, name in enumerate(sl.names):
    lo, hi = eb_confidence_sequence(sl.terms[j], *sl.ranges[j], alpha=cfg.alpha / (3 * m))
    assert final[name] == pytest.approx((lo[-1], hi[-1]), rel=1e-6), name
    lo3, hi3 = eb_confidence_sequence(sl.terms[j], *sl.ranges[j], alpha=cfg.alpha / 3)
    assert hi[-1] - lo[-1] > hi3[-1] - lo3[-1], name  # without the /m: narrower


# -- the design's importance weights -------------------------------------------------------


def test_importance_weights_are_bounded_and_make_the_weighted_gap_unbiased():
  """A pool whose gap grows with the step and a design that over-draws the large gaps
  (uncertainty = the gap itself): every weight w = 1 / (N p) is at most 1 / u; sum_i p_i w_i
  g_i is the pool's plain mean exactly; and the mean of w g over the design's own draws
  matches it within 4 standard errors, where the unweighted mean of the draws is far off."""
  from hindsight.audit.design import mixture_design

  n = 400
  gap = np.linspace(0.0, 1.0, n) ** 2
  noise = np.random.default_rng(0).uniform(0, 0.1, n)
  design = mixture_design(gap + 1e-3, noise, shares=(0.3, 0.5, 0.2))
  w = design.weights
  assert design.shares == (0.3, 0.5, 0.2)
  assert w.max() <= 1 / 0.3 + 1e-12 and design.max_weight == w.max()
  assert np.sum(design.probs * w * gap) == pytest.approx(gap.mean(), rel=1e-12)
  draws = np.concatenate([design.draw(jax.random.key(3), b, 5000) for b in range(8)])
  terms = w[draws] * gap[draws]
  se = terms.std(ddof=1) / np.sqrt(terms.size)
  assert abs(terms.mean() - gap.mean()) < 4 * se, (terms.mean(), gap.mean(), se)
  assert gap[draws].mean() - gap.mean() > 30 * se  # the draws alone are biased upward
  # Draw j depends on (key, block) only: the same blocks in another order, the same draws.
  again = np.concatenate([design.draw(jax.random.key(3), b, 5000) for b in reversed(range(8))])
  np.testing.assert_array_equal(np.sort(draws), np.sort(again))


# -- the audit on a tabular MDP, against the DP -------------------------------------------


class _ExactPredictor:
  """A 'model' whose credit is the DP's plus a constant offset: its true mean gap is the
  offset exactly, and its spread `sigma` wide enough that its intervals still cover (so
  only the gap alarm is under test). Scores the pool it was built for, in order."""

  def __init__(self, traj, exact: Labeler, offset: float, sigma: float = 0.2):
    self._sigma = sigma
    keys = jax.vmap(episode_key, (None, 0))(0, np.arange(traj.actions.shape[0]))
    credit = np.asarray(exact.label(traj, keys)["credit"])
    self._credit = credit + offset
    self._lengths = np.asarray(traj.mask).sum(1)

  def score(self, episodes):
    out = []
    for i, _ in enumerate(episodes):
      c = self._credit[i, : self._lengths[i]]
      zeros = np.zeros_like(c)
      out.append({"credit": c, "mean": c, "std": zeros + self._sigma, "p_zero": zeros, "mu": c,
                  "sigma": zeros + self._sigma, "klass": zeros.astype(int)})  # fmt: skip
    return out


@pytest.mark.slow
def test_audit_false_alarm_rate_on_an_exact_model_at_the_boundary():
  env, policy = make(f"tabular:{MDP}")
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=16))
  exact = Labeler(env, policy, LabelConfig(num_rollouts=2, exact=True))
  pool = pool_lib.from_env(labeler, f"tabular:{MDP}", 64, seed=0)
  tolerance = 0.05
  predictor = _ExactPredictor(pool.traj, exact, offset=tolerance)
  # The defaults: alpha 0.05 and the coverage alarm on (the exact model's intervals, label
  # noise added, cover the rollout labels as they should).
  base = AuditConfig(checkpoint="", budget=60_000, out="", env="x", progress=False)
  assert base.alpha == 0.05 and base.coverage_tolerance == 0.1
  audits = 40
  fired, draws = 0, []
  for seed in range(audits):
    res = audit_pool(dataclasses.replace(base, seed=seed), predictor, labeler, pool, tolerance)
    fired += res.trace.first is not None
    draws.append(res.draws.size)
    spent = int(res.draws.label["rollout_steps"].sum())
    assert spent <= base.budget
  # A false-alarm rate of at most alpha gives more than this many alarms in 40 audits with
  # probability below 1%: more would refute the guarantee.
  assert fired <= stats.binom.ppf(0.99, audits, base.alpha), (fired, audits)
  assert min(draws) > 50
  # The same audit with a predictor 6 tolerances off fires, and says when.
  far = _ExactPredictor(pool.traj, exact, offset=6 * tolerance)
  res = audit_pool(dataclasses.replace(base, seed=0), far, labeler, pool, tolerance)
  assert res.trace.first is not None and "gap" in res.trace.reason
  assert res.trace.gap_lower[res.trace.first] > tolerance
  # --stop-at-alarm spends no rollouts past the firing draw, and fires at the same draw.
  stopped = audit_pool(dataclasses.replace(base, seed=0, stop_at_alarm=True), far, labeler,
                       pool, tolerance)  # fmt: skip
  assert stopped.draws.size == stopped.trace.first + 1 == res.trace.first + 1
  # Draws, labels and where the budget ends do not depend on the block size (the seed only).
  small = audit_pool(dataclasses.replace(base, seed=0, block=8), far, labeler, pool, tolerance)
  np.testing.assert_array_equal(small.draws.step, res.draws.step)
  np.testing.assert_allclose(small.draws.label["credit"], res.draws.label["credit"], atol=1e-6)


# -- end to end: a trained model, its shift, the repair -----------------------------------


@pytest.fixture(scope="module")
def shifted_mdp(tmp_path_factory):
  """key_corridor with a uniform behaviour policy (the original prefers `right` 0.55):
  credit under the `policy` replacement moves at nearly every step (the DP of the original
  policy is off by 0.04 on average, by -0.0085 in the mean)."""
  with np.load(MDP) as z:
    arrays = {k: z[k] for k in z.files}
  arrays["pi"] = np.full_like(arrays["pi"], 0.25)
  path = str(tmp_path_factory.mktemp("shift") / "uniform.npz")
  np.savez(path, **arrays)
  return path


@pytest.mark.slow
def test_a_model_exact_for_the_old_policy_fires_under_the_new_one(shifted_mdp):
  old_env, old_policy = make(f"tabular:{MDP}")
  env, policy = make(f"tabular:{shifted_mdp}")
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=16))
  pool = pool_lib.from_env(labeler, f"tabular:{shifted_mdp}", 256, seed=0)
  # The old policy's exact credit of the new policy's trajectories: a perfect model of the
  # old behaviour, served after the policy moved on.
  old_exact = Labeler(old_env, old_policy, LabelConfig(num_rollouts=2, exact=True))
  stale = _ExactPredictor(pool.traj, old_exact, offset=0.0)
  cfg = AuditConfig(checkpoint="", budget=4_000_000, out="", env="x", progress=False)
  res = audit_pool(cfg, stale, labeler, pool, tolerance=0.003)
  # A tag's own gap (here `pick`'s) can leave the band before the mean over all steps does;
  # the mean gap's own test fires too, on the side the DP says (-0.0085).
  assert res.trace.first is not None
  gap_first = int(np.argmax(res.trace.gap_fired))
  assert res.trace.gap_fired.any() and res.trace.gap_upper[gap_first] < -0.003
  assert res.trace.first <= gap_first
  # The same model on its own policy's trajectories stays quiet.
  own = Labeler(old_env, old_policy, LabelConfig(num_rollouts=16))
  own_pool = pool_lib.from_env(own, f"tabular:{MDP}", 256, seed=0)
  fresh = _ExactPredictor(own_pool.traj, old_exact, offset=0.0)
  assert audit_pool(cfg, fresh, own, own_pool, tolerance=0.003).trace.first is None


@shares_the_run
def test_damaged_model_fires_and_the_report_says_what_it_cost(tabular_run, tmp_path):
  predictor = Predictor.load(tabular_run)
  noise = jax.tree.map(
    lambda x: x + 0.5 * jax.random.normal(jax.random.key(3), x.shape, x.dtype)
    if np.issubdtype(x.dtype, np.floating) else x,
    predictor.state,
  )  # fmt: skip
  damaged = Predictor(predictor.graphdef, noise, predictor.spec, predictor.model_config, 0)
  env, policy = make(f"tabular:{MDP}")
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=16))
  pool = pool_lib.from_env(labeler, f"tabular:{MDP}", 64, seed=0)
  cfg = AuditConfig(checkpoint=tabular_run, budget=200_000, out="", env="x", progress=False)
  res = audit_pool(cfg, damaged, labeler, pool, tolerance=0.02)
  first = res.trace.first
  assert first is not None and res.trace.reason
  # Fired on the first draw whose confidence sequence left its band, and not before.
  on = res.trace.gap_fired | res.trace.coverage_fired
  assert on[first] and not on[:first].any()
  # The report's cost is the rollouts of draws 0..first: each draw rolls K branches of the
  # keep and replace arms, each at least one env step.
  report = build_report(cfg, damaged, labeler.config, "x", pool, res, 0.02)
  steps = res.draws.label["rollout_steps"]
  assert report["verdict"]["fired_after_draws"] == first + 1
  assert report["verdict"]["fired_after_env_steps"] == int(steps[: first + 1].sum())
  assert np.all(steps >= 2 * labeler.config.num_rollouts)
  assert report["spent_env_steps"] == int(steps.sum()) <= cfg.budget
  assert report["verdict"]["fired_after_env_steps"] < report["spent_env_steps"]


@pytest.mark.slow
@shares_the_run
def test_audit_shift_fine_tune_shrinks_the_gap(tabular_run, shifted_mdp, tmp_path):
  """Audit under the shifted policy, fine-tune on the audited steps, and the drift
  harness (exact DP reference, bootstrap CIs) shows the gap shrinking."""
  spec = f"tabular:{shifted_mdp}"
  out = tmp_path / "audit"
  budget = 2_000_000
  run_audit(AuditConfig(checkpoint=tabular_run, env=spec, episodes=256, budget=budget,
                        rollouts=16, gap_tolerance=0.002, out=str(out),
                        progress=False))  # fmt: skip
  report = json.loads((out / "report.json").read_text())
  assert 0 < report["spent_env_steps"] <= budget
  assert (out / "report.md").is_file() and (out / "alarm.png").is_file()

  # The audited steps as a (partial) label dataset: only they carry labels.
  labels = open_labels(str(out / "labels"))
  reader = EpisodeReader(labels)
  labeled = np.concatenate([reader[i].labeled for i in range(len(labels))])
  credit = np.concatenate([reader[i].credit for i in range(len(labels))])
  assert labeled.sum() == labels.metadata.audited_steps > 1000
  assert np.all(np.isfinite(credit[labeled])) and np.all(np.isnan(credit[~labeled]))

  from hindsight.config_io import load_config
  from hindsight.training import train_and_evaluate

  tuned = str(tmp_path / "tuned")
  train_and_evaluate(
    load_config(
      "configs/tabular.py:smoke",
      [f"init_from={tabular_run}", f"data.labels_dir={out / 'labels'}", "train.steps=100",
       "train.eval_every=50", "optim.learning_rate=0.003"],
    ),
    tuned,
  )  # fmt: skip

  def harness(run, name):
    # The reference is the DP (tabular); its MC check pass is kept small.
    cfg = DriftConfig(checkpoint=run, env=spec, episodes=128, shifts=(), baseline_steps=0,
                      gradient_env="", bootstrap=100, out=str(tmp_path / name),
                      reference_rollouts=32, check_episodes=8, progress=False)  # fmt: skip
    return run_drift(cfg)["headline"]

  # The gap of the predicted mean (what the audit measures), the ranking of the point.
  before, after = harness(tabular_run, "before"), harness(tuned, "after")
  gb, ga = before["model (mixture mean)"]["mean_gap"], after["model (mixture mean)"]["mean_gap"]
  assert np.sign(gb["lo"]) == np.sign(gb["hi"]), gb  # a gap before, its CI clear of 0
  assert ga["lo"] <= 0 <= ga["hi"] and abs(ga["value"]) < abs(gb["value"]), (gb, ga)
  sb, sa = before["model (point)"]["spearman"], after["model (point)"]["spearman"]
  assert sa["lo"] > sb["hi"], (sb, sa)

  # A server of the old model hot-reloads the repaired one.
  from starlette.testclient import TestClient

  from hindsight.serving.app import create_app
  from hindsight.serving.config import ServeConfig

  token = tmp_path / "token"
  token.write_text("t0ken")
  cfg = ServeConfig(checkpoint=tabular_run, admin_token_file=str(token),
                    allow_reload_from=str(tmp_path))  # fmt: skip
  with TestClient(create_app(cfg)) as client:
    reply = client.post("/v1/reload", json={"checkpoint": tuned},
                        headers={"authorization": "Bearer t0ken"})  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert (
      reply.json()["model"]["digest"]
      == Predictor.load(tuned).digest
      != Predictor.load(tabular_run).digest
    )


@shares_the_run
def test_init_from_starts_at_the_models_parameters(tabular_run, tmp_path):
  from hindsight.config_io import load_config
  from hindsight.training import train_and_evaluate

  tuned = str(tmp_path / "same")
  train_and_evaluate(
    load_config("configs/tabular.py:smoke", [f"init_from={tabular_run}", "train.steps=10",
                "train.eval_every=10", "optim.learning_rate=0.0"]),
    tuned,
  )  # fmt: skip
  assert Predictor.load(tuned).digest == Predictor.load(tabular_run).digest
  bad = load_config("configs/tabular.py:smoke", [f"init_from={tabular_run}", "model.width=32"])
  with pytest.raises(Exception, match=r"model\.width=32 differs"):
    train_and_evaluate(bad, str(tmp_path / "bad"))


@pytest.mark.slow
@shares_the_run
def test_audit_bad_inputs_get_one_line_errors(tabular_run, tmp_path):
  env_arg = f"tabular:{MDP}"
  # Through the CLI: exit 2 and one line on stderr.
  small = run_cli("audit", "--checkpoint", tabular_run, "--env", env_arg, "--budget", 10,
                  "--out", tmp_path / "a")  # fmt: skip
  assert_one_line_error(small, "--budget 10", "cannot pay for one audited step")
  other = run_cli("audit", "--checkpoint", tabular_run, "--env", "reasoning", "--budget",
                  100000, "--out", tmp_path / "b")  # fmt: skip
  assert_one_line_error(other, "do not fit the model")
  # In process (the CLI prints these HindsightErrors the same way): one line each.
  lines = tmp_path / "t.jsonl"
  base = AuditConfig(checkpoint=tabular_run, budget=100_000, out=str(tmp_path / "c"),
                     trajectories=str(lines), progress=False)  # fmt: skip
  cases = [
    (json.dumps({"actions": [0, 1], "rewards": [0, 0]}), "t.jsonl:1: missing field 'seed'"),
    (json.dumps({"actions": [0, 1], "rewards": [0, 0], "seed": 0, "episode": 3}),
     "does not regenerate"),
    ("{not json", "t.jsonl:1: not a JSON object"),
    ("", "no trajectories"),
  ]  # fmt: skip
  for text, fragment in cases:
    lines.write_text(text + "\n")
    with pytest.raises(HindsightError) as err:
      run_audit(base)
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)
  for bad, fragment in [
    (dict(alpha=1.5), r"^alpha must be in \(0, 1\)"),  # the library names the field
    (dict(env=env_arg), "exactly one of --env and --trajectories"),
    (dict(shares=(0.0, 0.5, 0.5)), "--shares"),
  ]:
    with pytest.raises(HindsightError, match=fragment):
      run_audit(dataclasses.replace(base, **bad))
  for d in "abc":
    assert not (tmp_path / d / "report.json").exists()


@pytest.mark.slow
@shares_the_run
def test_audit_of_logged_trajectories_regenerates_them(tabular_run, tmp_path):
  """An RL loop's log (JSONL with the keys it sampled from) is audited like --env."""
  env, policy = make(f"tabular:{MDP}")
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=16))
  traj = tr.sample_trajectories(labeler, 5, np.arange(20))
  eps = tr.episodes_from_trajectories(env, traj)
  path = tmp_path / "log.jsonl"
  with open(path, "w") as f:
    for i, e in enumerate(eps):
      f.write(json.dumps({"observations": e.observations.tolist(),
                          "actions": e.actions.tolist(), "rewards": e.rewards.tolist(),
                          "seed": 5, "episode": i, "env": f"tabular:{MDP}"}) + "\n")  # fmt: skip
  out = tmp_path / "audit"
  proc = run_cli("audit", "--checkpoint", tabular_run, "--trajectories", path, "--budget",
                 50_000, "--rollouts", 8, "--out", out, "--no-progress")  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  assert "audit of" in proc.stdout and "report:" in proc.stdout
  report = json.loads((out / "report.json").read_text())
  assert report["pool"]["kind"] == "file" and report["pool"]["episodes"] == 20
  # The pool is every step of the 20 logged episodes (policy replacement: all defined).
  assert report["pool"]["steps"] == int(np.asarray(traj.mask).sum())
  assert 0 < report["spent_env_steps"] <= 50_000 and report["draws"] > 0
  slices = {s["slice"] for s in report["slices"]}
  assert {"outcome: success", "position: first third"} & slices
  # What it audited is the very trajectories the loop sampled, full states included.
  spec, logged = pool_lib.read_trajectory_file(str(path), 0)
  pool = pool_lib.from_file(labeler, str(path), logged)
  assert spec == f"tabular:{MDP}"
  jax.tree.map(np.testing.assert_array_equal, pool.traj, traj)
  assert [e.success for e in pool.episodes] == [e.success for e in eps]
