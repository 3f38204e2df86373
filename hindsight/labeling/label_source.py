"""What a label source is: the interface between the labeling job and whatever labels episodes
(`LabelSource`, its `SourceInfo`), and the chunk files' reader every source's `finish` uses.
Who labels which family is `labeling.source`'s registry; the sources import this module, the
registry imports them by name only when a job builds one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class SourceInfo:
  """What a source says of the episodes it labels: the dataset's metadata it knows
  (`data.metadata.LabelMetadata`'s fields of the same names) and the shape of its features.

  env_name, policy: the environment's and the behaviour policy's names.
  horizon: H, the length every chunk's step arrays are padded to; None where it is known only
    once every chunk is labeled (`LabelSource.finish` then gives it).
  num_actions, null_action: the action space (null_action None: there is none).
  success_threshold, success_from_return: success is return > threshold, or the
    environment's own flag where success_from_return is False.
  tag_names: the names of the step tags, by tag id.
  agent_names: multi-agent environments (() otherwise); permutations: the sampled agent
    orders of its Shapley values (0: every coalition, or no agents).
  obs_shape, obs_dtype: one step's observation.
  with_states: chunks carry `state_index` (tabular states, for the exact DP).
  coalitions: chunks carry every coalition's value (enumerated Shapley values).
  texts: chunks carry the text fields (prompt, trace_id, step_text).
  compiles: its first chunk compiles XLA programs (the progress bar says "compiling" until
    it is done); a source whose work is requests to a server does not.
  """

  env_name: str
  policy: str
  horizon: int | None
  num_actions: int
  null_action: int | None
  success_threshold: float
  success_from_return: bool
  tag_names: tuple[str, ...]
  obs_shape: tuple[int, ...]
  obs_dtype: Any
  agent_names: tuple[str, ...] = ()
  permutations: int = 0
  with_states: bool = False
  coalitions: bool = False
  texts: bool = False
  compiles: bool = True

  @property
  def num_agents(self) -> int:
    return len(self.agent_names)


@runtime_checkable
class LabelSource(Protocol):
  """What the labeling job calls of a source: its `info`, and three methods."""

  info: SourceInfo

  def chunk_multiple(self) -> int:
    """Chunks are rounded up to a multiple of this (whole micro-batches on the devices)."""
    ...

  def label(self, seed: int, start: int, stop: int, bar) -> dict[str, np.ndarray]:
    """Labels episodes start..stop-1 of the job rooted at `seed`: per-step arrays [n, H, ...]
    and per-episode ones [n] (`hindsight.data.labels`' fields, `episode` included), advancing
    the progress bar `bar` (tqdm's interface) by n. Labels depend only on (seed, episode
    index), never on the chunk or on anything else the source was built with."""
    ...

  def finish(self, chunk_paths: list[str]) -> dict[str, Any]:
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
