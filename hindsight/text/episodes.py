"""Text traces as the credit model reads them: `Episode`s with `step_text`.

This is the `text` episode format (`data.formats`, registered by the text plug-in): a text
model's `Episode.parse` takes a trace in the JSONL format of docs/text.md (`steps` as
objects with `text` or as strings, or `text` cut into steps by the chunking rule its labels
used, or a dataset episode's `step_text`) with its outcome: `outcome` in [0, 1], `success`, the
`rewards` of an exported episode, or a `reference` that the labels' verifier checks the
completion against (`DataSpec.label_options`: the label job's `chunking` and `verifier`; a
model of labels that record none cuts sentences and checks the last `\\boxed{}`).
The T steps become an Episode of T steps: rewards 0 but the last (the outcome), actions 0
(text has no action ids), observations t / T (the position feature of text datasets), tags
"step" or "tool_call", and the trace's `prompt` (read by an LM-backbone credit model). An
agent trace's tool results (steps of role `tool`, or `<tool_response>` markup in `text`) join
the call before them, as its labels merge them (`text.agent_trace`).

Every step must hold visible text, be valid UTF-8 and fit the model's text encoder
(`TextEncoder.check_steps`: at most its `max_step_tokens`); otherwise a one-line
HindsightError names the trace (its place, and its `id` where it has one) and the step.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from hindsight.data.episode import Episode, parse_labels
from hindsight.errors import HindsightError
from hindsight.model.spec import DataSpec
from hindsight.text.estimate import SUCCESS_THRESHOLD


@functools.cache
def _reading(label_options: str) -> tuple[str, str, str, object]:
  """(chunking, verifier, what an agent step is, the layout of calls and results) of a
  model's labels (`DataSpec.label_options`; labels that predate agent turns cut chunks)."""
  from hindsight.text.tool_syntax import ToolLayout

  options = json.loads(label_options) if label_options else {}
  layout = ToolLayout.from_json(options.get("tool_layout"))
  return (str(options.get("chunking", "sentences")), str(options.get("verifier", "boxed")),
          str(options.get("agent_steps", "chunks")), layout)  # fmt: skip


@functools.cache
def _verifier(spec: str):
  """The verifier `spec` names, loaded once (a server checks every request with it)."""
  from hindsight.text.verify import load_verifier

  return load_verifier(spec)


def _steps_of(episode: dict, chunking: str, where: str, unit: str = "turn",
              layout=None) -> tuple[list[str], list[str], list[str] | None]:  # fmt: skip
  """(the steps' texts, their tags, their names in errors where not "step i") of a trace in
  any of the accepted layouts; an agent trace's steps as its labels cut them (`unit`,
  `layout`: `agent_trace.agent_view`), named by their entries in `steps` too."""
  from hindsight.text.tool_syntax import HERMES

  layout = layout or HERMES
  given = None  # the trace's own steps, as objects (an agent trace is re-read from them)
  names = None
  if episode.get("step_text") is not None:
    texts, roles = list(episode["step_text"]), [None] * len(episode["step_text"])
  elif episode.get("steps") is not None:
    steps = episode["steps"]
    if not isinstance(steps, list | tuple):
      raise HindsightError(f"{where}: 'steps' must be a list")
    texts, roles, given = [], [], []
    for i, s in enumerate(steps):
      s = {"text": s} if isinstance(s, str) else s
      if not (isinstance(s, dict) and "text" in s):
        raise HindsightError(f"{where}: step {i} must be a string or an object with 'text'")
      texts.append(s["text"])
      roles.append("tool_call" if s.get("tool_call") or s.get("tool_calls") else None)
      given.append(s)
  elif isinstance(episode.get("text"), str):
    from hindsight.text.trace import chunk_text

    texts = chunk_text(episode["text"], chunking)
    roles = [None] * len(texts)
  else:
    raise HindsightError(f"{where}: missing field 'steps' (a text trace: steps, text or step_text)")
  if not texts:
    raise HindsightError(f"{where}: no steps")
  for i, t in enumerate(texts):
    if not isinstance(t, str):
      raise HindsightError(f"{where}: step {i} is not a string")
    if not t.strip():
      raise HindsightError(f"{where}: step {i} is empty")
  agent = _agent_trace(episode, given, layout)
  if agent is not None:  # the agent's steps, each result in its call's, as its labels cut them
    from hindsight.text.agent_trace import agent_view

    view = agent_view(agent, where, chunking, layout, unit)
    texts = [s.text for s in view.trace.steps]
    roles = ["tool_call" if c else None for c in view.calls]
    names = [view.name(t) for t in range(len(texts))] if given is not None else None
  tags = episode.get("tags")
  if tags is not None and len(tags) == len(texts):
    roles = [str(x) for x in tags]
  return texts, [r or "step" for r in roles], names


def _agent_trace(episode: dict, given: list[dict] | None, layout):
  """The trace as a TextTrace where it calls tools (`tool_syntax.is_agent_trace`), else
  None."""
  from hindsight.text.tool_syntax import is_agent_trace
  from hindsight.text.trace import TextStep, TextTrace

  if given is not None:
    steps = [TextStep(text=s["text"], role=s.get("role"), tool_call=s.get("tool_call"),
                      tool_calls=s.get("tool_calls")) for s in given]  # fmt: skip
    trace = TextTrace(prompt="", steps=steps)
  else:
    trace = TextTrace(prompt="", text=episode.get("text"))
  return trace if is_agent_trace(trace, layout) is not None else None


def _outcome(episode: dict, texts: list[str], verifier: str, where: str) -> float:
  """The trace's outcome in [0, 1] (module docstring: where it may come from)."""
  if episode.get("outcome") is not None:
    value = episode["outcome"]
  elif episode.get("success") is not None:
    value = episode["success"]
  elif episode.get("rewards") is not None:
    try:
      value = float(np.sum(np.asarray(episode["rewards"], np.float64)))
    except (TypeError, ValueError):
      raise HindsightError(f"{where}: 'rewards' must be numbers") from None
  elif episode.get("reference") is not None:
    from hindsight.text.trace import TextStep, TextTrace

    trace = TextTrace(prompt=str(episode.get("prompt") or ""),
                      steps=[TextStep(text=t) for t in texts], id=_name(episode),
                      reference=str(episode["reference"]))  # fmt: skip
    return _verifier(verifier)(trace.completion(), trace)
  else:
    raise HindsightError(f"{where}: missing field 'outcome' (or success, or a reference)")
  if isinstance(value, bool | np.bool_):
    return float(value)
  if not isinstance(value, int | float | np.number) or not 0.0 <= float(value) <= 1.0:
    raise HindsightError(f"{where}: 'outcome' must be a number in [0, 1]")
  return float(value)


def _name(episode: dict) -> str | None:
  name = episode.get("id") or episode.get("trace_id")
  return str(name) if name else None


def parse_text_episode(episode, spec: DataSpec, where: str = "trace") -> Episode:
  """A trace (module docstring) checked against a text model's `spec` -> Episode."""
  if hasattr(episode, "__struct_fields__"):  # a TextTrace
    import msgspec

    episode = msgspec.to_builtins(episode)
  if not isinstance(episode, dict):
    raise HindsightError(f"{where}: expected an object with the trace's steps")
  name = _name(episode)
  if name:
    where = f"{where} (trace {name})"
  chunking, verifier, unit, layout = _reading(spec.label_options)
  texts, tags, names = _steps_of(episode, chunking, where, unit, layout)
  prompt = episode.get("prompt") or ""
  if not isinstance(prompt, str):
    raise HindsightError(f"{where}: 'prompt' must be a string")
  read_tokens = spec.encoder.check_steps(texts, where, prompt, names)
  T = len(texts)
  outcome = _outcome(episode, texts, verifier, where)
  rewards = np.zeros(T, np.float32)
  rewards[-1] = outcome
  out = {
    "observations": (np.arange(T, dtype=np.float32) / T)[:, None],
    "actions": np.zeros(T, np.int32),
    "rewards": rewards,
    "success": outcome > SUCCESS_THRESHOLD,
    "tags": tuple(tags),
    "step_text": tuple(texts),
    "prompt": prompt,
    "trace_id": name or "",
    "read_tokens": read_tokens,
  }
  out.update(parse_labels(episode, T, where))
  return Episode(**out)
