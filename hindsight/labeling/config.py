"""What a labeling job is: how to label (`LabelConfig`) and which episodes (`LabelJob`).

Light on imports (no JAX): the `hindsight` command builds its flags from these fields.
"""

from __future__ import annotations

import dataclasses

import numpy as np

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
    flag instead: hindsight.cli_options.in_flag_terms)."""
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

  @classmethod
  def from_metadata(cls, meta: dict, num_rollouts: int | None = None) -> LabelConfig:
    """The config a label dataset was made with (its metadata), optionally at another K."""
    return cls(
      num_rollouts=num_rollouts or max(int(meta.get("rollouts", 2)), 2),
      replacement=meta.get("replacement", "policy"),
      gamma=float(meta.get("gamma", 1.0)),
      decorative_tolerance=float(meta.get("decorative_tolerance", 0.05)),
      confidence=float(meta.get("confidence", 0.95)),
      stratify=bool(meta.get("stratify", True)),
    )


def label_node(**fields):
  """A `label` config node (ml_collections.ConfigDict) with every LabelConfig field at its
  default, `fields` on top: the one shape in which the training and RL configs say how to
  label, read back whole by `LabelConfig.from_config`."""
  from ml_collections import ConfigDict

  return ConfigDict(dataclasses.replace(LabelConfig(), **fields).as_dict())


# Config fields renamed to LabelConfig's own names: configs and run directories written
# before keep working (hindsight.config_io reads the old name as the new one).
LEGACY_CONFIG_NAMES = {
  "data.label.rollouts": "data.label.num_rollouts",
  "credit.rollouts": "label.num_rollouts",
  "credit.replacement": "label.replacement",
}


@dataclasses.dataclass(frozen=True)
class TextOptions:
  """How to label text traces (`--env text:FILE.jsonl`) through a completions endpoint.

  endpoint, model: the OpenAI-compatible server (its base URL, .../v1) and model name;
    api_key_env: the environment variable that holds its key (unset: no key sent).
  temperature, top_p, max_tokens, stop: the sampling of every continuation (the trace's own
    distribution: set them to what produced the traces).
  chunking: how a trace given as `text` is cut into steps (hindsight.text.trace).
  verifier: `boxed` or MODULE:FN (hindsight.text.verify).
  embedding, similarity: what counts as restating a step (hindsight.text.similarity), for
    policy_other and policy_no_repeat.
  max_draws: policy_other / policy_no_repeat draw up to max_draws x K continuations per step
    to find K that do not restate it.
  null_text: the step that replaces step t under `null`.
  samples_per_request: `n` of each request; concurrency: requests in flight.
  budget_completions, budget_tokens: most a run may request (0: no limit).
  cache: the completion cache (default OUT/completions.sqlite).
  timeout, retries: per request.
  """

  endpoint: str = "http://127.0.0.1:8100/v1"
  model: str = ""
  api_key_env: str = "OPENAI_API_KEY"
  temperature: float = 1.0
  top_p: float = 1.0
  max_tokens: int = 1024
  stop: tuple[str, ...] = ()
  chunking: str = "sentences"
  verifier: str = "boxed"
  embedding: str = "lexical"
  similarity: float = 0.8
  max_draws: int = 4
  null_text: str = ""
  samples_per_request: int = 16
  concurrency: int = 16
  budget_completions: int = 0
  budget_tokens: int = 0
  cache: str = ""
  timeout: float = 60.0
  retries: int = 6

  # Fields that change how a job runs, not what it labels: left out of its description.
  OPERATIONAL = (
    "endpoint",
    "api_key_env",
    "concurrency",
    "budget_completions",
    "budget_tokens",
    "cache",
    "timeout",
    "retries",
  )

  def __post_init__(self):
    if not self.model:
      raise HindsightError("env text:... needs --model NAME (the endpoint's model)")
    if not 0.0 <= self.temperature <= 2.0:
      raise HindsightError(f"temperature must be in [0, 2], got {self.temperature}")
    if not 0.0 < self.top_p <= 1.0:
      raise HindsightError(f"top_p must be in (0, 1], got {self.top_p}")
    for name in ("max_tokens", "max_draws", "samples_per_request", "concurrency"):
      if getattr(self, name) < 1:
        raise HindsightError(f"{name} must be >= 1, got {getattr(self, name)}")
    for name in ("budget_completions", "budget_tokens", "retries"):
      if getattr(self, name) < 0:
        raise HindsightError(f"{name} must be >= 0, got {getattr(self, name)}")
    if not self.timeout > 0:
      raise HindsightError(f"timeout must be > 0, got {self.timeout}")

  def describe(self) -> dict:
    d = dataclasses.asdict(self)
    for name in self.OPERATIONAL:
      d.pop(name)
    d["stop"] = list(d["stop"])
    return d


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
  text: TextOptions | None = None  # text traces only (--env text:FILE.jsonl)

  def describe(self) -> dict:
    """The job as plain JSON types (what the dataset's metadata and a resumed job's check
    compare: equal to its own JSON round trip, so a rerun with the same arguments matches).
    `workers` is left out: labels do not depend on it."""
    d = dataclasses.asdict(self)
    d.update(d.pop("config"))
    d.pop("workers")
    if self.text is None:
      d.pop("text")  # what every job without text traces has always described
    else:
      d["text"] = self.text.describe()
    if d["return_range"] is not None:
      d["return_range"] = [float(x) for x in d["return_range"]]
    return d
