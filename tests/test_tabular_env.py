"""The tabular environment: jitted step equals unjitted, branching reproduces, data file."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.envs import TabularEnv, key_corridor_mdp, load_tabular, random_mdp
from hindsight.labeling import continuation_return, sample_episode
from hindsight.policies import TabularPolicy


def test_jitted_step_equals_unjitted():
  env = TabularEnv(random_mdp(0))
  params = env.default_params()
  state = env.reset(jax.random.key(0), params)
  for i in range(5):
    key = jax.random.key(i)
    a = jnp.int32(i % env.num_actions)
    with jax.disable_jit():
      slow = env.step(key, state, a, params)
    fast = jax.jit(env.step)(key, state, a, params)
    jax.tree.map(np.testing.assert_array_equal, slow, fast)
    state = fast[0]


def test_transition_frequencies_match_P():
  mdp = random_mdp(1, num_states=4, num_actions=2)
  env = TabularEnv(mdp)
  params = env.default_params()
  state = env.reset(jax.random.key(0), params).replace(s=jnp.int32(1))
  keys = jax.random.split(jax.random.key(1), 40000)
  nxt = jax.vmap(lambda k: env.step(k, state, jnp.int32(1), params)[0].s)(keys)
  freq = np.bincount(np.asarray(nxt), minlength=4) / len(keys)
  np.testing.assert_allclose(freq, mdp.P[1, 1], atol=0.01)


def test_branches_share_random_numbers_and_done_states_return_zero():
  """Common random numbers: two first actions with the same transition row and reward give,
  under one continuation key, the same next state and so the very same continuation (equal
  returns, branch by branch), while a third action's branches differ; another key, another
  draw; a state after the end -> G = 0 and no steps."""
  mdp = random_mdp(2, num_states=6, num_actions=3, horizon=8, num_terminal=0)
  P, r = mdp.P.copy(), mdp.r.copy()
  P[:, 1], r[:, 1] = P[:, 0], r[:, 0]  # actions 0 and 1 are twins
  mdp = dataclasses.replace(mdp, P=P, r=r)
  env, policy = TabularEnv(mdp), TabularPolicy(mdp.pi)
  ep, pp = env.default_params(), policy.default_params()
  traj = sample_episode(env, policy, ep, pp, jax.random.key(5))
  s2 = jax.tree.map(lambda x: x[2], traj.states)
  roll = jax.jit(lambda s, a, k: continuation_return(env, policy, ep, pp, s, a, k)[:2])
  keys = jax.random.split(jax.random.key(9), 64)
  g0, n1 = jax.vmap(roll, (None, None, 0))(s2, jnp.int32(0), keys)
  g1, _ = jax.vmap(roll, (None, None, 0))(s2, jnp.int32(1), keys)
  g2, _ = jax.vmap(roll, (None, None, 0))(s2, jnp.int32(2), keys)
  np.testing.assert_array_equal(g0, g1)
  assert np.mean(np.asarray(g0) != np.asarray(g2)) > 0.5
  assert len(np.unique(np.asarray(g0))) > 1  # the keys do drive the continuation
  assert np.all(np.asarray(n1) == mdp.horizon - 2)  # no terminals: runs to the horizon
  done = s2.replace(done=jnp.bool_(True))
  g, n = roll(done, jnp.int32(0), keys[0])
  assert float(g) == 0.0 and int(n) == 0


def test_bundled_demo_mdp_is_the_generator_output():
  """data/key_corridor.npz is exactly key_corridor_mdp() (regenerate it if this fails)."""
  saved, fresh = load_tabular("data/key_corridor.npz"), key_corridor_mdp()
  for field in ("P", "r", "pi", "mu0", "terminal"):
    np.testing.assert_array_equal(getattr(saved, field), getattr(fresh, field))
  assert saved.horizon == fresh.horizon and saved.action_names == fresh.action_names
