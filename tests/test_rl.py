"""RL with credit: the learner, every credit source, resumption, the credit-model swap."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import page_module, run_cli

from hindsight.envs import make
from hindsight.envs.reasoning import competence_features
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.engine import Labeler
from hindsight.policies.neural import NeuralPolicy
from hindsight.rl.config import base_config, smoke
from hindsight.rl.load import load_policy
from hindsight.rl.ppo import Programs
from hindsight.rl.sources import CreditSource, prepare, registered_sources
from hindsight.rl.task import make_task
from hindsight.rl.trainer import seed_keys, train_and_evaluate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny(source: str, **over) -> object:
  """key_corridor from a uniform policy: any working signal learns to walk to the door."""
  c = smoke(base_config())
  c.env, c.source = "key_corridor", source
  c.policy.prior = False
  c.ppo.updates, c.ppo.episodes, c.ppo.epochs = 8, 32, 4
  c.ppo.learning_rate = 3e-3
  c.eval.every, c.eval.episodes, c.eval.rollouts = 8, 64, 2
  # A PRM learns from outcomes alone, and the uniform policy succeeds rarely: it needs
  # about a thousand episodes and 500 steps to carry the outcome (0.05 -> 0.26 in 8 updates).
  c.credit.model_episodes, c.credit.model_steps, c.credit.model_rollouts = 1024, 500, 8
  for k, v in over.items():
    node = c
    *parents, leaf = k.split("__")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


def test_learner_starts_as_its_prior_and_the_labeler_branches_it():
  env, scripted = make("reasoning")
  policy = NeuralPolicy(env, prior=scripted, features=competence_features(env))
  params = env.default_params()
  states = jax.vmap(env.reset, (0, None))(jax.random.split(jax.random.key(3), 16), params)
  mine = jax.vmap(policy.probs, (None, 0, None))(policy.default_params(), states, params)
  theirs = jax.vmap(scripted.probs, (None, 0, None))(scripted.default_params(), states, params)
  np.testing.assert_allclose(mine, theirs, atol=2e-6)
  # label_under with the labeler's own parameters is `label`, bit for bit.
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=4))
  keys = jax.random.split(jax.random.key(0), 4)
  traj = labeler.sample(keys)
  plain = labeler.label(traj, keys)
  under = jax.jit(labeler.label_under)(policy.default_params(), traj, keys)
  for name, value in plain.items():
    np.testing.assert_array_equal(np.asarray(value), np.asarray(under[name]), err_msg=name)
  arms = np.asarray(under["arm_steps"])
  assert arms.shape == (4, 3) and (arms.sum(1) == np.asarray(plain["rollout_steps"])).all()
  # Without the phi arm: the same credit bit for bit, the keep and replace arms' steps only.
  fn = jax.jit(functools.partial(labeler.label_under, credit_only=True))
  credit_only = fn(policy.default_params(), traj, keys)
  assert set(credit_only) == {"credit", "credit_stderr", "credit_bounded", "arm_steps",
                              "credit_sample_stderr"}  # fmt: skip
  for name in ("credit", "credit_stderr", "credit_bounded"):
    np.testing.assert_array_equal(np.asarray(credit_only[name]), np.asarray(plain[name]), name)
  # the pairs' own stderr: the label's stderr wherever no tie bound raised it, below it
  # where one did
  sample, bound = (
    np.asarray(credit_only["credit_sample_stderr"]),
    np.asarray(plain["credit_bounded"]),
  )
  ok = np.asarray(traj.mask) & np.isfinite(np.asarray(plain["credit"]))
  np.testing.assert_allclose(sample[ok & ~bound], np.asarray(plain["credit_stderr"])[ok & ~bound],
                             rtol=1e-5)  # fmt: skip
  assert (sample[ok & bound] <= np.asarray(plain["credit_stderr"])[ok & bound] + 1e-7).all()
  assert (sample[ok] < np.asarray(plain["credit_stderr"])[ok]).any()  # at K=4 most are raised
  np.testing.assert_array_equal(credit_only["arm_steps"], arms * np.array([1, 1, 0]))


def test_a_masked_label_under_rolls_only_the_chosen_steps_and_labels_them_bit_for_bit():
  """`label_under(..., step_mask=M)`: the credit of the steps in M is the unmasked
  labeler's bit for bit (also with few lanes), and the env steps spent are exactly those
  of M's steps: the sum, over the steps of M, of what each step alone costs."""
  env, scripted = make("reasoning")
  policy = NeuralPolicy(env, prior=scripted, features=competence_features(env))
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=4))
  keys = jax.random.split(jax.random.key(1), 6)
  traj = labeler.sample(keys)
  theta = policy.default_params()
  fn = jax.jit(
    functools.partial(labeler.label_under, credit_only=True), static_argnames="num_lanes"
  )
  full = fn(theta, traj, keys)
  mask = np.asarray(traj.mask)
  chosen = mask & np.asarray(jax.random.bernoulli(jax.random.key(2), 0.3, mask.shape))
  assert 0 < chosen.sum() < mask.sum()
  for lanes in (None, 32):
    part = fn(theta, traj, keys, step_mask=jnp.asarray(chosen), num_lanes=lanes)
    for name in ("credit", "credit_stderr"):
      np.testing.assert_array_equal(np.asarray(part[name])[chosen], np.asarray(full[name])[chosen])
  alone = np.zeros(mask.shape[0], np.int64)  # [E]: each chosen step labeled by itself
  for t in range(mask.shape[1]):
    one = np.zeros(mask.shape, bool)
    one[:, t] = chosen[:, t]
    alone += np.asarray(fn(theta, traj, keys, step_mask=jnp.asarray(one))["arm_steps"]).sum(1)
  spent = np.asarray(part["arm_steps"]).sum(1)
  np.testing.assert_array_equal(spent, alone)
  assert spent.sum() < 0.6 * np.asarray(full["arm_steps"]).sum()


@pytest.mark.slow
@pytest.mark.parametrize("source", registered_sources())
def test_every_source_beats_the_random_policy_it_starts_from(source, tmp_path):
  results = train_and_evaluate(tiny(source), str(tmp_path / source))
  start = np.mean([s["success"] for s in results["curve"][0]["seeds"]])
  end = np.mean([s["success"] for s in results["seeds"]])
  # The uniform policy reaches the door in 5% of its episodes; 8 updates of any signal that
  # carries the outcome take it well past that (measured: outcome 0.69, mc_credit 0.89).
  assert end > start + 0.15, (source, start, end)
  spent = results["seeds"][0]["credit_env_steps"]
  if source in ("outcome", "gae"):
    assert spent == 0
  else:
    assert spent > 0  # every other source pays for rollouts or for its model's data


class _Zero(CreditSource):
  """A stub whose signal is 0 everywhere: an update that reads it cannot move the policy."""

  name = "test_zero"

  def signal(self, aux, policy_params, traj, key):
    return jnp.zeros(traj.mask.shape), self.no_steps()


def _one_update(c):
  """(initial, updated) policy parameters of seed 0 after one update of config `c`."""
  programs = Programs(prepare(make_task(c), c), c)
  keys = seed_keys(c)
  ts = programs.place(programs.init(keys))
  aux = programs.place(jax.tree.map(lambda x: jnp.stack([x] * 2), programs.source.aux))
  first = lambda tree: [np.array(x[0]) for x in jax.tree.leaves(tree)]  # noqa: E731
  before = first(ts.params)  # read before the chunk, which donates the state
  after, _ = programs.chunk(ts, aux, 1)
  return before, first(after.params)


def test_the_update_follows_the_sources_signal(tmp_path, monkeypatch):
  """Each source's own A_t drives the update: a zero signal leaves the policy where it is
  (no entropy bonus), and the docs' example source moves it otherwise than outcome does. An
  update that used R - mean(R) whatever the source fails both."""
  from hindsight.rl.sources import base

  monkeypatch.setattr(base, "_SOURCES", dict(base._SOURCES))
  base.register_source(_Zero)
  page_module(tmp_path, monkeypatch, "docs/rl.md", "my_sources.py")
  moved = {}
  for name in ("test_zero", "outcome", "my_sources:last_step"):
    before, after = _one_update(tiny(name, ppo__entropy=0.0))
    moved[name] = [b - a for a, b in zip(before, after, strict=True)]
  assert all(not d.any() for d in moved["test_zero"])
  assert any(d.any() for d in moved["outcome"])
  assert any(d.any() for d in moved["my_sources:last_step"])
  assert any(
    not np.allclose(x, y)
    for x, y in zip(moved["outcome"], moved["my_sources:last_step"], strict=True)
  )
  sys.modules.pop("my_sources", None)


def test_swapping_the_credit_model_compiles_nothing_and_changes_the_update():
  c = tiny("learned", credit__model_steps=5, credit__model_episodes=32)
  task = make_task(c)
  source = prepare(task, c)
  programs = Programs(source, c)
  keys = seed_keys(c)
  stack = lambda tree: programs.place(jax.tree.map(lambda x: jnp.stack([x] * 2), tree))  # noqa: E731
  aux = stack(source.aux)
  other = stack(jax.tree.map(lambda x: x + 0.5, source.aux))
  a, _ = programs.chunk(programs.place(programs.init(keys)), aux, 2)
  b, _ = programs.chunk(programs.place(programs.init(keys)), other, 2)
  assert programs.chunk._cache_size() == 1
  leaves_a, leaves_b = jax.tree.leaves(a.params), jax.tree.leaves(b.params)
  assert any(not np.array_equal(x, y) for x, y in zip(leaves_a, leaves_b, strict=True))


def _json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def _params(workdir: str, seeds: int):
  out = []
  for i in range(seeds):
    _, policy = load_policy(workdir, seed=i)
    out += [np.asarray(x) for x in jax.tree.leaves(policy.default_params())]
  return out


@pytest.mark.slow
def test_a_killed_run_resumes_to_bitwise_equal_parameters(tmp_path):
  args = [
    "--config", "configs/rl_reasoning.py:smoke", "--config.source=learned_current",
    "--config.ppo.updates=4", "--config.eval.every=2",
  ]  # fmt: skip
  whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
  cmd = [sys.executable, "-m", "train.rl"]
  subprocess.run([*cmd, *args, "--workdir", whole], cwd=ROOT, check=True, capture_output=True)
  proc = subprocess.Popen([*cmd, *args, "--workdir", cut], cwd=ROOT, stderr=subprocess.PIPE)
  deadline = time.time() + 240
  while not os.path.isdir(os.path.join(cut, "checkpoints", "2")) and time.time() < deadline:
    if proc.poll() is not None:
      break
    time.sleep(0.2)
  assert proc.poll() is None, "the run ended before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not os.path.exists(os.path.join(cut, "results.json"))
  subprocess.run([*cmd, *args, "--workdir", cut], cwd=ROOT, check=True, capture_output=True)
  for x, y in zip(_params(whole, 2), _params(cut, 2), strict=True):
    np.testing.assert_array_equal(x, y)
  a, b = (_json(os.path.join(d, "results.json")) for d in (whole, cut))
  assert a["seeds"] == b["seeds"] and a["refreshes_fired"] == b["refreshes_fired"]


def test_bad_configs_are_one_line(tmp_path, tabular_run):
  for config in ("configs/rl_reasoning.py:smoke", "rl_reasoning:smoke"):  # a file, a name
    proc = run_cli("rl", "--config", config, "--workdir", tmp_path / "a", "--config.source=vibes")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("hindsight: error: source 'vibes' is unknown"), lines
    assert "mc_credit" in lines[0] and "Traceback" not in proc.stderr
  # A space instead of '=' reads as argparse reads any flag; a field with no value is named.
  proc = run_cli("rl", "--config", "rl_reasoning:smoke", "--workdir", tmp_path / "a",
                 "--config.source", "vibes")  # fmt: skip
  assert "source 'vibes' is unknown" in proc.stderr, proc.stderr
  proc = run_cli("rl", "--workdir", tmp_path / "a", "--config.source")
  assert proc.returncode == 2
  assert proc.stderr.strip().startswith(
    "hindsight: error: --config.source needs a value: --config.source=VALUE"
  ), proc.stderr
  proc = run_cli("rl", "--config", "rl_reasoning:smoke", "--workdir", tmp_path / "a",
                 "--config.eval.boundary=normal")  # fmt: skip
  assert proc.returncode == 2 and proc.stderr.strip() == (
    "hindsight: error: eval.boundary must be one of bounded, asymptotic, got 'normal'"
  ), proc.stderr
  proc = run_cli("rl", "--config", "rl_nothing", "--workdir", tmp_path / "a")
  assert proc.returncode == 2 and "no shipped config of that name" in proc.stderr
  assert "rl_cartpole" in proc.stderr, proc.stderr
  proc = run_cli("rl", "--config", "rl_reasoning:smoke")  # no --workdir, no --sources
  assert proc.returncode == 2 and "--workdir is required" in proc.stderr, proc.stderr
  c = smoke(base_config())
  c.source, c.credit.model = "learned", tabular_run
  with pytest.raises(HindsightError, match="cannot score reasoning"):
    train_and_evaluate(c, str(tmp_path / "b"))
  c = smoke(base_config())
  c.ppo.updates = 5
  with pytest.raises(HindsightError, match=r"multiple of eval\.every"):
    train_and_evaluate(c, str(tmp_path / "c"))


@pytest.mark.slow
def test_the_experiment_smoke_runs_end_to_end(tmp_path, capsys):
  from eval.rl_experiment import main as rl_experiment

  out = str(tmp_path / "exp")
  code = rl_experiment(["--config", "configs/rl_reasoning.py:smoke", "--sources",
                        "outcome,mc_credit,pp_credit@pp.rho=0.3", "--out", out])  # fmt: skip
  assert code == 0, capsys.readouterr().err[-2000:]
  results = _json(os.path.join(out, "results.json"))
  # The smoke variant moves the policy: the sources end apart (at lr 3e-4 every source
  # ended with the same success and length, its sampled actions unmoved).
  ends = {n: [(s["success"], s["length"]) for s in r["seeds"]]
          for n, r in results["sources"].items()}  # fmt: skip
  assert ends["outcome"] != ends["mc_credit"], ends
  first = results["sources"]["outcome"]["curve"][0]["seeds"]
  assert [(s["success"], s["length"]) for s in first] != ends["outcome"]
  # K=4 smoke references leave most steps undetermined, but reasoning's decorative share
  # is read off its planted tags, so no warning says its class shares measure nothing.
  assert results["summary"]["outcome"]["undetermined"][0] > 0.5
  for r in results["sources"].values():
    assert all("undetermined" not in s["warnings"] for p in r["curve"] for s in p["seeds"])
  assert set(results["sources"]) == {"outcome", "mc_credit", "pp_credit@pp.rho=0.3"}
  # a source at settings of its own: its own row, run at them (its labelled share)
  pp = results["summary"]["pp_credit@pp.rho=0.3"]
  assert 0.2 < pp["label_share"][0] < 0.4, pp["label_share"]
  for name, r in results["sources"].items():
    own = _json(os.path.join(out, name, "results.json"))
    assert own["seeds"] == r["seeds"] and len(r["seeds"]) == 2
    mean = np.mean([s["success"] for s in r["seeds"]])
    assert results["summary"][name]["success"][0] == pytest.approx(mean)
  assert results["sources"]["mc_credit"]["seeds"][0]["credit_env_steps"] > 0
  assert os.path.getsize(os.path.join(out, "curves.png")) > 10_000
  assert os.path.getsize(os.path.join(out, "budget.png")) > 10_000
  with open(os.path.join(out, "table.md")) as f:
    assert "| mc_credit |" in f.read()
  # The loaded policy is the trained one of seed 1: its rollouts on the run's last evaluation
  # keys give results.json's numbers, and it is not theta_0.
  from hindsight.config_io import load_config
  from hindsight.labeling.rollout import sample_episode
  from hindsight.rl.measure import point_keys

  env, policy = load_policy(os.path.join(out, "mc_credit"), seed=1)
  config = load_config("configs/rl_reasoning.py:smoke", ["source=mc_credit"])
  mine = results["sources"]["mc_credit"]
  keys = point_keys(seed_keys(config)[1], 2, mine["updates"], int(config.eval.episodes))
  params = policy.default_params()
  traj = jax.vmap(sample_episode, (None, None, None, None, 0))(
    env, policy, env.default_params(), params, keys
  )
  seed1 = mine["seeds"][1]
  assert float(np.mean(traj.success)) == pytest.approx(seed1["success"])
  assert float(traj.mask.sum(-1).mean()) == pytest.approx(seed1["length"])
  assert float(np.asarray(traj.rewards).sum(-1).mean()) == pytest.approx(seed1["return"])
  theta0 = make_task(config).policy.default_params()
  states = jax.tree.map(lambda x: x[:, 0], traj.states)
  logits = lambda p: jax.vmap(policy.logits, (None, 0, None))(p, states, env.default_params())  # noqa: E731
  assert not np.allclose(logits(params), logits(theta0))
  traj = Labeler(env, policy, LabelConfig(num_rollouts=2)).sample(
    jax.random.split(jax.random.key(0), 4)
  )
  assert traj.mask.shape == (4, env.horizon)


def test_a_gymnax_task_fits_its_horizon_and_says_so(capsys):
  """Catch declares 1,000 steps for episodes of 9: the run fits the horizon to them (every
  update computed on 1,000 padded steps, about 20x slower), keeps the declared environment
  to measure what the fit cuts, and says both things it chose for the user."""
  pytest.importorskip("gymnax")
  c = smoke(base_config())
  c.env = "gymnax:Catch-bsuite"
  task = make_task(c)
  assert task.env.horizon == 9 and task.declared.horizon == 1000
  assert task.policy.prior is None and not task.bounded  # uniform start, no return range
  err = capsys.readouterr().err
  assert "horizon 9, the longest of 1024 episodes" in err, err
  assert "policy.prior: gymnax:Catch-bsuite has no scripted policy" in err, err
  c.horizon, c.return_range, c.policy.prior = 12, "-1:1", False
  task = make_task(c)
  assert task.env.horizon == 12 and task.declared is None and task.bounded
  assert capsys.readouterr().err == ""  # nothing chosen for the user: nothing said
  c.return_range = "1:-1"
  with pytest.raises(HindsightError, match="LO must be below HI"):
    make_task(c)
  c = smoke(base_config())
  c.return_range = "0:1"
  with pytest.raises(HindsightError, match="reasoning declares its own return bounds"):
    make_task(c)


def test_undefined_drift_metrics_say_why():
  from scipy import stats

  from hindsight.rl.measure import drift

  ref = np.array([0.0, 0.0, 0.0, np.nan])
  out = drift(np.array([0.1, 0.2, 0.3, 0.4]), ref)
  assert out["spearman"] is None and "reference credit is 0 on every step" in out["spearman_note"]
  assert out["mean_gap"] == pytest.approx(0.2) and out["mae"] == pytest.approx(0.2)
  out = drift(np.full(4, 0.5), np.array([0.1, 0.3, 0.2, 0.4]))
  assert out["spearman"] is None and "prediction is 0.5" in out["spearman_note"]
  out = drift(np.zeros(2), np.full(2, np.nan))
  assert out["mean_gap"] is None and "no step has a finite" in out["mean_gap_note"]
  pred, ref = np.array([0.1, 0.5, 0.2, 0.9]), np.array([0.0, 0.4, 0.3, 1.0])
  out = drift(pred, ref)
  assert out["spearman"] == pytest.approx(stats.spearmanr(pred, ref).statistic)
  assert "spearman_note" not in out


def test_the_table_does_not_present_an_undetermined_reference_as_a_finding():
  from hindsight.rl.experiment import markdown

  row = {
    "success": (0.5, 0.4, 0.6), "length": (9.0, 9.0, 9.0), "decorative": (0.0, 0.0, 0.0),
    "undetermined": (0.88, 0.87, 0.89), "policy_env_steps": 1e3, "credit_env_steps": 0.0,
    "wall_seconds": 1.0, "policy_steps_per_second": 1e3, "drift": (0.1, 0.0, 0.2),
    "spearman": None, "warnings": {"undetermined": "88% of the reference's steps ..."},
    "collapsed": 1, "amortised_credit_env_steps": 0.0,
    "lead": [{"warned": 10, "fell": 30, "lead": 20}, {"warned": 10, "fell": None, "lead": None}],
  }  # fmt: skip
  start = {"success": 0.2, "length": 9.0, "decorative": 0.0}
  table = markdown("gymnax:Catch-bsuite", {"learned": row}, start, 2, "cmd", planted=False)
  line = next(x for x in table.splitlines() if x.startswith("| learned |"))
  assert "n/a (undetermined 0.88)" in line and "0.000 [0.000, 0.000]" not in line
  assert "n/a (undefined: see spearman_note)" in line  # the Spearman that was undefined
  assert "- learned: 88% of the reference's steps" in table
  assert "| 1/2 |" in line  # one of the two seeds collapsed
  assert "- learned: 10/30, 10/None" in table  # the warning's update, then the fall's
  # Planted decorative tags (reasoning) do not depend on the reference's classes.
  table = markdown("reasoning", {"learned": row}, start, 2, "cmd", planted=True)
  assert "0.000 [0.000, 0.000]" in table


@pytest.mark.slow
def test_a_fitted_horizon_that_cuts_the_policys_episodes_is_said(tmp_path):
  """CartPole from uniform: fitted to 106 steps, the learning policy outgrows it within
  4 updates; the run warns (stderr, results.json) instead of training on cut episodes."""
  pytest.importorskip("gymnax")
  proc = run_cli("rl", "--config", "rl_cartpole:smoke", "--workdir", tmp_path / "cp",
                 "--config.source=outcome", "--config.horizon=0")  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  results = _json(os.path.join(tmp_path, "cp", "results.json"))
  assert results["horizon"] < 500
  assert "horizon_cut" in results["warnings"], results["warnings"]
  cuts = [s["cut_share"] for p in results["curve"] for s in p["seeds"]]
  assert cuts[0] == 0.0 and max(cuts) > 0
  assert f"the fitted horizon {results['horizon']} cuts" in proc.stderr


def test_a_source_with_a_loss_term_of_its_own_is_one_module(tmp_path, monkeypatch):
  """docs/rl.md's second example, run as written: a source that brings its own per-seed state
  (theta_0), its own loss term (a KL to it) and its own config node is one module; the
  trainer composes them without naming it. Four updates of the outcome move the policy; the
  same updates with the term move it less far from where it started."""
  from conftest import page_file

  from hindsight.rl.config import check_config
  from hindsight.rl.sources import base

  monkeypatch.setattr(base, "_SOURCES", dict(base._SOURCES))
  monkeypatch.setattr(base, "_NODES", dict(base._NODES))
  (tmp_path / "my_trust.py").write_text(page_file("docs/rl.md", "my_trust.py"))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "my_trust", raising=False)

  def kl_from_start(source: str, beta: float | None = None) -> float:
    c = tiny(source, ppo__entropy=0.0)
    check_config(c)  # adds the node of a source registered after the config was made
    if beta is not None:
      c.trust.beta = beta
    programs = Programs(prepare(make_task(c), c), c)
    ts = programs.place(programs.init(seed_keys(c)))
    aux = programs.place(jax.tree.map(lambda x: jnp.stack([x] * 2), programs.source.aux))
    task = programs.task
    start = jax.tree.map(lambda x: np.array(x[0]), ts.params)
    after, _ = programs.chunk(ts, aux, 4)
    moved = jax.tree.map(lambda x: x[0], after.params)
    states = jax.vmap(task.env.reset, (0, None))(jax.random.split(jax.random.key(1), 64),
                                                 task.env_params)  # fmt: skip
    logits = lambda p: jax.vmap(task.policy.logits, (None, 0, None))(p, states, task.env_params)  # noqa: E731
    logp, logq = jax.nn.log_softmax(logits(moved)), jax.nn.log_softmax(logits(start))
    return float(jnp.mean(jnp.sum(jnp.exp(logp) * (logp - logq), -1)))

  free = kl_from_start("outcome")
  held = kl_from_start("my_trust:trusted_outcome", beta=30.0)
  assert free > 0 and held < 0.5 * free, (free, held)
  c = tiny("my_trust:trusted_outcome")
  check_config(c)
  assert c.trust.beta == 1.0  # the node the module registered, at its default
  sys.modules.pop("my_trust", None)


def test_intervals_over_seeds_stay_inside_the_measures_range():
  """A t-interval over two seeds of success 0 and 1 reaches [-5.9, 6.9]: a rate's interval is
  cut to [0, 1], a count's to [0, inf), and the mean is untouched."""
  from hindsight.rl.experiment import RANGES, ci_text, mean_ci

  mean, lo, hi = mean_ci([0.0, 1.0])
  assert lo < -5 and hi > 6 and mean == 0.5
  assert mean_ci([0.0, 1.0], RANGES["success"]) == (0.5, 0.0, 1.0)
  assert mean_ci([0.2, 0.9, 1.0], RANGES["decorative"])[2] == 1.0
  assert mean_ci([1.0, 30.0], RANGES["tokens"])[1:] == (0.0, pytest.approx(mean_ci([1, 30])[2]))
  assert mean_ci([0.4], RANGES["success"]) == (0.4, 0.4, 0.4)
  assert ci_text(mean_ci([0.0, 1.0], RANGES["success"]), ".3f") == "0.500 [0.000, 1.000]"
