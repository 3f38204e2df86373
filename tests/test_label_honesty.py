"""Labels never claim a certainty they do not have (issue: stratify on a' = a_t, no false zeros).

Held against the dynamic-programming oracle of tests/oracle_mdps.py (written apart from the
engine) on MDPs where the plain estimator failed: a policy that puts 0.96 on one action
(most replacement draws under `policy` were a_t itself), sparse rewards (most branch
differences tie at 0), and a corridor the policy finishes 1.35% of the time.
"""

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from oracle_mdps import exact_fields

from hindsight.credit.estimators import bounded_mean_stderr, tie_upper_rates, z_value
from hindsight.envs import TabularEnv, peaked_mdp, rare_success_mdp
from hindsight.labeling import LabelConfig, Labeler, to_numpy
from hindsight.metrics import label_honesty
from hindsight.policies import TabularPolicy

FIELDS = ("credit", "credit_realized", "progress")


def _label(mdp, replacement, K, episodes=200, stratify=True):
  labeler = Labeler(
    TabularEnv(mdp),
    TabularPolicy(mdp.pi),
    LabelConfig(num_rollouts=K, replacement=replacement, stratify=stratify),
  )
  traj, labels = to_numpy(labeler.sample_and_label(0, jnp.arange(episodes)))
  return traj, labels, exact_fields(mdp, traj, replacement)


def _report(traj, labels, truth):
  m = traj.mask
  return {
    f: label_honesty(labels[f][m], labels[f + "_stderr"][m], truth[f][m], labels[f + "_bounded"][m])
    for f in FIELDS
  }


@pytest.mark.parametrize("K", (16, 32, 128))
@pytest.mark.parametrize("replacement", ("policy", "uniform"))
def test_peaked_policy_z_scores_are_honest(replacement, K):
  """pi(a_t|s_t) = 0.96 on most steps: no false exact label, z-score RMS in [0.8, 1.25]."""
  traj, labels, truth = _label(peaked_mdp(1), replacement, K)
  for field, r in _report(traj, labels, truth).items():
    assert r["false_exact"] == 0, (field, r)
    assert r["sampled"] >= 1000, (field, r)
    assert 0.8 <= r["z_rms"] <= 1.25, (field, r)
    if r["bounded"] >= 20:
      assert r["bounded_coverage"] >= 0.95, (field, r)


@pytest.mark.parametrize(
  ("mdp_name", "replacement", "K"),
  [
    ("sparse", "policy", 16),
    ("sparse", "uniform", 32),
    ("sparse", "policy", 128),
    ("rare", "policy", 64),
    ("rare", "uniform", 64),
  ],
)
def test_ties_and_rare_successes_get_conservative_intervals(mdp_name, replacement, K):
  """Sparse rewards and a 1.35% success: every step that ties gets the tie bound, which
  covers the truth; the steps with a sample stderr keep honest z-scores."""
  mdp = peaked_mdp(1, sparse=True) if mdp_name == "sparse" else rare_success_mdp()
  traj, labels, truth = _label(mdp, replacement, K)
  credit = _report(traj, labels, truth)["credit"]
  for field, r in _report(traj, labels, truth).items():
    assert r["false_exact"] == 0, (field, r)
    assert r["bounded"] >= 100, (field, r)  # the situation under test does arise
    assert r["bounded_coverage"] >= 0.95, (field, r)
    if r["sampled"] >= 50:
      assert 0.8 <= r["z_rms"] <= 1.25, (field, r)
  assert credit["sampled"] >= 50, credit


def test_exact_zero_only_where_the_arms_cannot_differ():
  """A stderr of 0 comes with an error of 0: q(a_t) = 1, or a state whose return cannot vary
  (on the rare corridor, states from which the door is out of reach in the time left)."""
  traj, labels, truth = _label(rare_success_mdp(), "policy", 16)
  m = traj.mask
  for f in FIELDS:
    zero = labels[f + "_stderr"][m] == 0
    assert zero.any()
    np.testing.assert_allclose(labels[f][m][zero], truth[f][m][zero], atol=1e-5)


def test_stratified_variance_is_never_larger():
  """Same trajectories, same keys, K = 1024: the stratified stderr is at most the plain one
  on every step (up to the sampling noise of a stderr), and far below it where pi is peaked."""
  mdp = peaked_mdp(0)
  env, policy = TabularEnv(mdp), TabularPolicy(mdp.pi)
  keys = jnp.arange(150)
  se = {}
  for stratify in (True, False):
    config = LabelConfig(num_rollouts=1024, replacement="policy", stratify=stratify)
    traj, labels = to_numpy(Labeler(env, policy, config).sample_and_label(0, keys))
    se[stratify] = labels["credit_stderr"][traj.mask]
  both = (se[True] > 0) & (se[False] > 0)
  assert both.sum() >= 300, both.sum()
  ratio = se[True][both] / se[False][both]
  assert ratio.max() <= 1.1, np.sort(ratio)[-5:]
  assert np.median(ratio) <= 0.5, np.median(ratio)


def test_bounded_mean_stderr_rule():
  """The tie bound by hand: all K = 20 samples at 0 in [-1, 1] give p+ = 1 - 0.05^(1/20)."""
  K, z = 20, z_value(0.95)
  rates = jnp.asarray(tie_upper_rates(K, 0.95))
  assert float(rates[0]) == pytest.approx(1 - 0.05 ** (1 / K), rel=1e-5)
  mean, se, bounded = bounded_mean_stderr(jnp.zeros(K), -1.0, 1.0, rates, z)
  assert float(mean) == 0 and bool(bounded)
  assert float(se) == pytest.approx(float(rates[0]) / z, rel=1e-5)
  # Width 0 (nothing can vary): exact.
  _, se0, _ = bounded_mean_stderr(jnp.zeros(K), 0.0, 0.0, rates, z)
  assert float(se0) == 0
  # Unknown range: a tie is not evidence of anything.
  _, se_inf, _ = bounded_mean_stderr(jnp.zeros(K), -jnp.inf, jnp.inf, rates, z)
  assert np.isinf(float(se_inf))
  # Enough samples off the tie: the sample stderr, untouched.
  x = jnp.concatenate([jnp.zeros(K - 8), jnp.linspace(0.1, 0.8, 8)])
  _, se_x, bounded_x = bounded_mean_stderr(x, -1.0, 1.0, rates, z)
  assert not bool(bounded_x)
  assert float(se_x) == pytest.approx(float(np.std(np.asarray(x), ddof=1) / np.sqrt(K)), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("return_range", [(0.0, 1.0), None], ids=["declared", "from-data"])
def test_frozen_lake_through_the_adapter(return_range):
  """Slippery FrozenLake (the uniform policy succeeds 1.4% of the time) through the Gymnasium
  adapter, against the DP over the environment's own transition table: no false zeros, and
  intervals that cover (before: 788 of 2,112 steps were 0 +- 0, and every branch of a step
  replayed the same slips)."""
  from oracle_mdps import backward_induction, frozen_lake_mdp

  from hindsight.labeling.py_labeler import PyJob, label_episodes

  H, episodes = 30, 12
  Q, _ = backward_induction(frozen_lake_mdp(H))
  config = LabelConfig(num_rollouts=64, replacement="uniform")
  job = PyJob("gymnasium:FrozenLake-v1", None, H, config, 0, return_range=return_range)
  out = label_episodes(job, range(episodes))
  m = out["mask"]
  s, a = out["observations"][..., 0].astype(int), out["actions"]
  t = np.broadcast_to(np.arange(H), m.shape)
  truth = Q[t, s, a] - Q[t, s].mean(-1)
  r = label_honesty(out["credit"][m], out["credit_stderr"][m], truth[m], out["credit_bounded"][m])
  assert r["false_exact"] == 0 and r["exact_share"] == 0, r
  assert np.all(np.abs(truth[m]) > 0)  # every step's credit is nonzero here
  assert r["bounded"] >= 30 and r["bounded_coverage"] >= 0.95, r
  # The steps outside the tie bound carry a sample stderr: they exist (5 of 77 here) and
  # their intervals cover as well (at most one miss).
  assert r["sampled"] >= 5 and r["coverage"] >= 0.8, r
  assert r["sampled"] + r["bounded"] == r["steps"] == m.sum(), r


def _path_extremes(mdp, t, s, first=True):
  """(min, max) undiscounted return-to-go over every path with positive probability from
  (t, s): any first action, then the actions pi takes (brute force, for tiny MDPs)."""
  if t >= mdp.horizon:
    return 0.0, 0.0
  lo, hi = np.inf, -np.inf
  for a in range(mdp.num_actions):
    if not first and mdp.pi[s, a] == 0:
      continue
    for n in np.flatnonzero(mdp.P[s, a] > 0):
      end = mdp.terminal[n] or t + 1 == mdp.horizon
      rest = (0.0, 0.0) if end else _path_extremes(mdp, t + 1, n, first=False)
      lo, hi = min(lo, mdp.r[s, a] + rest[0]), max(hi, mdp.r[s, a] + rest[1])
  return lo, hi


@pytest.mark.parametrize("nonnegative", (True, False))
def test_tabular_return_bounds_hold_every_path(nonnegative):
  import dataclasses

  from hindsight.envs import random_mdp
  from hindsight.envs.tabular import return_bound_table

  mdp = random_mdp(4, num_states=4, num_actions=2, horizon=4, branching=2)
  pi = mdp.pi.copy()
  pi[0] = [1.0, 0.0]  # an action pi never takes later, but a replacement may take first
  r = np.abs(mdp.r) if nonnegative else mdp.r
  mdp = dataclasses.replace(mdp, pi=pi, r=r)
  table = return_bound_table(mdp)
  for t in range(mdp.horizon):
    for s in range(mdp.num_states):
      lo, hi = _path_extremes(mdp, t, s)
      assert table[t, s, 0] <= lo + 1e-9 and table[t, s, 1] >= hi - 1e-9, (t, s)
      if nonnegative:  # then the bounds are tight
        assert table[t, s, 1] == pytest.approx(hi) and table[t, s, 0] == 0.0


def test_return_range_flag_errors(mdp_file):
  from conftest import assert_one_line_error, run_cli

  base = ("label", "--episodes", "2", "--out", "/tmp/unused_out")
  proc = run_cli(*base, "--env", f"tabular:{mdp_file}", "--return-range", "0:1")
  assert_one_line_error(proc, "--return-range", "gymnasium")
  proc = run_cli(*base, "--env", "gymnasium:FrozenLake-v1", "--return-range", "1")
  assert_one_line_error(proc, "--return-range", "LO:HI")
  proc = run_cli(*base, "--env", "gymnasium:FrozenLake-v1", "--return-range", "1:0")
  assert_one_line_error(proc, "--return-range", "LO <= HI")


SMOKE_ARGS = ("--episodes", "8", "--rollouts", "4", "--scenarios", "rare")


def test_label_honesty_program_smoke():
  """`eval/label_honesty.py` (the README's command) runs and prints a row per (q, K)."""
  from conftest import FAST_COMPILE, ROOT

  proc = subprocess.run(
    [sys.executable, "eval/label_honesty.py", *SMOKE_ARGS],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=ROOT,
    env={**os.environ, "XLA_FLAGS": FAST_COMPILE},
  )
  assert proc.returncode == 0, proc.stderr
  rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("rare")]
  assert [row[1] for row in rows] == ["policy", "uniform"]
  assert all(row[4] == "0" for row in rows), proc.stdout  # no false exact zero
