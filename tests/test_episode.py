"""The trajectory and episode contract: success is decided once, by the environment, and
every episode built from a trajectory (fresh, regenerated, audited, parsed) carries it."""

import jax
import numpy as np
import pytest

from hindsight.audit import pool as pool_lib
from hindsight.data import open_labels
from hindsight.data.episode import Episode
from hindsight.envs import make
from hindsight.errors import HindsightError
from hindsight.labeling import trajectories as tr
from hindsight.labeling.config import LabelConfig, LabelJob
from hindsight.labeling.engine import Labeler
from hindsight.labeling.job import run_label_job
from hindsight.model.encoders import DiscreteEncoder
from hindsight.model.spec import DataSpec

BUILT_IN = ("tabular:data/key_corridor.npz", "key_to_door", "reasoning", "team")


def _direct_success(env, traj) -> np.ndarray:
  """env.success of each final state and undiscounted return, computed here by hand."""
  final = jax.tree.map(lambda x: x[:, -1], traj.states)
  returns = np.where(traj.mask, traj.rewards, 0.0).sum(1)
  return np.asarray(jax.vmap(env.success)(final, returns.astype(np.float32)))


@pytest.mark.parametrize("spec", BUILT_IN)
def test_fresh_episodes_carry_the_environments_success(spec):
  env, policy = make(spec)
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=4))
  traj, labels = tr.sample_and_label(labeler, 0, 64, progress=False)
  want = _direct_success(env, traj)
  episodes = tr.episodes_from_trajectories(env, traj)
  np.testing.assert_array_equal([e.success for e in episodes], want)
  np.testing.assert_array_equal(labels["success"], want)  # the labels: the same decision
  if spec == "key_to_door":
    # The case a return threshold gets wrong: apples alone can pass the door's 10.
    by_return = np.where(traj.mask, traj.rewards, 0).sum(1) > env.success_threshold
    assert (by_return != want).sum() >= 10, (by_return.sum(), want.sum())
    assert not env.success_from_return
  else:
    assert env.success_from_return


def test_regenerated_and_audited_episodes_equal_the_datasets_own(tmp_path):
  """What the harness (test split) and the audit (--trajectories DIR) build from dataset
  episodes equals the dataset's episodes, success included."""
  job = LabelJob(env="key_to_door", episodes=24, config=LabelConfig(num_rollouts=4), seed=3)
  labels = open_labels(run_label_job(job, str(tmp_path / "labels"), progress=False))
  stored = [Episode.from_example(labels[i]) for i in range(len(labels))]
  assert 0 < sum(e.success for e in stored) < len(stored)
  assert labels.metadata.success_from_return is False
  env, policy = make("key_to_door")
  labeler = Labeler(env, policy, LabelConfig.from_metadata(labels.metadata))
  ids = np.arange(len(labels))
  traj = tr.regenerate(labeler, 3, ids, [e.actions for e in stored], [e.rewards for e in stored])
  pool = pool_lib.from_dataset(labeler, labels, 0)
  for built in (tr.episodes_from_trajectories(env, traj), pool.episodes):
    for mine, theirs in zip(built, stored, strict=True):
      assert mine.success == theirs.success
      assert mine.tags == theirs.tags
      for name in ("observations", "actions", "rewards"):
        np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name))


def _spec(success_from_return: bool) -> DataSpec:
  return DataSpec(DiscreteEncoder(5), 3, 8, 4, 1.0, success_threshold=0.5,
                  success_from_return=success_from_return)  # fmt: skip


def test_a_missing_success_is_derived_only_where_success_is_a_return_level():
  given = {"observations": [0, 1, 2], "actions": [0, 1, 2], "rewards": [0.0, 0.0, 1.0]}
  assert Episode.parse(given, _spec(True)).success is True
  assert Episode.parse({**given, "rewards": [0.0, 0.0, 0.5]}, _spec(True)).success is False
  with pytest.raises(HindsightError, match="episode 7: missing field 'success'") as err:
    Episode.parse(given, _spec(False), "episode 7")
  assert "\n" not in str(err.value)
  assert Episode.parse({**given, "success": False}, _spec(False)).success is False


def test_the_export_format_round_trips():
  ep = Episode(
    observations=np.array([0, 4, 2], np.int32),
    actions=np.array([1, 0, 2], np.int32),
    rewards=np.array([0.0, 0.25, 1.0], np.float32),
    success=True,
    tags=("a", "b", "c"),
    credit=np.array([0.5, np.nan, -0.125], np.float32),
    klass=np.array([1, 3, 2], np.int32),
  )
  js = ep.to_json()
  assert js["credit"][1] is None and js["klass"][0] == "load_bearing" and js["success"] is True
  back = Episode.parse({**js, "credit": [0.5, float("nan"), -0.125]}, _spec(False))
  assert back.tags == ep.tags and back.success == ep.success
  for name in ("observations", "actions", "rewards", "credit", "klass"):
    np.testing.assert_array_equal(getattr(back, name), getattr(ep, name))
  with pytest.raises(HindsightError, match="'tags' must be 3 names"):
    Episode.parse({**js, "tags": "abc"}, _spec(True))
