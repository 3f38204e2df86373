"""How the drift harness evaluates the runs of one environment family (`DriftBackend`), the
registry that names them, and the cache every backend keeps its expensive pieces in.

The harness (`drift.harness.run_drift`) is one report for every run: it scores the model,
adds the outcome and the learned baselines, computes every metric (`drift.report`) and writes
the page (`drift.render`). What differs by family is where the evaluated episodes and their
reference credit come from, which is a backend's job:

  functional JAX environments   the test split regenerated from its seed (or fresh episodes
                                of --env) relabeled at K_ref with keys of their own, or the DP
                                of a tabular MDP; a second pass checks the reference; shifted
                                sets; the policy-gradient table (`drift.functional`)
  text traces (a plug-in)       the test split's traces relabeled through a completions
                                endpoint, or the text world's DP; a Bayes observer of the text
                                as one more signal (`text.evaluate`)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, Protocol

from hindsight import plugins
from hindsight.envs.families import split_spec
from hindsight.errors import make_dir
from hindsight.files import atomic_savez, sha256_file

# Caches that hold episodes carry their layout in the key: an older layout (fresh sets
# without the trajectory's `success`) is recomputed, never read.
EPISODE_CACHES, EPISODE_CACHE_FORMAT = ("fresh", "shift"), 2


@dataclasses.dataclass(frozen=True)
class Cache:
  """OUT/cache/NAME-<digest of its key>.npz: what a report computes once (references,
  learned baselines) and a rerun reads back. `config` joins every key (the reference's
  label config); `digest` is the label dataset's checksums' (a key's `data`)."""

  directory: str
  digest: str
  config: Any

  @classmethod
  def of_run(cls, cfg, run, out: str, config: Any) -> Cache:
    """A report's cache: `--cache` (default OUT/cache), keyed by the run's label dataset
    (its checksums) and `config`."""
    return cls(
      directory=make_dir(cfg.cache or os.path.join(out, "cache"), "--cache"),
      digest=sha256_file(os.path.join(run.labels.path, "hindsight_checksums.json")),
      config=config,
    )

  def cached(self, name: str, compute: Callable[[], dict], **key) -> dict:
    """compute() once; later runs load the arrays it returned."""
    from hindsight.drift import reference as ref_lib

    key["config"] = self.config
    if name in EPISODE_CACHES:
      key["format"] = EPISODE_CACHE_FORMAT
    path = os.path.join(self.directory, f"{name}-{ref_lib.cache_key(**key)}.npz")
    hit = ref_lib.load_cached(path)
    if hit is None:
      hit = compute()
      atomic_savez(path, hit)  # a killed run leaves no half cache
    return hit


class Evaluation(Protocol):
  """One report's family-specific part, made by `DriftBackend.open`.

  env: the evaluated environment's spec (the report's `env`).
  cache: where its references and the learned baselines are kept.
  learned: the learned baselines trained on the run's outcomes (`drift.baselines.LEARNED`).
  report_options: extra `build_report` options (`k_star_of_every_signal`, `top_k`).
  """

  env: str
  cache: Cache
  learned: tuple[str, ...]
  report_options: dict

  def reference(self) -> dict:
    """The report's `reference` header: kind ("exact DP" | "MC relabel"), rollouts."""
    ...

  def sets(self) -> tuple[Any, list, dict]:
    """(the evaluated EpisodeSet with its reference and training labels, the shifted sets,
    what the reference's check found: the report's `reference.check`, or {})."""
    ...

  def add_signals(self, sets: list) -> None:
    """Signals of its own added to every set (`EpisodeSet.add_row`): a Bayes observer."""
    ...

  def finish(self, report: dict, predictor, models: list) -> dict:
    """Entries of its own for the report (the policy-gradient table; the share of the
    observer's K* the model reaches), given what the harness computed."""
    ...


@dataclasses.dataclass(frozen=True)
class DriftBackend:
  """open(cfg, run, predictor, out) -> Evaluation, for the runs of one family's labels
  (`run`: the harness's view of the training run: labels, splits, label config)."""

  open: Callable[..., Evaluation]


_BACKENDS: plugins.Registry = plugins.Registry()  # family -> DriftBackend


def register_drift_backend(family: str, backend: DriftBackend) -> None:
  """Registers how runs trained on labels of environment family `family` are evaluated."""
  _BACKENDS[family] = backend


def drift_backend(env_spec: str, default: DriftBackend) -> DriftBackend:
  """The backend of the family of `env_spec` (loading its plug-in if needed), else
  `default` (the functional environments')."""
  name, _ = split_spec(env_spec)
  return _BACKENDS.lookup(name, default)
