"""The text family's job options: how `hindsight label --env text:FILE.jsonl` resamples its
traces through a completions endpoint. Declared once, here: the job carries them
(`LabelJob.options`), the dataset records them, and `hindsight label` makes one flag of each
field (its metadata["help"]). JAX-free (the CLI's parser reads it).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from hindsight.errors import HindsightError


def _field(default, help: str):
  return dataclasses.field(default=default, metadata={"help": help})


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
  tools, max_turns: agent traces (hindsight.text.agent): the environment that executes their
    tool calls in every continuation, and the most model turns a continuation may take.
  timeout, retries: per request.
  """

  endpoint: str = _field("http://127.0.0.1:8100/v1", "OpenAI-compatible base URL (.../v1)")
  model: str = _field("", "the endpoint's model name (required for text)")
  api_key_env: str = _field(
    "OPENAI_API_KEY", "environment variable holding the API key (unset: none sent)"
  )
  temperature: float = _field(1.0, "sampling temperature of every continuation")
  top_p: float = _field(1.0, "nucleus top-p of every continuation")
  max_tokens: int = _field(1024, "cap on each continuation")
  stop: tuple[str, ...] = _field((), "stop sequence (repeatable)")
  chunking: str = _field("sentences", "steps of a `text` trace: sentences | newlines | re:PATTERN")
  verifier: str = _field("boxed", "boxed (last \\boxed{} vs `reference`) or MODULE:FN")
  embedding: str = _field("lexical", "what counts as restating a step: lexical or MODULE:FN")
  similarity: float = _field(0.8, "cosine at or above which a step restates another")
  max_draws: int = _field(4, "policy_other/no_repeat: draws per step, in units of K")
  null_text: str = _field("", "null: the step that replaces step t")
  samples_per_request: int = _field(16, "n of each request")
  concurrency: int = _field(16, "requests in flight")
  budget_completions: int = _field(0, "most completions this run may request (0: no limit)")
  budget_tokens: int = _field(0, "most completion tokens this run may spend (0: no limit)")
  cache: str = _field("", "completion cache file (default: OUT/completions.sqlite)")
  tools: str = _field(
    "",
    "agent traces: the environment that executes tool calls (tool-world "
    "or MODULE:ENV; docs/agents-text.md)",
  )
  max_turns: int = _field(32, "agent traces: most model turns per continuation")
  timeout: float = _field(60.0, "seconds per request")
  retries: int = _field(6, "retries of a failed request")

  # Where the job's description (`LabelJob.describe`) and the dataset's metadata keep them.
  job_key: ClassVar[str] = "text"
  # The flags' group in `hindsight label --help`.
  flag_group: ClassVar[str] = "text traces (--env text:FILE.jsonl, docs/text.md)"
  # Fields that change how a job runs, not what it labels: left out of its description.
  OPERATIONAL: ClassVar[tuple[str, ...]] = (
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
    for name in ("max_tokens", "max_draws", "samples_per_request", "concurrency", "max_turns"):
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
    if not self.tools:  # plain text traces: described as before agent traces existed
      d.pop("tools"), d.pop("max_turns")
    return d
