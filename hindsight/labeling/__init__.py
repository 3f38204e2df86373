"""The rollout engine and the sharded, resumable labeling job."""

from hindsight.credit.fields import STEP_FIELDS, returns_to_go
from hindsight.labeling.engine import LabelConfig, Labeler, episode_key, to_numpy
from hindsight.labeling.rollout import Trajectory, continuation_return, sample_episode

__all__ = [
  "STEP_FIELDS",
  "LabelConfig",
  "Labeler",
  "Trajectory",
  "continuation_return",
  "episode_key",
  "returns_to_go",
  "sample_episode",
  "to_numpy",
]
