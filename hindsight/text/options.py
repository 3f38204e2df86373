"""The text family's job options: how `hindsight label --env text:FILE.jsonl` resamples its
traces through a completions endpoint. Declared once, here: the job carries them
(`LabelJob.options`), the dataset records them, and `hindsight label` makes one flag of each
field (its metadata["help"]). JAX-free (the CLI's parser reads it).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import ClassVar

from hindsight.errors import HindsightError
from hindsight.text.client import check_endpoint


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
  tools, max_turns: agent traces (hindsight.agentic.labeler): the environment that executes their
    tool calls in every continuation, and the most model turns a continuation may take.
  agent_steps: what one agent step is: `turn` (one assistant turn: its text, its calls and
    their results) or `chunks` (every thought chunk and every call its own step); "": the
    environment's `agent_steps` where it names one (the tool world's exact credit is per
    choice: chunks), else turn.
  chat_template: a Hugging Face model folder or a Jinja template file: the layout of calls
    and results (`tool_syntax.layout_from_template`) and the prompt of `messages` traces;
    "": the inline Hermes layout.
  api: `completions` (/v1/completions, the text continued as it stands) or `chat`
    (/v1/chat/completions, the text read back as messages with structured tool calls).
  tool_check: the self-check of agent traces: this many continuations per trace have their
    calls run again on a fresh fork and their results compared (`agentic.tools.recheck`).
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
  agent_steps: str = _field(
    "",
    "agent traces: one step is a `turn` (text + calls + results) or `chunks` (default: "
    "the environment's choice, else turn)",
  )
  chat_template: str = _field(
    "", "model folder or Jinja file: the layout of calls and results, messages' prompts"
  )
  api: str = _field("completions", "completions (/v1/completions) or chat (/v1/chat/completions)")
  tool_check: int = _field(
    0, "agent traces: continuations per trace whose calls are run again on a fresh fork"
  )
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
    check_endpoint(self.endpoint)
    if not 0.0 <= self.temperature <= 2.0:
      raise HindsightError(f"temperature must be in [0, 2], got {self.temperature}")
    if not 0.0 < self.top_p <= 1.0:
      raise HindsightError(f"top_p must be in (0, 1], got {self.top_p}")
    for name in ("max_tokens", "max_draws", "samples_per_request", "concurrency", "max_turns"):
      if getattr(self, name) < 1:
        raise HindsightError(f"{name} must be >= 1, got {getattr(self, name)}")
    for name in ("budget_completions", "budget_tokens", "retries", "tool_check"):
      if getattr(self, name) < 0:
        raise HindsightError(f"{name} must be >= 0, got {getattr(self, name)}")
    if self.agent_steps not in ("", "turn", "chunks"):
      raise HindsightError(f"agent_steps must be turn or chunks, got '{self.agent_steps}'")
    if self.api not in ("completions", "chat"):
      raise HindsightError(f"api must be completions or chat, got '{self.api}'")
    if not self.timeout > 0:
      raise HindsightError(f"timeout must be > 0, got {self.timeout}")

  @staticmethod
  def job_env(env: str, episodes: int | None) -> tuple[str, int]:
    """(`--env text:FILE.jsonl` as a job records it, its episodes): FILE absolute, so a later
    command run from another directory (`hindsight eval`'s resampled reference) finds it,
    and every trace in FILE where no number of episodes is given."""
    from hindsight.text.trace import read_traces

    path = env.partition(":")[2]
    if not path:
      raise HindsightError("env text needs a trace file: text:FILE.jsonl")
    if episodes is None:
      episodes = len(read_traces(path))
    return f"text:{os.path.abspath(path)}", episodes

  def describe(self) -> dict:
    d = dataclasses.asdict(self)
    for name in self.OPERATIONAL:
      d.pop(name)
    d["stop"] = list(d["stop"])
    d.pop("tool_check")  # a check: it changes no label
    if not self.tools:  # plain text traces: described as before agent traces existed
      d.pop("tools"), d.pop("max_turns"), d.pop("agent_steps")
    for name, default in (("chat_template", ""), ("api", "completions")):
      if d[name] == default:  # described as before these existed: the same labels
        d.pop(name)
    if self.chat_template:  # the layout itself: what a server reading the labels parses
      d["tool_layout"] = _template_layout(self.chat_template)
    return d


@functools.cache
def _template_layout(path: str) -> dict:
  from hindsight.text.chat_template import load_chat_template
  from hindsight.text.tool_syntax import layout_from_template

  return layout_from_template(load_chat_template(path), path).to_json()
