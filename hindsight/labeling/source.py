"""The interface between the labeling job and whatever labels episodes: `LabelSource`.

`hindsight.labeling.job` chunks, resumes, shards and writes the dataset; a label source turns
one chunk of episode indices into the stored arrays. Three implement it: the JAX engine
(`labeling.jax_source.JaxSource`), the Python-adapter labeler for Gymnasium and dm_env
(`labeling.py_labeler.PySource`) and the text labeler (`text.source.TextSource`). Each
environment family names its source (`hindsight.envs.families.EnvFamily.label_source`), so a
new kind of labeler is one class plus the family that uses it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class LabelSource(Protocol):
  """What the labeling job reads of a source: the description written into the dataset's
  metadata and features, and the chunks.

  name: the environment's name (the progress bar, metadata `env_name`).
  policy_name: the behaviour policy's name (metadata `policy`).
  horizon: H, the length every chunk's step arrays are padded to; None where it is known only
    once every chunk is labeled (`dataset_metadata` then gives it).
  num_actions, null_action: the action space (null_action None: there is none).
  success_threshold, success_from_return: success is return > threshold, or the
    environment's own flag where success_from_return is False.
  tag_names: the names of the step tags, by tag id.
  obs_shape, obs_dtype: one step's observation.
  with_states: whether chunks carry `state_index` (tabular states, for the exact DP).
  texts: whether chunks carry the text fields (prompt, trace_id, step_text).
  num_agents, agent_names: multi-agent environments (0 and () otherwise).
  coalitions: whether chunks carry every coalition's value (enumerated Shapley values);
  permutations: the sampled agent orders otherwise (0 when there are no agents).
  """

  name: str
  policy_name: str
  horizon: int | None
  num_actions: int
  null_action: int | None
  success_threshold: float
  success_from_return: bool
  tag_names: tuple[str, ...]
  obs_shape: tuple[int, ...]
  obs_dtype: Any
  with_states: bool
  texts: bool
  num_agents: int
  agent_names: tuple[str, ...]
  coalitions: bool
  permutations: int

  def chunk_multiple(self) -> int:
    """Chunks are rounded up to a multiple of this (whole micro-batches on the devices)."""
    ...

  def label(self, seed: int, start: int, stop: int, bar) -> dict[str, np.ndarray]:
    """Labels episodes start..stop-1 of the job rooted at `seed`: per-step arrays [n, H, ...]
    and per-episode ones [n] (`hindsight.data.labels`' fields, `episode` included), advancing
    the progress bar `bar` by n. Labels depend only on (seed, episode index), never on the
    chunk."""
    ...

  def dataset_metadata(self, chunk_paths: list[str]) -> dict[str, Any]:
    """Metadata known only once every chunk file exists (text traces: the horizon, the
    completions spent); {} for most sources."""
    ...


def chunk_totals(paths: list[str], names: tuple[str, ...]) -> dict[str, np.ndarray]:
  """The per-episode arrays `names` of every chunk file, concatenated."""
  parts: dict[str, list] = {name: [] for name in names}
  for path in paths:
    with np.load(path) as z:
      for name in names:
        parts[name].append(z[name])
  return {name: np.concatenate(v) for name, v in parts.items()}
