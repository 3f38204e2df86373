"""Monte Carlo labels held against the exact dynamic-programming oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.credit import exact_step_credit, replacement_probs, tabular_values
from hindsight.envs import TabularEnv, random_mdp
from hindsight.labeling import LabelConfig, Labeler, to_numpy
from hindsight.policies import TabularPolicy

# Enough branches for the CLT: with common random numbers a branch difference is often 0
# and now and then large, and a small K underestimates that spread (see README).
K = 256
EPISODES = 200


def _oracle(mdp, traj, replacement):
  """Exact credit, credit_realized and progress of each step, straight from the DP tables
  (NumPy; independent of the engine's own exact mode)."""
  Q, V = tabular_values(mdp)
  s, a, r, m = traj.states.s, traj.actions, traj.rewards, traj.mask
  E, H = a.shape
  out = {k: np.full((E, H), np.nan) for k in ("credit", "credit_realized", "progress")}
  for e in range(E):
    T = int(m[e].sum())
    g = np.cumsum(r[e, :T][::-1])[::-1]
    for t in range(T):
      q, _ = replacement_probs(replacement, mdp.pi[s[e, t]], np.ones(3, bool), a[e, t], 0)
      c, cr = exact_step_credit(np.asarray(q), Q[t, s[e, t]], a[e, t], g[t])
      out["credit"][e, t], out["credit_realized"][e, t] = c, cr
      v_next = V[t + 1, s[e, t + 1]] if t + 1 < T else 0.0
      out["progress"][e, t] = r[e, t] + v_next - V[t, s[e, t]]
  return out


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
