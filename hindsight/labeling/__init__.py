"""The rollout engine, the sharded, resumable labeling job, and the drivers over in-memory
trajectories (`labeling.trajectories`)."""

from hindsight._lazy import lazy_exports

_HOMES = {
  "STEP_FIELDS": "hindsight.credit.fields",
  "returns_to_go": "hindsight.credit.fields",
  "LabelConfig": "hindsight.labeling.config",
  "LabelJob": "hindsight.labeling.config",
  "Labeler": "hindsight.labeling.engine",
  "episode_key": "hindsight.labeling.engine",
  "to_numpy": "hindsight.labeling.engine",
  "Trajectory": "hindsight.labeling.rollout",
  "continuation_return": "hindsight.labeling.rollout",
  "sample_episode": "hindsight.labeling.rollout",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
