"""What a labeling job is: how to label (`LabelConfig`) and which episodes (`LabelJob`).

Light on imports (no JAX): the `hindsight` command builds its flags from these fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hindsight.data.metadata import LabelMetadata
from hindsight.errors import HindsightError


@dataclasses.dataclass(frozen=True)
class LabelConfig:
  """How to label. Static: every field shapes the compiled program.

  num_rollouts: K branches per arm and step (>= 2, for a standard error).
  replacement: q, one of hindsight.credit.REPLACEMENTS.
  gamma: discount of returns (1 = undiscounted, the default everywhere).
  exact: dynamic programming for credit, credit_realized and progress (tabular only).
  decorative_tolerance: |credit| below this counts as decorative (see credit.classify).
  confidence: level of the interval that decides klass (and of the tie bound,
    credit.estimators).
  stratify: draw the replace arm from q restricted to a' != a_t and scale by 1 - q(a_t)
    (the identity in credit.fields.step_fields): no branch is spent on a' = a_t and the
    variance can only fall. False keeps the plain estimator (a' ~ q), for comparisons.
  """

  num_rollouts: int = 32
  replacement: str = "policy"
  gamma: float = 1.0
  exact: bool = False
  decorative_tolerance: float = 0.05
  confidence: float = 0.95
  stratify: bool = True

  def __post_init__(self):
    """One-line errors for values outside their range, naming the field (the CLI says its
    flag instead: hindsight.cli.options.in_flag_terms)."""
    least = 1 if self.exact else 2
    if self.num_rollouts < least:
      why = "" if self.exact else " for a standard error"
      raise HindsightError(f"num_rollouts must be >= {least}{why}, got {self.num_rollouts}")
    if not 0.0 < self.gamma <= 1.0:
      raise HindsightError(f"gamma must be in (0, 1], got {self.gamma}")
    if not (np.isfinite(self.decorative_tolerance) and self.decorative_tolerance >= 0):
      raise HindsightError(
        f"decorative_tolerance must be finite and >= 0, got {self.decorative_tolerance}"
      )
    if not 0.0 < self.confidence < 1.0:
      raise HindsightError(f"confidence must be in (0, 1), got {self.confidence}")

  @classmethod
  def from_config(cls, node, **overrides) -> LabelConfig:
    """The config a `label` config node describes: the node's fields that are LabelConfig's
    (same names; any other field, such as a labeling job's env, episodes and seed, is the
    caller's), then `overrides` (another K: `num_rollouts=...`)."""
    names = {f.name for f in dataclasses.fields(cls)}
    items = node.items() if hasattr(node, "items") else vars(node).items()
    values = {k: v for k, v in items if k in names}
    return cls(**{**values, **overrides})

  def as_dict(self) -> dict:
    """The fields, for a `label` config node (`hindsight.default_config.label_node`)."""
    return dataclasses.asdict(self)

  def metadata_fields(self) -> dict:
    """The dataset metadata's fields this config fills (`LabelMetadata`; `from_metadata`
    reads them back): every writer of a label dataset (the job, the audit) passes these."""
    return {
      "replacement": self.replacement,
      "rollouts": self.num_rollouts,
      "exact": self.exact,
      "gamma": self.gamma,
      "decorative_tolerance": self.decorative_tolerance,
      "confidence": self.confidence,
      "stratify": self.stratify,
    }

  @classmethod
  def from_metadata(cls, meta: LabelMetadata, num_rollouts: int | None = None) -> LabelConfig:
    """The config a label dataset was made with (its metadata), optionally at another K."""
    return cls(
      num_rollouts=num_rollouts or max(meta.rollouts, 2),
      replacement=meta.replacement,
      gamma=meta.gamma,
      decorative_tolerance=meta.decorative_tolerance,
      confidence=meta.confidence,
      stratify=meta.stratify,
    )


def label_node(**fields):
  """A `label` config node (ml_collections.ConfigDict) with every LabelConfig field at its
  default, `fields` on top: the one shape in which the training and RL configs say how to
  label, read back whole by `LabelConfig.from_config`."""
  from ml_collections import ConfigDict

  return ConfigDict(dataclasses.replace(LabelConfig(), **fields).as_dict())


@dataclasses.dataclass(frozen=True)
class LabelJob:
  """Everything that determines a label dataset (all of it goes into its metadata)."""

  env: str
  episodes: int
  config: LabelConfig
  seed: int = 0
  chunk_size: int = 256
  policy: str | None = None  # adapters only: MODULE:FN
  horizon: int | None = None  # adapters only: cap on episode length
  workers: int = 1  # adapters only: processes (labels do not depend on it)
  return_range: tuple[float, float] | None = None  # adapters only: (lo, hi) of any G_t
  permutations: int = 0  # multi-agent: sampled Shapley orders (0: every coalition up to 8)
  # The family's own job options (a frozen dataclass its label source declares,
  # `labeling.source.SourceEntry.options`: the text family's `text.options.TextOptions`).
  options: Any = None

  def describe(self) -> dict:
    """The job as plain JSON types (what the dataset's metadata and a resumed job's check
    compare: equal to its own JSON round trip, so a rerun with the same arguments matches).
    `workers` is left out: labels do not depend on it. A family's own options are described
    under their class's `job_key` (the text family's: "text")."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["config"] = dataclasses.asdict(self.config)
    d.update(d.pop("config"))
    d.pop("workers")
    options = d.pop("options")
    if options is not None:
      d[options.job_key] = options.describe()
    if d["return_range"] is not None:
      d["return_range"] = [float(x) for x in d["return_range"]]
    return d


def make_labeled(metadata: LabelMetadata, spec: str | None = None):
  """(environment, policy) a label dataset was labeled on: its --env spec with the --policy,
  horizon and --return-range of its job (a gymnax job's horizon as it labeled, from the
  metadata). `spec`: evaluate another environment instead (`make(spec)`), unless it is the
  dataset's own. Every job after labeling (eval, audit) builds the environment here, so
  none of them drops the options the labels were made with."""
  from hindsight.envs.families import EXTERNAL, family_of
  from hindsight.envs.registry import make

  labeled = metadata.env
  spec = spec or labeled
  if spec != labeled or not family_of(spec).options & EXTERNAL:
    return make(spec)
  job = metadata.job_description
  return_range = job.get("return_range")
  return make(
    spec,
    job.get("policy"),
    metadata.horizon or job.get("horizon"),
    tuple(float(x) for x in return_range) if return_range is not None else None,
  )
