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
import json
import math
from typing import Any

import jax
import numpy as np

from hindsight.credit.estimators import KLASS_NAMES, UNDETERMINED
from hindsight.errors import HindsightError

SPLITS = ("train", "validation", "test")
# Per-step input and label fields a batch carries (besides the masks).
_STEP_FIELDS = ("actions", "rewards", "credit", "credit_stderr", "klass", "progress")


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """What the model must know about a label dataset; saved as JSON beside checkpoints.

  obs_kind: "discrete" (one int id per step, embedded) or "vector" (float [D], an MLP).
  obs_dim: the number of ids (discrete) or D (vector).
  obs_mean, obs_std: per-feature statistics of the training split (vector observations).
  value_scale: the standard deviation of the training split's finite credits; credits,
    rewards and returns are divided by it inside the model, so one config fits any scale.
  """

  obs_kind: str
  obs_dim: int
  num_actions: int
  max_length: int
  num_classes: int
  obs_mean: tuple[float, ...]
  obs_std: tuple[float, ...]
  value_scale: float
  num_agents: int = 0  # > 0: a multi-agent dataset with agent-level labels (`team`)
  # The labels' class rule (`credit.estimators.classify`): the Predictor classifies its own
  # predictive interval by the same tolerance and confidence.
  decorative_tolerance: float = 0.05
  confidence: float = 0.95
  # An episode succeeds when its return exceeds this (episodes given without `success`).
  success_threshold: float = 0.0

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> DataSpec:
    d = json.loads(text)
    d["obs_mean"], d["obs_std"] = tuple(d["obs_mean"]), tuple(d["obs_std"])
    return cls(**d)


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
    self._cache: dict[int, dict[str, Any]] = {}

  def __len__(self) -> int:
    return len(self.labels)

  def __getitem__(self, i: int) -> dict[str, Any]:
    if i not in self._cache:
      ex = self.labels[int(i)]
      episode = {name: np.asarray(ex[name]) for name in _STEP_FIELDS}
      episode["klass"] = episode["klass"].astype(np.int32)
      episode["observations"] = np.asarray(ex["observations"])
      episode["success"] = bool(ex["success"])
      episode["tags"] = [t.decode() if isinstance(t, bytes) else str(t) for t in ex["tags"]]
      # The credit stderr is the conservative tie bound, not a noise level (not a batch field).
      n = len(episode["actions"])
      episode["credit_bounded"] = np.asarray(ex.get("credit_bounded", np.zeros(n)), bool)
      if "agent" in ex:
        for name in ("agent", "agent_shapley", "agent_shapley_stderr"):
          episode[name] = np.asarray(ex[name])
      if "labeled" in ex:  # an audit's dataset: only these steps carry labels
        episode["labeled"] = np.asarray(ex["labeled"], bool)
      self._cache[i] = episode
    return self._cache[i]

  def scan(self, train: np.ndarray, horizon: int | None) -> tuple[np.ndarray, DataSpec]:
    """One pass over every episode: lengths [N] and the DataSpec of the training split."""
    lengths = np.zeros(len(self), np.int64)
    in_train = np.zeros(len(self), bool)
    in_train[train] = True
    obs, credits, actions_max = [], [], 0
    for i in range(len(self)):
      ex = self.labels[i]
      lengths[i] = len(ex["actions"])
      if in_train[i]:
        obs.append(np.asarray(ex["observations"]))
        credits.append(np.asarray(ex["credit"], np.float64))
        actions_max = max(actions_max, int(np.max(ex["actions"], initial=0)))
    meta = self.labels.metadata
    first = obs[0]
    if np.issubdtype(first.dtype, np.integer) and first.ndim == 1:
      kind, dim = "discrete", int(max(int(o.max(initial=0)) for o in obs)) + 1
      mean, std = (), ()
    elif np.issubdtype(first.dtype, np.floating) and first.ndim == 2:
      flat = np.concatenate(obs).astype(np.float64)
      kind, dim = "vector", flat.shape[1]
      mean, std = tuple(flat.mean(0).tolist()), tuple(np.maximum(flat.std(0), 1e-6).tolist())
    else:
      raise HindsightError(
        f"{self.labels.path}: observations of dtype {first.dtype} and shape {first.shape[1:]} "
        "are neither int ids nor float vectors"
      )
    c = np.concatenate(credits)
    c = c[np.isfinite(c)]
    scale = float(c.std()) if c.size > 1 and c.std() > 0 else 1.0
    spec = DataSpec(
      num_agents=len(meta.get("agent_names") or ()),
      success_threshold=float(meta.get("success_threshold", 0.0)),
      obs_kind=kind,
      obs_dim=dim,
      num_actions=max(int(meta.get("num_actions", 0)), actions_max + 1),
      max_length=int(max(lengths.max(), horizon or 0)),
      num_classes=len(KLASS_NAMES),
      obs_mean=mean,
      obs_std=std,
      value_scale=scale,
      decorative_tolerance=float(meta.get("decorative_tolerance", 0.05)),
      confidence=float(meta.get("confidence", 0.95)),
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


def make_batch(reader: EpisodeReader, ids: np.ndarray, pad: int, spec: DataSpec) -> dict:
  """`episodes_batch` of the dataset episodes `ids` (-1 = an empty row)."""
  return episodes_batch([reader[int(i)] if i >= 0 else None for i in ids], pad, spec)


def as_episode(episode: dict, spec: DataSpec, where: str = "episode") -> dict:
  """An in-memory episode (the export format: observations, actions, rewards, optional
  success, agent and label fields, as lists or arrays) checked against `spec` and converted
  to arrays. Bad input raises a one-line HindsightError naming `where` and the field."""
  if not isinstance(episode, dict):
    raise HindsightError(f"{where}: expected an object with observations, actions, rewards")
  for name in ("observations", "actions", "rewards"):
    if name not in episode:
      raise HindsightError(f"{where}: missing field '{name}'")
  try:
    actions = np.asarray(episode["actions"])
    with np.errstate(over="ignore"):  # a huge reward becomes inf, refused below
      rewards = np.asarray(episode["rewards"], np.float32)
    obs = np.asarray(episode["observations"])
  except (TypeError, ValueError, OverflowError):
    raise HindsightError(f"{where}: observations, actions and rewards must be arrays") from None
  n = actions.shape[0] if actions.ndim == 1 else -1
  if n < 1:
    raise HindsightError(f"{where}: 'actions' must be a non-empty list of ints")
  if not np.issubdtype(actions.dtype, np.integer):
    raise HindsightError(f"{where}: 'actions' must be ints, got {actions.dtype}")
  if actions.min() < 0 or actions.max() >= spec.num_actions:
    raise HindsightError(f"{where}: an action is outside [0, {spec.num_actions})")
  if rewards.shape != (n,) or not np.all(np.isfinite(rewards)):
    raise HindsightError(f"{where}: 'rewards' must be {n} finite numbers, one per action")
  want = (n, spec.obs_dim) if spec.obs_kind == "vector" else (n,)
  if obs.shape != want:
    raise HindsightError(f"{where}: 'observations' has shape {obs.shape}, the model needs {want}")
  if spec.obs_kind == "vector" and not np.issubdtype(obs.dtype, np.number):
    raise HindsightError(f"{where}: 'observations' must be numbers")
  if spec.obs_kind == "vector" and not np.all(np.isfinite(obs)):
    raise HindsightError(f"{where}: 'observations' must be finite (no NaN or inf)")
  if spec.obs_kind == "discrete" and not np.issubdtype(obs.dtype, np.integer):
    raise HindsightError(f"{where}: 'observations' must be int ids for this model")
  out = {"observations": obs, "actions": actions.astype(np.int32), "rewards": rewards}
  success = episode.get("success")
  if success is not None and not isinstance(success, bool | int | float | np.bool_ | np.number):
    raise HindsightError(f"{where}: 'success' must be true or false")
  out["success"] = bool(rewards.sum() > spec.success_threshold if success is None else success)
  for name in ("credit", "credit_stderr", "progress"):
    if episode.get(name) is not None:
      try:
        out[name] = np.asarray(episode[name], np.float32).reshape(n)
      except (TypeError, ValueError):
        raise HindsightError(f"{where}: '{name}' must be {n} numbers") from None
  if episode.get("klass") is not None:
    klass = np.asarray(episode["klass"])
    if klass.dtype.kind in "US":  # the export format names classes
      unknown = set(klass.tolist()) - set(KLASS_NAMES)
      if unknown:
        raise HindsightError(f"{where}: unknown klass {sorted(unknown)[0]!r}")
      klass = np.array([KLASS_NAMES.index(k) for k in klass.tolist()])
    out["klass"] = klass.astype(np.int32)
  if spec.num_agents:
    try:
      agent = np.asarray(episode.get("agent", np.arange(n) % spec.num_agents))
    except (TypeError, ValueError):
      agent = np.zeros(0)
    ok = agent.shape == (n,) and np.issubdtype(agent.dtype, np.integer)
    if not ok or agent.min() < 0 or agent.max() >= spec.num_agents:
      raise HindsightError(f"{where}: 'agent' must be {n} ids in [0, {spec.num_agents})")
    out["agent"] = agent
  return out


def episodes_batch(episodes, pad: int, spec: DataSpec) -> dict:
  """Padded arrays of in-memory episodes (None = an empty row), every field [B, T] unless
  noted; episodes longer than `pad` are cut at `pad`.

  Episodes are dicts of arrays (EpisodeReader items, or `as_episode` outputs); fields a
  scored-only episode lacks (credit, its stderr, progress, klass) stay 0 and out of
  label_mask. mask: valid steps; label_mask: valid steps whose credit label is finite (an
  `undefined` credit under policy_other is NaN and stays out of the regression loss);
  class_mask: valid steps whose class is a label (all of them, except the steps an audit's
  partial dataset left unlabeled: episode["labeled"] false).
  observations: float [B, T, D] or int [B, T]; success: float [B].
  Multi-agent specs add agent [B, T] (who acted), agent_shapley and its stderr [B, n], and
  agent_mask [B] (a real episode with agent labels).
  """
  B = len(episodes)
  vector = spec.obs_kind == "vector"
  obs_shape = (B, pad, spec.obs_dim) if vector else (B, pad)
  batch = {
    "observations": np.zeros(obs_shape, np.float32 if vector else np.int32),
    "actions": np.zeros((B, pad), np.int32),
    "rewards": np.zeros((B, pad), np.float32),
    "credit": np.zeros((B, pad), np.float32),
    "credit_stderr": np.zeros((B, pad), np.float32),
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
    n = min(len(ep["actions"]), pad)
    obs = ep["observations"][:n]
    batch["observations"][row, :n] = obs if vector else np.clip(obs, 0, spec.obs_dim - 1)
    batch["actions"][row, :n] = np.clip(ep["actions"][:n], 0, spec.num_actions - 1)
    batch["rewards"][row, :n] = ep["rewards"][:n]
    batch["mask"][row, :n] = True
    batch["success"][row] = float(ep["success"])
    if "credit" in ep:
      for name in ("progress", "klass"):
        if name in ep:
          batch[name][row, :n] = ep[name][:n]
      credit = np.asarray(ep["credit"][:n], np.float32)
      stderr = np.asarray(ep.get("credit_stderr", np.zeros(n))[:n], np.float32)
      finite = np.isfinite(credit) & np.isfinite(stderr)
      batch["credit"][row, :n] = np.where(finite, credit, 0.0)
      batch["credit_stderr"][row, :n] = np.where(finite, stderr, 0.0)
      labeled = np.asarray(ep.get("labeled", np.ones(n, bool))[:n], bool)
      batch["label_mask"][row, :n] = finite & labeled
      batch["class_mask"][row, :n] = labeled
    if n_agents:
      batch["agent"][row, :n] = ep["agent"][:n]
      if "agent_shapley" in ep:
        batch["agent_shapley"][row] = ep["agent_shapley"]
        batch["agent_shapley_stderr"][row] = ep["agent_shapley_stderr"]
        batch["agent_mask"][row] = True
  return batch
