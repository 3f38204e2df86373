"""gymnax environments inside the jitted labeler (`--env gymnax:ID`, `--policy MODULE:FN`)."""

import jax
import numpy as np
import pytest

pytest.importorskip("gymnax")

from conftest import assert_one_line_error, run_cli

from hindsight.envs.gymnax_env import make_gymnax
from hindsight.labeling import LabelConfig, Labeler, to_numpy


def _label(spec, episodes, rollouts, policy=None, horizon=None, return_range=None):
  env, pi = make_gymnax(spec, policy, horizon, return_range)
  labeler = Labeler(env, pi, LabelConfig(num_rollouts=rollouts, replacement="uniform"))
  return env, pi, *to_numpy(labeler.sample_and_label(0, jax.numpy.arange(episodes)))


def test_umbrella_chain_credit_is_the_first_action_only():
  """bsuite's UmbrellaChain: the first action decides the final +-1, every later reward is
  noise shared by the arms (common random numbers). So credit is +-1 at t = 0 (whether a_0
  matches the need; scale 1 - q(a_0) = 1/2 of a paired difference of 2) and exactly 0 after."""
  env, _, traj, lab = _label("gymnax:UmbrellaChain-bsuite", 32, 4, horizon=10,
                             return_range=(-10.0, 10.0))  # fmt: skip
  need = np.asarray(traj.states.env_state.need_umbrella)[:, 0]
  a0 = traj.actions[:, 0]
  np.testing.assert_array_equal(lab["credit"][:, 0], np.where(a0 == need, 1.0, -1.0))
  assert np.all(lab["credit"][:, 1:] == 0.0)
  # Ties everywhere: the stderr is the tie bound of the declared range, never 0.
  assert np.all(lab["credit_bounded"]) and np.all(lab["credit_stderr"] > 0)
  assert env.horizon == 10 and np.all(traj.mask)


def test_memory_chain_credit_is_at_the_last_step():
  """MemoryChain: the context shown at t = 0 must be repeated by the last action."""
  _, _, traj, lab = _label("gymnax:MemoryChain-bsuite", 16, 4, horizon=8)
  T = int(traj.mask[0].sum())
  assert T == 6 and np.all(traj.mask.sum(1) == T)  # memory_length 5: six steps
  # Under `uniform` on two actions credit is the last step's reward: +1 where the answer
  # a_{T-1} is the queried context bit, -1 where it is not (computed here from the state).
  es = traj.states.env_state
  context, query = np.asarray(es.context)[:, 0], np.asarray(es.query)[:, 0]
  answer = np.take_along_axis(context, query[:, None], 1)[:, 0] if context.ndim > 1 else context
  want = np.where(traj.actions[:, T - 1] == answer, 1.0, -1.0)
  assert 0 < (want > 0).sum() < want.size  # both outcomes occur among the episodes
  np.testing.assert_array_equal(lab["credit"][:, T - 1], want)
  assert np.all(lab["credit"][:, : T - 1] == 0.0)


@pytest.mark.parametrize(("name", "p_take"), [("umbrella_logits", 0.8808), ("umbrella_probs", 0.9)])
def test_jax_policies_give_probabilities_or_logits(name, p_take):
  env, pi, _, _ = _label("gymnax:UmbrellaChain-bsuite", 1, 2, policy=f"adapter_policies:{name}",
                         horizon=10)  # fmt: skip
  state = env.reset(jax.random.key(0), env.default_params())
  probs = np.asarray(pi.probs(pi.default_params(), state, env.default_params()))
  np.testing.assert_allclose(probs, [1 - p_take, p_take], atol=1e-4)


def test_bad_gymnax_specs_are_one_line_errors(tmp_path):
  out = str(tmp_path / "x")
  proc = run_cli("label", "--env", "gymnax:NoSuchEnv-v0", "--episodes", "2", "--out", out)
  assert_one_line_error(proc, "gymnax:NoSuchEnv-v0")
  proc = run_cli("label", "--env", "gymnax:CartPole-v1", "--episodes", "2", "--out", out,
                 "--policy", "adapter_policies:no_such_fn")  # fmt: skip
  assert_one_line_error(proc, "--policy")


def test_gymnax_label_through_the_cli_reruns_and_resumes_with_a_return_range(tmp_path):
  """`hindsight label --env gymnax:...` end to end, and the rerun of the identical command
  (a return range in it) into the same --out is accepted and changes nothing."""
  import json

  from hindsight.data import open_labels
  from hindsight.labeling import LabelJob

  job = LabelJob("gymnax:MemoryChain-bsuite", 4, LabelConfig(), return_range=(-1.0, 1.0))
  assert job.describe() == json.loads(json.dumps(job.describe()))  # survives its metadata
  out = str(tmp_path / "memory")
  argv = ["label", "--env", "gymnax:MemoryChain-bsuite", "--episodes", "8", "--rollouts", "4",
          "--replacement", "uniform", "--horizon", "8", "--return-range=-1:1", "--out", out,
          "--no-progress"]  # fmt: skip
  first = run_cli(*argv)
  assert first.returncode == 0, first.stderr
  labels = open_labels(out)
  credit = np.stack([np.asarray(labels[i]["credit"]) for i in range(8)])
  assert credit.shape == (8, 6) and np.all(np.abs(credit[:, 5]) == 1.0)
  assert np.all(credit[:, :5] == 0.0)
  again = run_cli(*argv)
  assert again.returncode == 0, again.stderr
  same = np.stack([np.asarray(open_labels(out)[i]["credit"]) for i in range(8)])
  np.testing.assert_array_equal(same, credit)


def test_discounting_chain_credit_is_the_choice_of_chain_only():
  """DiscountingChain: a_0 picks a chain whose reward comes at its own step; nothing later
  matters. Credit is exactly 0 after t = 0, and at t = 0 it is R(a_0) - mean_a R(a) (R(a):
  chain a's reward if it arrives within the horizon), within the labels' stderr."""
  H = 12
  _, _, traj, lab = _label("gymnax:DiscountingChain-bsuite", 32, 32, horizon=H,
                           return_range=(-1.0, 2.0))  # fmt: skip
  assert np.all(lab["credit"][:, 1:][traj.mask[:, 1:]] == 0.0)
  es = traj.states.env_state
  rewards = np.asarray(es.rewards)[:, 0]  # [E, 5], drawn at reset
  reward_steps = np.array([1, 3, 10, 30, 100])
  R = np.where(reward_steps[None] < H, rewards, 0.0)  # [E, 5]
  a0 = traj.actions[:, 0]
  exact = R[np.arange(a0.size), a0] - R.mean(1)
  z = (lab["credit"][:, 0] - exact) / np.maximum(lab["credit_stderr"][:, 0], 1e-9)
  assert np.sqrt(np.mean(z**2)) < 2.0 and np.mean(np.abs(exact) > 1e-3) > 0.5, (z, exact)
