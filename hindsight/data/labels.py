"""Labels on disk: a TFDS array_record dataset, one example per episode (docs/design.md, section 2).

Layout of a labeling job's `--out DIR`:
  DIR/hindsight_labels/1.0.0/   the finished dataset (written under an `incomplete.*`
                                name and renamed only when complete: `write_dataset`)
  DIR/_chunks/                  the resumable work area of a running job (gone when done)

Read with `open_labels(DIR)`: `tfds.data_source` machinery, no TensorFlow. DIR may also be
the dataset directory itself (what `hindsight label` prints).

Integrity: `write_dataset` writes `hindsight_checksums.json` beside the data (SHA-256 and
size of every file, and the episode count) before the dataset is renamed into place.
A dataset counts as complete only with it, and `open_labels` verifies every file against it
before anything is read, so a truncated or corrupted file is named, never half-read.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hindsight.credit.fields import STEP_FIELDS
from hindsight.credit.names import KLASS_NAMES
from hindsight.data.metadata import LabelMetadata
from hindsight.errors import HindsightError
from hindsight.files import atomic_write_text, json_safe, sha256_file

DATASET_NAME = "hindsight_labels"
VERSION = "1.0.0"

# Extra per-step float fields written beside STEP_FIELDS (credit_sample_stderr: the credit's
# plain sample stderr, its noise level, where credit_stderr may be the tie bound; absent from
# datasets written before it, whose batches fall back to credit_stderr and whose tie-bounded
# steps the calibration leaves out).
AUX_STEP_FIELDS = ("return_to_go", "phi", "phi_stderr", "credit_sample_stderr")


CHECKSUMS = "hindsight_checksums.json"


def dataset_dir(out_dir: str) -> str:
  return os.path.join(out_dir, DATASET_NAME, VERSION)


def job_dir(path: str) -> str:
  """The `--out` directory of a labeling job, given it or its dataset directory."""
  norm = os.path.normpath(path)
  if os.path.basename(os.path.dirname(norm)) == DATASET_NAME and os.path.isfile(
    os.path.join(norm, "dataset_info.json")
  ):
    return os.path.dirname(os.path.dirname(norm))
  return path


# Per-episode agent-level fields of multi-agent environments (`team`), n agents.
AGENT_FIELDS = (
  "agent_shapley",
  "agent_shapley_stderr",
  "agent_interaction",
  "agent_interaction_stderr",
  "coalition_values",
  "coalition_stderr",
)


# Per-episode text fields of text traces (`--env text:...`), and the per-step one.
TEXT_FIELDS = ("prompt", "trace_id")
STEP_TEXT = "step_text"


def build_features(
  obs_shape: tuple[int, ...],
  obs_dtype,
  with_states: bool,
  num_agents: int = 0,
  partial: bool = False,
  coalitions: bool = True,
  texts: bool = False,
):
  """The TFDS features of one episode of T steps (T varies); with num_agents > 0 also the
  agent-level fields (AGENT_FIELDS; without `coalitions` only the Shapley values and their
  stderrs, as sampled Shapley values have no others) and the acting agent of every step;
  with `partial` a per-step `labeled` flag (an audit labels a few steps of each episode:
  the others carry NaN credit and stay out of every loss); with `texts` the prompt, the
  trace's id and the text of every step (text traces)."""
  tfds = _tfds()
  step = lambda dtype: tfds.features.Tensor(shape=(None,), dtype=dtype)  # noqa: E731
  features = {
    "episode": np.int64,
    "length": np.int32,
    "return": np.float32,
    "success": np.bool_,
    "actions": step(np.int32),
    "rewards": step(np.float32),
    "observations": tfds.features.Tensor(shape=(None, *obs_shape), dtype=obs_dtype),
    "tags": tfds.features.Sequence(tfds.features.Text()),
    "klass": tfds.features.Sequence(tfds.features.ClassLabel(names=KLASS_NAMES)),
    "undefined": step(np.bool_),
    # The credit stderr is the tie bound of credit.estimators, not the sample stderr.
    "credit_bounded": step(np.bool_),
  }
  for name in STEP_FIELDS + AUX_STEP_FIELDS:
    features[name] = step(np.float32)
  if with_states:
    features["states"] = step(np.int32)
  if num_agents:
    n = num_agents
    shapes = ((n,), (n,), (n, n), (n, n), (1 << n,), (1 << n,))  # in AGENT_FIELDS order
    for name, shape in zip(AGENT_FIELDS, shapes, strict=True):
      if coalitions or name.startswith("agent_shapley"):
        features[name] = tfds.features.Tensor(shape=shape, dtype=np.float32)
    features["agent"] = step(np.int32)
  if partial:
    features["labeled"] = step(np.bool_)
  if texts:
    for name in TEXT_FIELDS:
      features[name] = tfds.features.Text()
    features[STEP_TEXT] = tfds.features.Sequence(tfds.features.Text())
  return tfds.features.FeaturesDict(features)


# The stored dtype of every field of an example but `observations` (the environment's) and
# `tags` (names).
_EXAMPLE_DTYPES = {
  "episode": np.int64,
  "length": np.int32,
  "return": np.float32,
  "success": np.bool_,
  "actions": np.int32,
  "rewards": np.float32,
  "klass": np.int64,
  "undefined": np.bool_,
  "credit_bounded": np.bool_,
  "labeled": np.bool_,
  "states": np.int32,
  "agent": np.int32,
  **{name: np.float32 for name in (*STEP_FIELDS, *AUX_STEP_FIELDS, *AGENT_FIELDS)},
}
# Per-step arrays an example may carry ([T] or [T, ...]).
EXAMPLE_STEP_ARRAYS = (
  "actions",
  "rewards",
  "observations",
  "klass",
  "undefined",
  "credit_bounded",
  "labeled",
  "states",
  "agent",
  STEP_TEXT,
  *STEP_FIELDS,
  *AUX_STEP_FIELDS,
)


def make_example(fields: dict[str, Any]) -> dict[str, Any]:
  """One dataset example (`build_features`' fields) from one episode's values, each cast
  to its stored dtype: the one place the labeling job and the audit build the rows they
  write. Per-step arrays must already be cut to the episode's T steps."""
  out: dict[str, Any] = {}
  for name, value in fields.items():
    dtype = _EXAMPLE_DTYPES.get(name)
    if name in ("tags", STEP_TEXT):
      out[name] = [str(v) for v in value]
    elif name in TEXT_FIELDS:
      out[name] = str(value)
    elif dtype is None:
      out[name] = value  # observations: the environment's dtype
    elif np.ndim(value) == 0:
      out[name] = bool(value) if dtype is np.bool_ else dtype(value)
    else:
      out[name] = np.asarray(value).astype(dtype)
  return out


def _tfds():
  """TFDS, imported on first use: a CLI run that writes or reads no dataset never loads it."""
  import tensorflow_datasets as tfds

  return tfds


DESCRIPTION = "Per-step interventional credit labels produced by `hindsight label`."
# One array_record shard of the `train` split, named as TFDS names its shards.
SHARD = f"{DATASET_NAME}-train.array_record-00000-of-00001"


def write_dataset(out_dir: str, features, metadata: LabelMetadata, episodes: Iterator[dict]) -> str:
  """Writes the examples `episodes` (`make_example`'s dicts, episode i as example i) as the
  label dataset of `out_dir`, atomically, and returns its directory.

  The records are serialized by `records.encode_example` and written as one array_record
  shard (TFDS's own options: group_size 1, for random access); TFDS writes the metadata
  (`tfds.folder_dataset.write_metadata`: dataset_info.json, features.json, metadata.json).
  Everything goes to an `incomplete.*` directory, is checksummed, and is renamed into place
  only when complete, so a killed job never leaves a dataset that looks finished.
  """
  from array_record.python.array_record_module import ArrayRecordWriter

  from hindsight.data.records import encode_example, feature_encoders

  tfds = _tfds()
  parent = os.path.join(out_dir, DATASET_NAME)
  for stale in glob.glob(os.path.join(parent, "incomplete.*")):
    shutil.rmtree(stale, ignore_errors=True)
  os.makedirs(parent, exist_ok=True)
  work = tempfile.mkdtemp(prefix="incomplete.", dir=parent)
  encoders = feature_encoders(features)
  writer = ArrayRecordWriter(os.path.join(work, SHARD), "group_size:1")
  count = size = 0
  try:
    for example in episodes:
      record = encode_example(example, encoders)
      writer.write(record)
      count, size = count + 1, size + len(record)
  finally:
    writer.close()
  tfds.folder_dataset.write_metadata(
    data_dir=work,
    features=features,
    split_infos=[tfds.core.SplitInfo(name="train", shard_lengths=[count], num_bytes=size)],
    version=VERSION,
    check_data=False,
    description=DESCRIPTION,
    metadata=tfds.core.MetadataDict(metadata.to_dict()),
    # Generation order is the contract: episode i is example i.
    disable_shuffling=True,
  )
  _write_checksums(work)
  final = dataset_dir(out_dir)
  shutil.rmtree(final, ignore_errors=True)  # a dataset without checksums (a killed job's)
  os.rename(work, final)
  return final


def _data_files(path: str) -> list[str]:
  return sorted(f for f in os.listdir(path) if f != CHECKSUMS and not f.startswith("."))


def _write_checksums(path: str) -> None:
  """SHA-256 and size of every file of a finished dataset, and its episode count (atomic)."""
  with open(os.path.join(path, "dataset_info.json")) as f:
    splits = json.load(f).get("splits", [])
  examples = sum(int(n) for s in splits for n in s.get("shardLengths", []))
  files = {}
  for name in _data_files(path):
    file = os.path.join(path, name)
    files[name] = {"sha256": sha256_file(file), "bytes": os.path.getsize(file)}
  record = {"files": files, "episodes": examples}
  atomic_write_text(os.path.join(path, CHECKSUMS), json.dumps(record, indent=1, sort_keys=True))


def verify_dataset(path: str) -> int:
  """Checks every file of the dataset at `path` against its checksums; the episode count.

  A one-line HindsightError names the first file that is missing, of the wrong size, or
  whose SHA-256 differs (a truncated or corrupted file), or a damaged checksum file itself.
  """
  try:
    with open(os.path.join(path, CHECKSUMS)) as f:
      record = json.load(f)
    files, episodes = dict(record["files"]), int(record["episodes"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise HindsightError(f"{path}/{CHECKSUMS} is damaged ({type(e).__name__})") from None
  for name, want in sorted(files.items()):
    file = os.path.join(path, name)
    if not os.path.isfile(file):
      raise HindsightError(f"{file} is missing from the label dataset")
    if os.path.getsize(file) != want["bytes"] or sha256_file(file) != want["sha256"]:
      raise HindsightError(
        f"{file} is damaged: its size or SHA-256 differs from {CHECKSUMS} (relabel)"
      )
  return episodes


@dataclasses.dataclass
class Labels:
  """A finished label dataset: `len(labels)`, `labels[i]` (episode i), `labels.metadata`
  (typed; `info.metadata` is the dict as stored)."""

  path: str
  source: Sequence[dict[str, Any]]
  metadata: LabelMetadata
  info: Any

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, i: int) -> dict[str, Any]:
    return self.source[i]

  def __iter__(self):
    for i in range(len(self.source)):
      yield self.source[i]


@dataclasses.dataclass
class MixedLabels:
  """A label dataset followed by the first `take` episodes of another, read as one (a
  fine-tune on audited steps mixed with the old labels). Metadata and path: the first's."""

  first: Labels
  second: Labels
  take: int

  @property
  def path(self) -> str:
    return self.first.path

  @property
  def metadata(self) -> LabelMetadata:
    return self.first.metadata

  def __len__(self) -> int:
    return len(self.first) + self.take

  def __getitem__(self, i: int) -> dict[str, Any]:
    n = len(self.first)
    if not 0 <= i < n + self.take:
      raise IndexError(i)
    return self.first[i] if i < n else self.second[i - n]

  def __iter__(self):
    for i in range(len(self)):
      yield self[i]


def open_training_labels(labels_dir: str, mix_dir: str = "", mix_episodes: int = 0):
  """The labels a run trains on: `labels_dir`, followed (when `mix_dir` is given) by the
  first `mix_episodes` episodes of `mix_dir` (0: all of them). Both must label the same
  environment with the same replacement."""
  labels = open_labels(labels_dir)
  if not mix_dir:
    return labels
  other = open_labels(mix_dir)
  for key in ("env_name", "replacement"):
    ours, theirs = getattr(labels.metadata, key), getattr(other.metadata, key)
    if ours != theirs:
      raise HindsightError(
        f"data.mix_labels_dir {mix_dir}: {key} '{theirs}' differs from '{ours}' of {labels_dir}"
      )
  if mix_episodes < 0:
    raise HindsightError(f"config data.mix_episodes={mix_episodes} must be >= 0")
  take = min(mix_episodes, len(other)) if mix_episodes else len(other)
  return MixedLabels(labels, other, take)


def is_complete(out_dir: str) -> bool:
  """TFDS finished the dataset and its checksums are written (see the module docstring)."""
  path = dataset_dir(job_dir(out_dir))
  return all(os.path.isfile(os.path.join(path, f)) for f in ("dataset_info.json", CHECKSUMS))


def open_labels(out_dir: str) -> Labels:
  """Opens the dataset written by `hindsight label --out out_dir` (read-only, no TensorFlow).

  out_dir may also be the dataset directory (DIR/hindsight_labels/1.0.0). Every file is
  verified against the dataset's checksums first.
  """
  out_dir = job_dir(out_dir)
  path = dataset_dir(out_dir)
  if not os.path.isdir(out_dir):
    raise HindsightError(f"{out_dir}: no such directory")
  if os.path.isfile(os.path.join(path, "dataset_info.json")) and not is_complete(out_dir):
    raise HindsightError(
      f"{path} has no {CHECKSUMS} (written by an older hindsight, or a job killed while "
      "finishing): rerun the same `hindsight label` command"
    )
  if not is_complete(out_dir):
    hint = (
      " (an interrupted job: rerun the same `hindsight label` command to finish it)"
      if os.path.isdir(os.path.join(out_dir, "_chunks"))
      else ""
    )
    raise HindsightError(f"{out_dir} holds no complete label dataset{hint}")
  episodes = verify_dataset(path)
  try:
    builder = _tfds().builder_from_directory(path)
    source = builder.as_data_source(split="train")
  except Exception as e:  # TFDS raises many types for a damaged directory
    raise HindsightError(f"{path}: unreadable label dataset ({type(e).__name__})") from e
  if len(source) != episodes:
    raise HindsightError(f"{path}: {len(source)} episodes readable, {episodes} written")
  metadata = LabelMetadata.from_dict(dict(builder.info.metadata or {}))
  return Labels(path=path, source=source, metadata=metadata, info=builder.info)


def as_text(value) -> str:
  """A text field as a dataset gives it back (bytes, UTF-8) or as it was given (str)."""
  return value.decode() if isinstance(value, bytes) else str(value)


def episode_to_json(example: dict[str, Any], klass_names=KLASS_NAMES) -> dict[str, Any]:
  """One decoded example -> standard JSON types: every non-finite number becomes null (an
  undefined credit is NaN, and `undefined` marks it; a stderr without any bound is inf);
  tags and klass as names."""
  out = {}
  for key, value in example.items():
    if key in ("tags", STEP_TEXT):
      out[key] = [as_text(t) for t in value]
    elif key in TEXT_FIELDS:
      out[key] = as_text(value)
    elif key == "klass":
      out[key] = [klass_names[int(k)] for k in value]
    elif isinstance(value, np.ndarray | np.generic):
      out[key] = json_safe(value if isinstance(value, np.ndarray) else value.item())
    else:
      out[key] = value
  return out
