"""The drift harness's statistics against scipy, hand-computed values and known truths."""

import numpy as np
import pytest
from scipy import stats

from hindsight.credit.policy_gradient import (
  episode_gradients,
  exact_gradient,
  expected_return,
  gradient_stats,
  occupancy,
)
from hindsight.envs import random_mdp
from hindsight.metrics import drift as dm


def test_point_metrics_match_scipy_and_hand_values():
  rng = np.random.default_rng(0)
  ref = rng.normal(size=60)
  pred = ref + rng.normal(size=60)
  episode = np.repeat(np.arange(12), 5)
  steps = dm.EpisodeSteps(episode)
  per_ep = dm.per_episode(pred, ref, steps)
  got = dict(zip(dm.POINT_METRICS, dm.point_metrics(pred, ref, per_ep), strict=True))
  assert got["spearman"] == pytest.approx(stats.spearmanr(pred, ref).statistic)
  assert got["pearson"] == pytest.approx(stats.pearsonr(pred, ref).statistic)
  assert got["kendall"] == pytest.approx(stats.kendalltau(pred, ref).statistic)
  assert got["mae"] == pytest.approx(np.mean(np.abs(pred - ref)))
  assert got["rmse"] == pytest.approx(np.sqrt(np.mean((pred - ref) ** 2)))
  within = [
    stats.spearmanr(pred[i * 5 : i * 5 + 5], ref[i * 5 : i * 5 + 5]).statistic for i in range(12)
  ]
  assert got["within_spearman"] == pytest.approx(np.mean(within))


def test_pairwise_accuracy_by_hand():
  ref = np.array([0.0, 1.0, 2.0, 2.0])
  # Pairs with ref differing: (0,1) (0,2) (0,3) (1,2) (1,3) = 5. pred orders (0,1) wrong,
  # ties (2,3)-(1,x)? pred = [1, 0, 2, 2]: (0,1) wrong, (0,2) right, (0,3) right,
  # (1,2) right, (1,3) right -> 4 / 5.
  correct, pairs = dm.pairwise_counts(np.array([1.0, 0.0, 2.0, 2.0]), ref)
  assert (correct, pairs) == (4.0, 5)
  # A tie in the prediction counts one half.
  correct, pairs = dm.pairwise_counts(np.array([0.0, 0.0, 1.0, 1.0]), ref)
  assert (correct, pairs) == (4.5, 5)


def test_episode_resampling_gathers_whole_episodes():
  episode = np.array([2, 0, 1, 0, 2, 2])
  steps = dm.EpisodeSteps(episode)
  sel = steps.gather(np.array([2, 2, 0]))  # episode ids 2, 2, 0 (positions in ids)
  assert sorted(episode[sel].tolist()) == [0, 0, 2, 2, 2, 2, 2, 2]


def test_bootstrap_ci_covers_a_known_mean_at_about_its_nominal_rate():
  rng = np.random.default_rng(1)
  hits, trials = 0, 120
  for trial in range(trials):
    x = rng.normal(loc=3.0, size=40)
    _, lo, hi, _ = dm.bootstrap(40, lambda idx, x=x: [np.mean(x[idx])], 300, seed=trial)
    hits += lo[0] <= 3.0 <= hi[0]
  # 95% nominal; percentile intervals of n = 40 run a little narrow (binomial sd ~ 0.02).
  assert 0.87 <= hits / trials <= 0.99, hits / trials


def test_equivalent_rollouts_recovered_for_a_synthetic_predictor():
  """Labels at K_L = 64 and a predictor whose error variance equals a K = 16 label's: the
  estimate recovers 16, with the reference's own noise subtracted."""
  rng = np.random.default_rng(2)
  n, sigma = 200_000, 1.0
  truth = rng.normal(size=n)
  ref_se = np.full(n, 0.05)
  ref = truth + rng.normal(size=n) * ref_se
  labels = truth + rng.normal(size=n) * sigma / np.sqrt(64)
  model = truth + rng.normal(size=n) * sigma / np.sqrt(16)
  k = dm.equivalent_rollouts((model - ref) ** 2, (labels - ref) ** 2, ref_se**2, 64)
  assert k == pytest.approx(16, rel=0.05)


def test_pit_coverage_of_a_calibrated_mixture_is_nominal():
  rng = np.random.default_rng(3)
  n = 100_000
  p0 = rng.uniform(0, 0.6, n)
  mu, sigma = rng.normal(size=n), rng.uniform(0.5, 2, n)
  y = np.where(rng.random(n) < p0, 0.0, mu + sigma * rng.normal(size=n))
  cov = dm.coverage(dm.pit(y, p0, mu, sigma), dm.RELIABILITY_LEVELS)
  np.testing.assert_allclose(cov, dm.RELIABILITY_LEVELS, atol=0.01)
  # Over-confident (sigma halved): the 80% interval covers far less.
  assert dm.coverage(dm.pit(y, p0, mu, sigma / 2), (0.8,))[0] < 0.7
  # Under-confident (sigma doubled): the 50% interval covers far more.
  assert dm.coverage(dm.pit(y, p0, mu, sigma * 2), (0.5,))[0] > 0.6


def test_confusion_by_hand():
  m = dm.confusion(np.array([0, 1, 1, 2]), np.array([0, 1, 2, 2]), 4)
  assert m[0, 0] == 1 and m[1, 1] == 1 and m[2, 1] == 1 and m[2, 2] == 1 and m.sum() == 4


def test_exact_policy_gradient_matches_finite_differences():
  mdp = random_mdp(4, num_states=5, num_actions=3, horizon=6)
  assert np.all(mdp.pi > 0)
  logits = np.log(mdp.pi)
  g = exact_gradient(mdp)
  eps = 1e-6
  fd = np.zeros_like(g)
  for s in range(mdp.num_states):
    for a in range(mdp.num_actions):
      up, down = logits.copy(), logits.copy()
      up[s, a] += eps
      down[s, a] -= eps
      fd[s, a] = (expected_return(mdp, up) - expected_return(mdp, down)) / (2 * eps)
  np.testing.assert_allclose(g, fd, atol=1e-6)
  # Occupancies are probabilities of a running episode: at most 1 per step.
  assert np.all(occupancy(mdp).sum(1) <= 1 + 1e-9)


def test_reinforce_estimator_is_unbiased_and_stats_follow_their_definitions():
  """Monte Carlo episodes of a random MDP: REINFORCE (credit G_t) averages to the exact
  gradient within its sampling floor; a scaled copy shows the bias it was given."""
  mdp = random_mdp(5, num_states=4, num_actions=3, horizon=5, num_terminal=0)
  rng = np.random.default_rng(0)
  N, H = 20_000, mdp.horizon
  states = np.zeros((N, H), int)
  actions = np.zeros((N, H), int)
  rewards = np.zeros((N, H))
  s = rng.choice(mdp.num_states, size=N, p=mdp.mu0)
  for t in range(H):
    a = (rng.random(N)[:, None] > np.cumsum(mdp.pi[s], 1)).sum(1)
    states[:, t], actions[:, t], rewards[:, t] = s, a, mdp.r[s, a]
    nxt = (rng.random(N)[:, None] > np.cumsum(mdp.P[s, a], 1)).sum(1)
    s = nxt
  g_t = np.flip(np.cumsum(np.flip(rewards, 1), 1), 1)
  mask = np.ones((N, H), bool)
  g = episode_gradients(states, actions, mask, g_t, mdp.pi)
  g_star = exact_gradient(mdp).reshape(-1)
  st = gradient_stats(g, g_star)
  assert st["bias_db"] < st["bias_floor_db"] + 6, st
  biased = gradient_stats(g * 1.5, g_star)  # E g = 1.5 g*: |g* - E g| / |g*| = 0.5
  assert biased["bias_db"] == pytest.approx(20 * np.log10(0.5), abs=1.0)
  snr = 10 * np.log10(np.sum(g_star**2) / np.mean(np.sum((g - g_star) ** 2, 1)))
  assert st["snr_db"] == pytest.approx(snr)
  assert st["variance"] == pytest.approx(np.mean(g.var(0, ddof=1)) / np.mean(g_star**2))
