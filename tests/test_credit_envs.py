"""key_to_door and reasoning: environments where credit is known by construction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.envs import make
from hindsight.errors import HindsightError
from hindsight.labeling import LabelConfig, Labeler, sample_episode, to_numpy


@pytest.mark.parametrize("spec", ["key_to_door", "reasoning"])
def test_jitted_step_equals_unjitted_and_replay_reproduces(spec):
  env, policy = make(spec)
  ep, pp = env.default_params(), policy.default_params()
  traj = sample_episode(env, policy, ep, pp, jax.random.key(3))
  step = jax.jit(env.step)
  for t in range(0, int(traj.mask.sum()), 7):
    s_t = jax.tree.map(lambda x, t=t: x[t], traj.states)
    key = jax.random.key(t)
    with jax.disable_jit():
      slow = env.step(key, s_t, traj.actions[t], ep)
    jax.tree.map(np.testing.assert_array_equal, slow, step(key, s_t, traj.actions[t], ep))
  # Branching from a mid-episode state with the episode's own keys reproduces it exactly.
  again = sample_episode(env, policy, ep, pp, jax.random.key(3))
  jax.tree.map(np.testing.assert_array_equal, traj, again)
  mid = 5
  steps_key = jax.random.split(jax.random.key(3))[1]
  state = jax.tree.map(lambda x: x[mid], traj.states)
  for t in range(mid, min(int(traj.mask.sum()), mid + 10)):
    _, k_env = jax.random.split(jax.random.fold_in(steps_key, state.time))
    state, reward, _ = env.step(k_env, state, traj.actions[t], ep)
    assert float(reward) == float(traj.rewards[t])
    jax.tree.map(
      np.testing.assert_array_equal, state, jax.tree.map(lambda x, t=t: x[t + 1], traj.states)
    )


def _per_tag(env, traj, labels):
  m = traj.mask
  out = {}
  for i, name in enumerate(env.tag_names):
    sel = m & (labels["tags"] == i)
    c = labels["credit"][sel]
    c = c[~np.isnan(c)]
    if c.size > 1:
      out[name] = (c.mean(), c.std(ddof=1) / np.sqrt(c.size), c.size)
  return out


@pytest.fixture(scope="module")
def reasoning_labels():
  """Per-tag credit of `reasoning` under policy and policy_no_repeat (compiled once each)."""
  env, policy = make("reasoning")
  out = {}
  for rep in ("policy", "policy_no_repeat"):
    labeler = Labeler(env, policy, LabelConfig(num_rollouts=16, replacement=rep))
    traj, labels = to_numpy(labeler.sample_and_label(0, jnp.arange(384)))
    out[rep] = _per_tag(env, traj, labels)
  return out


# One worker runs both, so the module fixture is computed once (make test: --dist loadgroup).
@pytest.mark.xdist_group("reasoning")
def test_reasoning_classes_by_construction(reasoning_labels):
  tags = reasoning_labels["policy"]
  z = 1.96
  fact, hyp = tags["fact"], tags["wrong_hypothesis"]
  assert fact[0] - z * fact[1] > 0, fact
  assert hyp[0] + z * hyp[1] < 0, hyp
  # Decorative steps cost a step's time and no more: their per-tag means agree with the
  # 2,048-episode figures of envs/reasoning.py's table (restate -0.010 +- 0.002, verify
  # -0.006 +- 0.002) within 3 combined standard errors, and are a fraction of a fact's.
  for name, documented in (("restate", -0.010), ("verify", -0.006)):
    mean, se, _ = tags[name]
    assert abs(mean - documented) < 3 * np.hypot(se, 0.002), (name, tags[name])
    assert abs(mean) < fact[0] / 2, (name, tags[name], fact)


@pytest.mark.xdist_group("reasoning")
def test_policy_no_repeat_differs_from_policy_for_redundant_facts(reasoning_labels):
  """The policy re-fetches forgotten facts: forbidding the repeat makes facts matter."""
  (m_p, se_p, _), (m_n, se_n, _) = (reasoning_labels[r]["fact"] for r in reasoning_labels)
  assert m_n - m_p > 5 * np.hypot(se_p, se_n), reasoning_labels


def test_key_to_door_key_carries_the_door_and_apples_only_themselves():
  env, policy = make("key_to_door")
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=8, replacement="policy_other"))
  traj, labels = to_numpy(labeler.sample_and_label(0, jnp.arange(24)))
  m = traj.mask
  key = m & (labels["tags"] == env.tag_names.index("key"))
  apple = m & (labels["tags"] == env.tag_names.index("apple"))
  door_value = 10.0
  assert key.sum() >= 5 and apple.sum() >= 20
  assert labels["credit"][key].mean() > 0.7 * door_value, labels["credit"][key]
  # An eaten apple is worth its own reward, nothing of the door's.
  np.testing.assert_allclose(labels["credit"][apple], traj.rewards[apple], atol=1e-3)


def test_policy_no_repeat_needs_action_classes(mdp_file):
  from hindsight.envs import TabularEnv, load_tabular
  from hindsight.policies import TabularPolicy

  mdp = load_tabular(mdp_file)
  with pytest.raises(HindsightError, match="declares none"):
    Labeler(TabularEnv(mdp), TabularPolicy(mdp.pi), LabelConfig(replacement="policy_no_repeat"))


def test_env_spec_options():
  _, policy = make("key_to_door:p_key=0.9")
  assert float(policy.default_params()[0, 3]) == pytest.approx(0.9)
  with pytest.raises(HindsightError, match="unknown option"):
    make("key_to_door:speed=2")
  with pytest.raises(HindsightError, match="must be a number"):
    make("reasoning:decorative_rate=lots")
  # The competence oracle: the latent appended to the observation, nothing else changed.
  shown, plain = make("reasoning:show_competence=1")[0], make("reasoning")[0]
  key = jax.random.key(3)
  s_shown, s_plain = shown.reset(key, shown.default_params()), plain.reset(key, None)
  o_shown = shown.observation(s_shown, None)
  assert o_shown.shape == (8,) and float(o_shown[-1]) == float(s_shown.competence)
  np.testing.assert_array_equal(o_shown[:-1], plain.observation(s_plain, None))
  with pytest.raises(HindsightError, match="show_competence must be 0 or 1"):
    make("reasoning:show_competence=0.5")
