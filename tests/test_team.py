"""The `team` environment: the planted structure comes back out of rollouts and labels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.credit import interaction, shapley, shapley_sampled
from hindsight.credit.coalition import memberships_to_index
from hindsight.envs import make
from hindsight.envs.team import CRITIC, PLANNER, RESEARCHER, SOLVER
from hindsight.errors import HindsightError
from hindsight.labeling import LabelConfig, Labeler, sample_episode, to_numpy
from hindsight.labeling.agents import coalition_values


def _episodes(env, policy, count, seed=0):
  keys = jax.random.split(jax.random.key(seed), count)
  sample = jax.vmap(
    lambda k: sample_episode(env, policy, env.default_params(), policy.default_params(), k)
  )
  return sample(keys)


@pytest.mark.parametrize("ablation", ["null", "resample"])
def test_agent_shapley_recovers_the_planted_roles(ablation):
  env, policy = make("team:p_error=1")  # every draft carries the error
  traj = _episodes(env, policy, 24)
  values = jax.jit(jax.vmap(lambda a, k: coalition_values(env, policy, a, k, 64, ablation)[0]))(
    traj.actions, jax.random.split(jax.random.key(1), 24)
  )
  phi = np.asarray(jax.vmap(shapley)(values))  # [E, 4]
  inter = np.asarray(jax.vmap(interaction)(values))  # [E, 4, 4]
  # Efficiency per episode; the planner (restating) earns exactly nothing.
  np.testing.assert_allclose(phi.sum(1), values[:, -1] - values[:, 0], atol=1e-5)
  np.testing.assert_array_equal(phi[:, PLANNER], 0.0)
  np.testing.assert_allclose(inter[:, PLANNER, SOLVER], 0.0, atol=1e-6)
  if ablation == "resample":
    # Against a fresh draw of their own policy, agents earn what their actual turns did
    # better than usual, of either sign: the three roles success needs earn credit in the
    # episodes that succeeded (measured: 0.14, 0.14, 0.17) and clearly less in the others.
    success = np.asarray(traj.rewards.sum(1)) > 0
    assert 4 <= success.sum() <= 20
    for role in (RESEARCHER, SOLVER, CRITIC):
      won, lost = phi[success, role].mean(), phi[~success, role].mean()
      assert won > 0.05 and won - lost > 0.1, (role, won, lost)
    return
  # Success needs researcher, solver and critic together (a unanimity game per episode).
  np.testing.assert_allclose(phi[:, SOLVER], phi[:, CRITIC], atol=1e-5)
  np.testing.assert_allclose(phi[:, RESEARCHER], phi[:, SOLVER], atol=1e-5)
  assert phi[:, SOLVER].mean() > 0.05
  # The critic is worth something only together with the solver whose error it repairs.
  assert inter[:, SOLVER, CRITIC].mean() > 0.05


def test_ten_agents_sampled_shapley_matches_exact():
  env, policy = make("team:agents=10,rounds=2")
  traj = _episodes(env, policy, 1, seed=3)
  actions, key = traj.actions[0], jax.random.key(7)
  exact_values, _ = jax.jit(lambda a: coalition_values(env, policy, a, key, 32))(actions)
  exact = np.asarray(shapley(exact_values))

  def value_fn(members):  # rollouts for just the coalitions the permutations visit
    return coalition_values(env, policy, actions, key, 32, masks=memberships_to_index(members))[0]

  mean, se = shapley_sampled(value_fn, 10, 64, jax.random.key(8))
  assert np.all(np.abs(np.asarray(mean) - exact) <= 4 * np.asarray(se) + 1e-6), (mean, se, exact)
  assert np.all(exact[[0, 4, 5, 6, 7, 8, 9]] == 0.0)  # the planners


def test_step_credit_inside_agents_shows_the_one_turn_that_mattered():
  env, policy = make("team")
  # K = 64: a critic act before any draft ties in every branch, and only from K = 64 on does
  # the tie bound (3/K of the return range [0, 1]) fit inside the 0.05 decorative tolerance.
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=64, replacement="policy_other"))
  traj, labels = to_numpy(labeler.sample_and_label(0, jnp.arange(48)))
  tags = labels["tags"][traj.mask]
  credit, klass = labels["credit"][traj.mask], labels["klass"][traj.mask]
  names = env.tag_names
  planner = np.isin(tags, [names.index("planner_act"), names.index("planner_chatter")])
  np.testing.assert_array_equal(credit[planner], 0.0)
  # A critic act matters exactly where it repairs: a draft exists and carries the error
  # (read from the state before the act). Every other act is decorative (nothing to repair),
  # every repair load-bearing; the docs' 90/10 split of the critic's acts follows.
  critic_act = tags == names.index("critic_act")
  before = jax.tree.map(lambda x: np.asarray(x)[:, : env.horizon][traj.mask], traj.states)
  repair = before.drafted & before.error
  assert repair[critic_act].sum() >= 3
  np.testing.assert_array_equal(klass[critic_act & ~repair], 0)  # decorative
  np.testing.assert_array_equal(klass[critic_act & repair], 1)  # load-bearing
  assert np.all(credit[critic_act & repair] > 0.05)
  decorative_share = float(np.mean(klass[critic_act] == 0))
  assert 0.82 <= decorative_share <= 0.96, decorative_share


def test_team_spec_errors():
  for spec, fragment in [("team:agents=3", "agents"), ("team:p_error=2", "p_error")]:
    with pytest.raises(HindsightError, match=fragment):
      make(spec)


def test_label_job_writes_agent_and_step_labels(tmp_path, capsys):
  from hindsight.cli import main
  from hindsight.data import open_labels

  out = str(tmp_path / "team")
  argv = ["label", "--env", "team", "--episodes", "16", "--rollouts", "16", "--out", out]
  assert main([*argv, "--replacement", "policy_other", "--no-progress"]) == 0
  labels = open_labels(out)
  assert labels.metadata.agent_names == ("0:planner", "1:researcher", "2:critic", "3:solver")
  for ex in labels:
    assert ex["agent_shapley"].shape == (4,) and ex["coalition_values"].shape == (16,)
    assert ex["agent_shapley"][PLANNER] == 0.0
    np.testing.assert_allclose(
      ex["agent_shapley"].sum(), ex["coalition_values"][-1] - ex["coalition_values"][0], atol=1e-5
    )
    np.testing.assert_array_equal(ex["agent"], np.arange(len(ex["actions"])) % 4)
  capsys.readouterr()
  assert main(["summary", out]) == 0
  text = capsys.readouterr().out
  assert "agent-level credit" in text and "2:critic x 3:solver" in text


@pytest.mark.slow
def test_credit_model_learns_agent_shapley_head_on_team_labels(tmp_path):
  """The credit model's agent head, end to end on a tiny team dataset (generic:smoke)."""
  from hindsight.cli import main
  from hindsight.config_io import load_config
  from hindsight.training import train_and_evaluate

  out = str(tmp_path / "team")
  argv = ["label", "--env", "team", "--episodes", "48", "--rollouts", "8", "--out", out]
  assert main([*argv, "--no-progress"]) == 0
  overrides = [
    f"data.labels_dir={out}",
    "data.num_buckets=1",
    "train.steps=300",
    "train.eval_every=100",
  ]
  report = train_and_evaluate(
    load_config("configs/generic.py:smoke", overrides), str(tmp_path / "w")
  )
  assert report["data_spec"]["num_agents"] == 4
  agent = report["agent"]
  assert agent["pairs"] == 4 * report["episodes"]["test"]
  # It learned the agent values: better than the best constant by a margin (measured 0.072
  # against 0.100), and it ranks the (episode, agent) pairs (measured Spearman 0.74).
  assert agent["mae"] < 0.85 * agent["constant_mae"], agent
  assert agent["spearman"] > 0.4, agent


def test_ten_agents_get_sampled_shapley_values_with_stderrs(tmp_path, capsys):
  """Beyond 8 agents the job samples agent orders (--permutations) instead of enumerating
  1024 coalitions: Shapley values and stderrs only, the planners' exactly 0, and within
  their stderrs of the enumerated values of the same episodes (independent rollouts)."""
  from hindsight.cli import main
  from hindsight.data import open_labels
  from hindsight.labeling.agents import agent_credit

  out = str(tmp_path / "team10")
  argv = ["label", "--env", "team:agents=10", "--episodes", "4", "--rollouts", "4"]
  assert main([*argv, "--permutations", "64", "--out", out, "--no-progress"]) == 0
  labels = open_labels(out)
  assert labels.metadata.shapley_permutations == 64
  env, policy = make("team:agents=10")
  exact = jax.jit(lambda a, k: agent_credit(env, policy, a, k, 64))
  for i, ex in enumerate(labels):
    assert ex["agent_shapley"].shape == (10,) and "coalition_values" not in ex
    assert np.all(ex["agent_shapley"][[PLANNER, *range(4, 10)]] == 0.0)
    ref = exact(jax.numpy.asarray(ex["actions"]), jax.random.key(100 + i))
    se = np.sqrt(ex["agent_shapley_stderr"] ** 2 + np.asarray(ref["agent_shapley_stderr"]) ** 2)
    assert np.all(np.abs(ex["agent_shapley"] - ref["agent_shapley"]) <= 4 * se + 1e-6), (ex, ref)
  capsys.readouterr()
  assert main(["summary", out]) == 0
  assert "sampled Shapley values" in capsys.readouterr().out
  assert main([*argv, "--permutations", "7", "--out", str(tmp_path / "bad")]) == 2
