"""What the drift harness evaluates: a training run as it reads it (`Run`), and one evaluated
set of episodes with its reference credit and every signal as per-step columns
(`EpisodeSet`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from hindsight.data.episode import Episode
from hindsight.data.labels import open_training_labels
from hindsight.drift import reference as ref_lib
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.model.predictor import checkpoint_workdirs, training_run


class EpisodeSet:
  """One evaluated set: episodes + per-step columns over their valid steps.

  reference: the reference's fields [n, H] (`drift.reference.FIELDS`) and rollout_steps
    [n] (what it cost); labels: the training labels' fields [n, H], or None (fresh sets).
  rows: {row name: column} of signals a backend added (`add_row`), shown after the
    harness's own in every table.
  """

  def __init__(self, name: str, episodes: list[Episode], reference: dict, labels: dict | None):
    self.name, self.episodes, self.reference = name, episodes, reference
    lengths = np.array([len(e) for e in episodes])
    self.lengths = lengths
    mask = np.arange(reference["credit"].shape[1])[None] < lengths[:, None]
    self.mask = mask
    flat = lambda x: np.asarray(x)[mask]  # noqa: E731
    self.cols = {f"ref_{k}": flat(reference[k]) for k in ref_lib.FIELDS}
    if labels is not None:
      self.cols.update({f"label_{k}": flat(v) for k, v in labels.items() if np.ndim(v) == 2})
    self.cols["episode"] = np.repeat(np.arange(len(episodes)), lengths)
    self.cols["t"] = np.concatenate([np.arange(n) for n in lengths])
    self.cols["length"] = np.repeat(lengths, lengths)
    self.cols["success"] = np.repeat([e.success for e in episodes], lengths)
    self.cols["tag"] = np.concatenate([np.asarray(e.tags, dtype=object) for e in episodes])
    self.rollout_steps = reference.get("rollout_steps")
    self.rows: dict[str, str] = {}

  def add_episode_signal(self, name: str, per_episode: list[np.ndarray]) -> None:
    self.cols[name] = np.concatenate(
      [np.asarray(v)[:n] for v, n in zip(per_episode, self.lengths, strict=True)]
    )

  def add_row(self, row: str, column: str, per_episode: list[np.ndarray]) -> None:
    """A signal of a backend's own (per-episode arrays [T_i]), shown as table row `row`."""
    self.add_episode_signal(column, per_episode)
    self.rows[row] = column


@dataclasses.dataclass
class Run:
  """A training run (or ensemble) as the harness reads it: its labels and test split."""

  workdirs: list[str]
  record: dict  # splits.json of the first member
  labels: object  # the label dataset it trained on
  base: LabelConfig  # the labels' config
  test_ids: np.ndarray  # int64 [n] the test split's episode ids


def open_run(checkpoint: str) -> Run:
  """The run (or ensemble) behind a --checkpoint."""
  workdirs = checkpoint_workdirs(checkpoint)
  record = training_run(workdirs[0])
  for w in workdirs[1:]:  # an ensemble is scored on its members' one test split
    other = training_run(w)
    if other["labels"] != record["labels"] or other["test"] != record["test"]:
      raise HindsightError(f"checkpoint {w}: trained on other labels or another split")
  labels = open_training_labels(
    record["labels"], record.get("mix_labels", ""), record.get("mix_episodes", 0)
  )
  base = LabelConfig.from_metadata(labels.metadata)
  return Run(workdirs, record, labels, base, np.asarray(record["test"], np.int64))


def pad_fields(per_episode: list[dict], horizon: int) -> dict:
  """Per-episode fields [T_i] -> [n, horizon] (floats NaN-padded, flags False)."""
  out = {}
  for k in per_episode[0]:
    pad = np.full((len(per_episode), horizon), np.nan, np.float64)
    if per_episode[0][k].dtype == bool:
      pad = np.zeros((len(per_episode), horizon), bool)
    for i, ep in enumerate(per_episode):
      pad[i, : len(ep[k])] = ep[k]
    out[k] = pad
  return out


# The training labels' fields every set of a run's test split carries.
LABEL_FIELDS = ("credit", "credit_stderr", "progress", "phi_hard", "klass", "credit_bounded")


def training_labels(examples: list[dict], horizon: int) -> dict:
  """The training labels of dataset examples, padded to `horizon` ([n, H] each)."""
  return pad_fields([{k: np.asarray(e[k]) for k in LABEL_FIELDS} for e in examples], horizon)
