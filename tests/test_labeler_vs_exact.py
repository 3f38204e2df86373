"""Monte Carlo labels held against the exact dynamic-programming oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from oracle_mdps import exact_fields
from scipy import stats

from hindsight.credit import classify, replacement_probs, z_value
from hindsight.envs import TabularEnv, random_mdp
from hindsight.labeling import LabelConfig, Labeler, to_numpy
from hindsight.policies import TabularPolicy

# Enough branches for the CLT: with common random numbers a branch difference is often 0
# and now and then large, and a small K underestimates that spread (see README).
K = 256
EPISODES = 200


def _oracle(mdp, traj, replacement, gamma=1.0):
  """Exact credit, credit_realized and progress of each step, from tests/oracle_mdps.py's
  backward induction (plain loops, written apart from the engine's hindsight.credit.exact)."""
  return exact_fields(mdp, traj, replacement, gamma)


# policy_no_repeat changes the continuation, which the DP oracle does not model.
@pytest.mark.parametrize("replacement", ("policy", "policy_other", "uniform", "null"))
def test_mc_matches_exact_in_z_score(replacement):
  """RMS of (MC - exact) / stderr over >= 500 steps lies in [0.8, 1.25], per field."""
  mdp = random_mdp(2, num_states=6, num_actions=3, horizon=8)
  labeler = Labeler(
    TabularEnv(mdp), TabularPolicy(mdp.pi), LabelConfig(num_rollouts=K, replacement=replacement)
  )
  traj, mc = to_numpy(labeler.sample_and_label(0, jnp.arange(EPISODES)))
  exact = _oracle(mdp, traj, replacement)
  m = traj.mask
  for field, truth in exact.items():
    est, se, truth = mc[field][m], mc[field + "_stderr"][m], truth[m]
    ok = se > 0
    # A zero stderr means every branch agreed (a_t is the null action itself, say): the
    # estimate must then be exact.
    np.testing.assert_allclose(est[~ok], truth[~ok], atol=1e-4)
    z = (est[ok] - truth[ok]) / se[ok]
    rms = float(np.sqrt(np.mean(z**2)))
    assert z.size >= 500, (field, z.size)
    assert 0.8 <= rms <= 1.25, (replacement, field, rms, z.size)


def test_exact_mode_matches_oracle():
  mdp = random_mdp(5, num_states=5, num_actions=3, horizon=6)
  labeler = Labeler(
    TabularEnv(mdp),
    TabularPolicy(mdp.pi),
    LabelConfig(num_rollouts=8, replacement="uniform", exact=True),
  )
  traj, ex = to_numpy(labeler.sample_and_label(0, jnp.arange(32)))
  oracle = _oracle(mdp, traj, "uniform")
  m = traj.mask
  for field in ("credit", "credit_realized", "progress"):
    np.testing.assert_allclose(ex[field][m], oracle[field][m], atol=1e-5)
    assert np.all(ex[field + "_stderr"][m] == 0)
    assert np.all(np.isnan(ex[field][~m]))
  assert set(np.unique(ex["phi_hard"][m])) <= {0.0, 1.0}


def test_policy_other_undefined_when_policy_is_deterministic():
  """pi(a_t | s_t) = 1 leaves nothing to renormalise: NaN credit and the flag set."""
  mdp = random_mdp(7, num_states=4, num_actions=3, horizon=5)
  pi = np.zeros_like(mdp.pi)
  pi[:, 0] = 1.0
  mdp = type(mdp)(**{**mdp.__dict__, "pi": pi})
  labeler = Labeler(
    TabularEnv(mdp), TabularPolicy(pi), LabelConfig(num_rollouts=4, replacement="policy_other")
  )
  traj, mc = to_numpy(labeler.sample_and_label(0, jnp.arange(8)))
  m = traj.mask
  assert mc["undefined"][m].all() and not mc["undefined"][~m].any()
  assert np.isnan(mc["credit"][m]).all()
  assert (mc["klass"][m] == 3).all()  # undetermined


def test_label_given_trajectories_matches_sampled():
  """The library call on saved trajectories gives the labels of the sampling path."""
  mdp = random_mdp(13, num_states=6, num_actions=3, horizon=7)
  labeler = Labeler(TabularEnv(mdp), TabularPolicy(mdp.pi), LabelConfig(num_rollouts=8))
  traj, labels = to_numpy(labeler.sample_and_label(0, jnp.arange(5)))
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(5))
  again = to_numpy(labeler.label(jax.tree.map(jnp.asarray, traj), keys))
  for field in ("credit", "progress", "phi_hard", "klass"):
    np.testing.assert_array_equal(again[field], labels[field])


@pytest.mark.parametrize("exact", [False, True], ids=["mc", "exact"])
def test_discounted_labels_match_the_discounted_oracle(exact):
  """gamma = 0.8: DP tables, Monte Carlo returns and progress all discount."""
  mdp = random_mdp(21, num_states=5, num_actions=3, horizon=8)
  config = LabelConfig(num_rollouts=K, replacement="uniform", gamma=0.8, exact=exact)
  labeler = Labeler(TabularEnv(mdp), TabularPolicy(mdp.pi), config)
  traj, labels = to_numpy(labeler.sample_and_label(0, jnp.arange(120)))
  truth, m = _oracle(mdp, traj, "uniform", gamma=0.8), traj.mask
  undiscounted = _oracle(mdp, traj, "uniform", gamma=1.0)
  for field in ("credit", "credit_realized", "progress"):
    est, se, want = labels[field][m], labels[field + "_stderr"][m], truth[field][m]
    if exact:
      np.testing.assert_allclose(est, want, atol=1e-5)
    else:
      z = (est - want) / se
      assert 0.8 <= np.sqrt(np.mean(z**2)) <= 1.25, field
    # ... and the discount matters here (else the test could not tell).
    assert np.abs(undiscounted[field][m] - want).max() > 0.1, field


def test_replacement_probs_by_hand():
  pi = jnp.array([0.5, 0.3, 0.2])
  legal = jnp.array([True, False, True])
  q, undefined = replacement_probs("policy", pi, legal, 1, 0)
  np.testing.assert_allclose(q, pi)
  q, _ = replacement_probs("policy_other", pi, legal, 0, 0)
  np.testing.assert_allclose(q, [0.0, 0.6, 0.4], rtol=1e-6)
  q, _ = replacement_probs("uniform", pi, legal, 0, 0)  # illegal actions get no mass
  np.testing.assert_allclose(q, [0.5, 0.0, 0.5])
  q, _ = replacement_probs("null", pi, legal, 0, 2)
  np.testing.assert_array_equal(q, [0.0, 0.0, 1.0])
  q, undefined = replacement_probs("policy_other", jnp.array([1.0, 0.0, 0.0]), legal, 0, 0)
  assert bool(undefined) and float(q.sum()) == 0.0


def test_klass_against_the_rule_written_out():
  """klass from the stored credit and stderr by the README's rule, written out here."""
  mdp = random_mdp(8, num_states=6, num_actions=3, horizon=6)
  config = LabelConfig(num_rollouts=64, replacement="policy", decorative_tolerance=0.3)
  labeler = Labeler(TabularEnv(mdp), TabularPolicy(mdp.pi), config)
  traj, labels = to_numpy(labeler.sample_and_label(0, jnp.arange(300)))
  m = traj.mask
  c, se = labels["credit"][m], labels["credit_stderr"][m]
  z = stats.norm.ppf(0.975)
  lo, hi = c - z * se, c + z * se
  expected = np.full(c.shape, 3)  # undetermined
  expected[(lo >= -0.3) & (hi <= 0.3)] = 0  # decorative
  expected[lo > 0.3] = 1  # load_bearing
  expected[hi < -0.3] = 2  # harmful
  np.testing.assert_array_equal(labels["klass"][m], expected)
  assert set(expected.tolist()) == {0, 1, 2, 3}  # every branch of the rule is exercised
  np.testing.assert_array_equal(
    np.asarray(classify(jnp.asarray(c), jnp.asarray(se), 0.3, z_value(0.95))), expected
  )


def test_phi_hard_against_the_exact_success_chance():
  """Key corridor: success is opening the door (return 1), so the chance that one
  continuation from s_{t+1} succeeds is p = V_{t+1}(s_{t+1}) by DP (1 once the door is
  open). phi_hard (any of K succeed) is then 0 where p = 0, 1 where p = 1, and its mean over
  the other steps is that of 1 - (1 - p)^K within sampling error."""
  from oracle_mdps import backward_induction

  from hindsight.envs import key_corridor_mdp

  mdp, K = key_corridor_mdp(), 4
  _, V = backward_induction(mdp)
  labeler = Labeler(TabularEnv(mdp), TabularPolicy(mdp.pi), LabelConfig(num_rollouts=K))
  traj, labels = to_numpy(labeler.sample_and_label(0, jnp.arange(300)))
  s, r, m = np.asarray(traj.states.s), traj.rewards, traj.mask
  p = []
  for e, t in zip(*np.nonzero(m), strict=True):
    opened = r[e, : t + 1].sum() > 0.5
    p.append(1.0 if opened else (V[t + 1, s[e, t + 1]] if t + 1 < mdp.horizon else 0.0))
  p, hard = np.asarray(p), labels["phi_hard"][m]
  np.testing.assert_array_equal(hard[p == 0], 0.0)
  np.testing.assert_array_equal(hard[p >= 1 - 1e-12], 1.0)
  mid = (p > 0) & (p < 1 - 1e-12)
  h = 1 - (1 - p[mid]) ** K
  assert mid.sum() > 1000
  zscore = (hard[mid].sum() - h.sum()) / np.sqrt(np.sum(h * (1 - h)))
  assert abs(zscore) < 4, zscore


def test_the_labelers_entry_points_have_help():
  """help(Labeler.sample_and_label) raised AttributeError: the jitted functions were set per
  instance. They are methods now, documented with their shapes."""
  import pydoc

  for name in ("sample_and_label", "sample", "label", "label_steps", "step_info"):
    text = pydoc.render_doc(getattr(Labeler, name), renderer=pydoc.plaintext)
    assert "[E" in text, (name, text)
