"""Label datasets: the episode type, labels on disk (TFDS array_record) and their metadata.

Names load their module on first use (`hindsight._lazy`): the metadata and the episode
formats are read without importing TFDS or JAX.
"""

from hindsight._lazy import lazy_exports

_HOMES = {
  "DATASET_NAME": "hindsight.data.labels",
  "Episode": "hindsight.data.episode",
  "LabelMetadata": "hindsight.data.metadata",
  "Labels": "hindsight.data.labels",
  "build_features": "hindsight.data.labels",
  "dataset_dir": "hindsight.data.labels",
  "episode_to_json": "hindsight.data.labels",
  "is_complete": "hindsight.data.labels",
  "open_labels": "hindsight.data.labels",
  "write_dataset": "hindsight.data.labels",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = sorted(_HOMES)
