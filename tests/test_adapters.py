"""Gymnasium and dm_env (bsuite) adapters: branching by deepcopy, replay, CLI, workers."""

import os
import sys

import numpy as np
import pytest

from hindsight.envs.families import make_py_env
from hindsight.errors import HindsightError
from hindsight.labeling import LabelConfig
from hindsight.labeling.config import LabelJob
from hindsight.labeling.job import run_label_job
from hindsight.labeling.py_labeler import PyJob, episode_root, label_episode, replay

sys.path.insert(0, os.path.dirname(__file__))  # adapter_policies, for --policy

CARTPOLE = "gymnasium:CartPole-v1"
CATCH = "dm_env:bsuite.environments.catch:Catch"


@pytest.mark.parametrize("spec", [CARTPOLE, CATCH])
def test_replay_and_deepcopy_reproduce_the_recorded_prefix(spec):
  env = make_py_env(spec, horizon=25)
  seed = episode_root(0, 3)[0]
  rng = np.random.default_rng(0)
  observations, actions, clones = [env.reset(seed)], [], []
  for _ in range(12):
    clones.append(env.clone())
    a = int(rng.integers(env.num_actions))
    obs, _, done = env.step(a)
    actions.append(a)
    observations.append(obs)
    if done:
      break
  _, replayed = replay(env, seed, actions)
  for recorded, again in zip(observations, replayed, strict=True):
    np.testing.assert_array_equal(recorded, again)
  # A deep copy taken at step t continues exactly like the original did.
  t = len(actions) // 2
  branch = clones[t]
  for u in range(t, len(actions)):
    np.testing.assert_array_equal(branch.step(actions[u])[0], observations[u + 1])


def test_deepcopy_branching_matches_replay_branching(monkeypatch):
  job = PyJob(CARTPOLE, None, 12, LabelConfig(num_rollouts=3, replacement="uniform"), seed=1)
  a = label_episode(job, 2)
  # Force the replay fallback: every clone "fails".
  monkeypatch.setattr("hindsight.envs.adapters.PyEnv.clone", lambda self: None)
  b = label_episode(job, 2)
  for field in ("credit", "progress", "phi_hard", "credit_realized"):
    np.testing.assert_array_equal(a[field], b[field])
  T = int(a["length"])
  assert T >= 5 and np.isfinite(a["credit"][:T]).all() and np.isnan(a["credit"][T:]).all()


def test_cli_jobs_on_gymnasium_and_bsuite(tmp_path):
  from hindsight.data import open_labels

  one = run_label_job(
    LabelJob(CARTPOLE, 3, LabelConfig(num_rollouts=3), seed=0, horizon=15,
             policy="adapter_policies:mostly_right", workers=1),
    str(tmp_path / "one"),
  )  # fmt: skip
  two = run_label_job(
    LabelJob(CARTPOLE, 3, LabelConfig(num_rollouts=3), seed=0, horizon=15,
             policy="adapter_policies:mostly_right", workers=2),
    str(tmp_path / "two"),
  )  # fmt: skip
  a, b = open_labels(str(tmp_path / "one")), open_labels(str(tmp_path / "two"))
  for i in range(3):
    np.testing.assert_array_equal(a[i]["credit"], b[i]["credit"])
    assert a[i]["observations"].dtype == np.float32 and a[i]["observations"].shape[1] == 4
  assert one != two
  run_label_job(
    LabelJob(CATCH, 2, LabelConfig(num_rollouts=4, replacement="policy_other"), seed=0),
    str(tmp_path / "catch"),
  )
  catch = open_labels(str(tmp_path / "catch"))
  assert len(catch) == 2 and catch[0]["observations"].shape[1] == 50  # 10 x 5 board
  assert catch.metadata.env == CATCH


def test_adapter_bad_input():
  with pytest.raises(HindsightError, match="gymnasium:NoSuchEnv-v0"):
    make_py_env("gymnasium:NoSuchEnv-v0")
  with pytest.raises(HindsightError, match="cannot load"):
    make_py_env("dm_env:no_such_module:make")
  with pytest.raises(HindsightError, match="CartPole-v1 declares none"):
    run_label_job(LabelJob(CARTPOLE, 1, LabelConfig(replacement="null")), "/tmp/never")
  with pytest.raises(HindsightError, match="cannot load"):
    run_label_job(LabelJob(CARTPOLE, 1, LabelConfig(), policy="nowhere:fn"), "/tmp/never")
  with pytest.raises(HindsightError, match="only"):
    run_label_job(LabelJob("reasoning", 1, LabelConfig(), policy="x:y"), "/tmp/never")


def test_replay_fallback_when_deepcopy_really_fails():
  """An environment that refuses deepcopy is branched by replay, with the same labels as
  deepcopy would give where the replay is faithful; one whose replay diverges from its
  recording is refused with one line naming the episode and step."""
  config = LabelConfig(num_rollouts=4, replacement="uniform")
  spec = "dm_env:adapter_envs:Uncopyable"
  assert make_py_env(spec, 8).clone() is None  # deepcopy really fails
  labels = label_episode(PyJob(spec, None, 8, config, seed=0), 1)
  T = int(labels["length"])
  assert T >= 2 and np.isfinite(labels["credit"][:T]).all()
  # Its twin that deepcopy can copy gives the same labels: replay restored the same states.
  twin = "dm_env:adapter_envs:Copyable"
  assert make_py_env(twin, 8).clone() is not None
  copied = label_episode(PyJob(twin, None, 8, config, seed=0), 1)
  assert int(copied["length"]) == T and np.any(copied["credit"][:T] != 0)
  for name in ("credit", "credit_stderr", "progress", "actions", "rewards"):
    np.testing.assert_array_equal(labels[name][:T], copied[name][:T], err_msg=name)
  with pytest.raises(HindsightError, match=r"episode 1 cannot be branched at step \d+.*diverged"):
    label_episode(PyJob("dm_env:adapter_envs:Drifting", None, 8, config, seed=0), 1)


def test_an_environment_that_cannot_be_reseeded_is_reported(caplog, monkeypatch):
  """Branches of an environment whose random state cannot be found share its noise: say so."""
  import hindsight.labeling.py_labeler as py_labeler

  monkeypatch.setattr("hindsight.envs.adapters.PyEnv.reseed", lambda self, seed: False)
  monkeypatch.setattr(py_labeler, "_WARNED_NO_RESEED", set())
  job = PyJob(CARTPOLE, None, 6, LabelConfig(num_rollouts=2, replacement="uniform"), seed=1)
  with caplog.at_level("WARNING", logger="hindsight.labeling.py_labeler"):
    label_episode(job, 0)
    label_episode(job, 1)
  warnings = [r for r in caplog.records if "reseed" in r.getMessage()]
  assert len(warnings) == 1 and CARTPOLE in warnings[0].getMessage()  # once per environment
