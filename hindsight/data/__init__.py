"""Labels on disk (TFDS array_record) and readers."""

from hindsight.data.labels import (
  DATASET_NAME,
  Labels,
  build_features,
  dataset_dir,
  episode_to_json,
  is_complete,
  open_labels,
  write_dataset,
)

__all__ = [
  "DATASET_NAME",
  "Labels",
  "build_features",
  "dataset_dir",
  "episode_to_json",
  "is_complete",
  "open_labels",
  "write_dataset",
]
