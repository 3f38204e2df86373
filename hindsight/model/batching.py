"""Label episodes as padded, length-bucketed batches for the credit model.

The whole batch schedule is a pure function of (seed, epoch): which episodes form batch i of
epoch e never depends on the number of processes or devices, or on where a run was restarted.
Each process then decodes only its own rows of every global batch (`rows=`), and the global
array is assembled from the per-process pieces (`hindsight.model.sharding`).

Shapes: B = batch size (episodes), T = the batch's bucket length (padded steps), D = float
observation features.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from hindsight.credit.estimators import UNDETERMINED
from hindsight.credit.names import KLASS_NAMES
from hindsight.data.episode import Episode, check_length
from hindsight.errors import HindsightError
from hindsight.model.encoders import detect_encoder, encoder_class
from hindsight.model.spec import DataSpec, value_scale

SPLITS = ("train", "validation", "test")


def split_episodes(num_episodes: int, fractions: tuple[float, float], seed: int) -> dict:
  """Episode indices of each split, by a seeded permutation of whole episodes.

  fractions: (validation, test) shares; train gets the rest. Returns {split: int64 [n]},
  each sorted (the order inside a split is the batch plan's business).
  """
  val, test = fractions
  if not (0 < val < 1 and 0 < test < 1 and val + test < 1):
    raise HindsightError(f"data split fractions must be in (0, 1) and sum below 1, got {fractions}")
  n_val, n_test = math.ceil(num_episodes * val), math.ceil(num_episodes * test)
  if num_episodes - n_val - n_test < 1:
    raise HindsightError(f"{num_episodes} episodes are too few to split into train/val/test")
  perm = np.asarray(jax.random.permutation(jax.random.key(seed), num_episodes))
  parts = np.split(perm, [n_val, n_val + n_test])
  return {
    "validation": np.sort(parts[0]),
    "test": np.sort(parts[1]),
    "train": np.sort(parts[2]),
  }


class EpisodeReader:
  """Decoded episodes of a `Labels` dataset, read on demand and kept (compact) once read."""

  def __init__(self, labels):
    self.labels = labels
    self._cache: dict[int, Episode] = {}

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i: int) -> Episode:
    if i not in self._cache:
      self._cache[i] = Episode.from_example(self.labels[int(i)])
    return self._cache[i]

  def scan(
    self, train: np.ndarray, horizon: int | None, encoder: str = "", options: dict | None = None
  ) -> tuple[np.ndarray, DataSpec]:
    """One pass over every episode: lengths [N] and the DataSpec of the training split.
    The step encoder is the kind `encoder` names, or ("") the one whose kind the data is
    (`model.encoders.detect_encoder`), fitted on the training split with `options` (a text
    tokenizer's `tokenizer` and `vocab_size`: default a 512-id BPE)."""
    options = dict(options or {})
    lengths = np.zeros(len(self), np.int64)
    in_train = np.zeros(len(self), bool)
    in_train[train] = True
    examples, credits, actions_max = [], [], 0
    for i in range(len(self)):
      ex = self.labels[i]
      lengths[i] = len(ex["actions"])
      if in_train[i]:
        examples.append(ex)
        credits.append(np.asarray(ex["credit"], np.float64))
        actions_max = max(actions_max, int(np.max(ex["actions"], initial=0)))
    meta = self.labels.metadata
    cls = encoder_class(encoder) if encoder else detect_encoder(examples[0])
    if cls is None:
      first = np.asarray(examples[0]["observations"])
      raise HindsightError(
        f"{self.labels.path}: observations of dtype {first.dtype} and shape {first.shape[1:]} "
        "are neither int ids nor float vectors"
      )
    spec = DataSpec(
      encoder=cls.fit(examples, options),
      num_agents=len(meta.agent_names),
      success_threshold=meta.success_threshold,
      success_from_return=meta.success_from_return,
      num_actions=max(meta.num_actions, actions_max + 1),
      max_length=int(max(lengths.max(), horizon or 0)),
      num_classes=len(KLASS_NAMES),
      value_scale=value_scale(np.concatenate(credits)),
      decorative_tolerance=meta.decorative_tolerance,
      confidence=meta.confidence,
      label_options=meta.text or "",
    )
    return lengths, spec


def bucket_lengths(lengths: np.ndarray, num_buckets: int, multiple: int = 8) -> tuple[int, ...]:
  """Padded lengths of the buckets: length quantiles rounded up to `multiple` (few shapes,
  so few compiles, and little padding)."""
  qs = np.quantile(lengths, np.linspace(0, 1, num_buckets + 1)[1:], method="higher")
  return tuple(sorted({int(math.ceil(q / multiple) * multiple) for q in qs}))


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """The batches of one split: batch i of epoch e, as episode ids (-1 = an empty row).

  Episodes are grouped by bucket (padded length), shuffled within their bucket and the
  batches shuffled among themselves with keys folded from (seed, epoch) when `shuffle`.
  A bucket's last batch is topped up with empty rows, so every batch has `batch_size` rows
  and no episode is dropped.
  """

  episodes: np.ndarray  # int [n] dataset indices of the split
  lengths: np.ndarray  # int [n] their lengths
  batch_size: int
  pad_lengths: tuple[int, ...]
  seed: int
  shuffle: bool

  @property
  def buckets(self) -> np.ndarray:
    return np.searchsorted(np.asarray(self.pad_lengths), self.lengths)

  @property
  def steps_per_epoch(self) -> int:
    counts = np.bincount(self.buckets, minlength=len(self.pad_lengths))
    return int(sum(math.ceil(c / self.batch_size) for c in counts))

  def at(self, step: int) -> tuple[int, np.ndarray]:
    """(pad_length, int [batch_size] episode ids) of global step `step`, batch
    step % steps_per_epoch of epoch step // steps_per_epoch. The epoch's order is made once
    and kept while its steps are read (a training loop's access pattern)."""
    epoch, i = divmod(step, self.steps_per_epoch)
    cached = self.__dict__.get("_epoch_cache")
    if cached is None or cached[0] != epoch:
      cached = (epoch, self.epoch(epoch))
      object.__setattr__(self, "_epoch_cache", cached)  # a cache, not part of the plan
    return cached[1][i]

  def epoch(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    """[(pad_length, int [batch_size] episode ids)] in the order they are used."""
    key = jax.random.fold_in(jax.random.key(self.seed), epoch)
    bucket_key, order_key = jax.random.split(key)
    buckets = self.buckets
    batches = []
    for b, pad in enumerate(self.pad_lengths):
      ids = self.episodes[buckets == b]
      if self.shuffle:
        ids = ids[np.asarray(jax.random.permutation(jax.random.fold_in(bucket_key, b), ids.size))]
      for start in range(0, ids.size, self.batch_size):
        chunk = ids[start : start + self.batch_size]
        row = np.full(self.batch_size, -1, np.int64)
        row[: chunk.size] = chunk
        batches.append((pad, row))
    if self.shuffle:
      order = np.asarray(jax.random.permutation(order_key, len(batches)))
      batches = [batches[i] for i in order]
    return batches


def process_rows(batch_size: int, process_index: int, process_count: int) -> slice:
  """The rows of every global batch that this process reads and feeds to its devices."""
  if batch_size % process_count:
    raise HindsightError(f"batch size {batch_size} is not divisible by {process_count} processes")
  per = batch_size // process_count
  return slice(process_index * per, (process_index + 1) * per)


def make_batch(
  reader: EpisodeReader, ids: np.ndarray, pad: int, spec: DataSpec, shape=None
) -> dict:
  """`episodes_batch` of the dataset episodes `ids` (-1 = an empty row) at the step
  encoder's shape key `shape` (None: the training shape)."""
  return episodes_batch([reader[int(i)] if i >= 0 else None for i in ids], pad, spec, shape=shape)


def batch_shape(reader: EpisodeReader, ids: np.ndarray, spec: DataSpec):
  """The step encoder's shape key of the episodes `ids` (-1 = an empty row): a text batch's
  own token bucket, so a batch of short traces is not padded to the longest training one.
  Taken over a whole global batch, every process pads its rows alike."""
  return spec.encoder.shape([reader[int(i)] for i in ids if i >= 0])


def episodes_batch(
  episodes, pad: int, spec: DataSpec, allow_longer: bool = False, shape=None
) -> dict:
  """Padded arrays of in-memory episodes (None = an empty row), every field [B, T] unless
  noted; episodes longer than `pad` are cut at `pad`, and episodes longer than the model's
  `spec.max_length` are refused unless `allow_longer` (`episode.check_length`).

  Episodes are `Episode`s (EpisodeReader items, or `Episode.parse` outputs); fields a
  scored-only episode lacks (credit, its stderr, progress, klass) stay 0 and out of
  label_mask. mask: valid steps; label_mask: valid steps whose credit label is finite (an
  `undefined` credit under policy_other is NaN and stays out of the regression loss);
  class_mask: valid steps whose class is a label (all of them, except the steps an audit's
  partial dataset left unlabeled: episode["labeled"] false); success: float [B];
  credit_noise: the label's noise level, its sample stderr (`credit_sample_stderr`) where
  the labels carry one and credit_stderr elsewhere (`model.loss`, `sample_noise`).
  What each step shows comes from the step encoder (`StepEncoder.features`, at its shape
  key `shape`, None: the training shape): observations int [B, T] or float [B, T, D], or a
  text step's tokens [B, T, L].
  Multi-agent specs add agent [B, T] (who acted), agent_shapley and its stderr [B, n], and
  agent_mask [B] (a real episode with agent labels).
  """
  B = len(episodes)
  batch = {
    **spec.encoder.features(episodes, pad, shape),
    "actions": np.zeros((B, pad), np.int32),
    "rewards": np.zeros((B, pad), np.float32),
    "credit": np.zeros((B, pad), np.float32),
    "credit_stderr": np.zeros((B, pad), np.float32),
    "credit_noise": np.zeros((B, pad), np.float32),
    "progress": np.zeros((B, pad), np.float32),
    "klass": np.full((B, pad), UNDETERMINED, np.int32),
    "mask": np.zeros((B, pad), bool),
    "label_mask": np.zeros((B, pad), bool),
    "class_mask": np.zeros((B, pad), bool),
    "success": np.zeros(B, np.float32),
  }
  n_agents = spec.num_agents
  if n_agents:
    batch["agent"] = np.zeros((B, pad), np.int32)
    batch["agent_shapley"] = np.zeros((B, n_agents), np.float32)
    batch["agent_shapley_stderr"] = np.zeros((B, n_agents), np.float32)
    batch["agent_mask"] = np.zeros(B, bool)
  for row, ep in enumerate(episodes):
    if ep is None:
      continue
    if not allow_longer:
      check_length(ep, spec, f"row {row}")
    n = min(len(ep), pad)
    batch["actions"][row, :n] = np.clip(ep.actions[:n], 0, spec.num_actions - 1)
    batch["rewards"][row, :n] = ep.rewards[:n]
    batch["mask"][row, :n] = True
    batch["success"][row] = float(ep.success)
    if ep.has_labels:
      if ep.progress is not None:
        batch["progress"][row, :n] = ep.progress[:n]
      if ep.klass is not None:
        batch["klass"][row, :n] = ep.klass[:n]
      credit = np.asarray(ep.credit[:n], np.float32)
      stderr = ep.credit_stderr if ep.credit_stderr is not None else np.zeros(n)
      stderr = np.asarray(stderr[:n], np.float32)
      finite = np.isfinite(credit) & np.isfinite(stderr)
      batch["credit"][row, :n] = np.where(finite, credit, 0.0)
      batch["credit_stderr"][row, :n] = np.where(finite, stderr, 0.0)
      # The label's noise level: its sample stderr where the labels carry one, else its stderr.
      noise = stderr
      if ep.credit_sample_stderr is not None:
        sample = np.asarray(ep.credit_sample_stderr[:n], np.float32)
        noise = np.where(np.isfinite(sample), sample, stderr)
      batch["credit_noise"][row, :n] = np.where(finite, noise, 0.0)
      labeled = np.ones(n, bool) if ep.labeled is None else np.asarray(ep.labeled[:n], bool)
      batch["label_mask"][row, :n] = finite & labeled
      batch["class_mask"][row, :n] = labeled
    if n_agents:
      batch["agent"][row, :n] = ep.agent[:n]
      if ep.agent_shapley is not None:
        batch["agent_shapley"][row] = ep.agent_shapley
        batch["agent_shapley_stderr"][row] = ep.agent_shapley_stderr
        batch["agent_mask"][row] = True
  return batch
