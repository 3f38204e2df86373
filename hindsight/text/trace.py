"""Text traces: the format `hindsight label --env text:FILE.jsonl` reads, and chunking.

One trace per JSONL line (docs/text.md):

  {"id": "p0",                      optional name
   "prompt": "...",                 what the model was given; it writes from its end
   "steps": [{"text": "...", "role": "assistant", "tool_calls": [...]}, ...],
   "text": "...",                   or the whole completion, chunked by the chunking rule
   "messages": [...],               or the conversation as OpenAI chat logs write it
                                    (`chat_log`: read as prompt + steps)
   "metadata": {...},               optional: passed through (an environment's start state)
   "answer": "42",                  optional: the model's final answer (informational)
   "reference": "42",               optional: the gold answer, for the built-in verifier
   "outcome": 1.0}                  optional: the verifier's score as the user recorded it

With neither `steps` nor `text` the trace is a prompt alone: the labeler first samples the
model's own trace from the endpoint. The steps of a trace tile its completion exactly:
prompt + "".join(step texts) is the text the model wrote (chunking keeps each chunk's
trailing whitespace), so the prefix before step t is prompt + steps[:t], byte for byte.

Chunking rules (`chunk_text`):
  sentences   the thought-anchors rule (Bogdan, Macar et al. 2025): split after . ? ! when
              whitespace follows, and at blank lines; chunks under 10 characters are merged
              into the next one (the last into the one before)
  newlines    one chunk per line
  re:PATTERN  split after every match of the regular expression PATTERN
Under every rule a piece with no visible character (a blank line, a run of spaces) is no
step: it joins the chunk before it (the first such piece joins the one after), so a step
always holds text a model wrote and a label is never paid for whitespace. A trace given with
`steps` of its own must hold visible text in each (`read_traces` refuses a blank one).
"""

from __future__ import annotations

import re

import msgspec

from hindsight.errors import HindsightError

MIN_CHUNK_CHARS = 10
CHUNKINGS = ("sentences", "newlines", "re:PATTERN")
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+|\n\s*\n\s*")


class TextStep(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
  """One step of a trace: its text (with trailing whitespace), who wrote it, the tool calls
  it makes (OpenAI's format: one `tool_call`, or the `tool_calls` list)."""

  text: str
  role: str | None = None
  tool_call: dict | None = None
  tool_calls: list | None = None


class TextTrace(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
  """One trace (the module docstring's fields)."""

  prompt: str = ""
  steps: list[TextStep] | None = None
  text: str | None = None
  messages: list[dict] | None = None
  id: str | None = None
  answer: str | None = None
  reference: str | None = None
  outcome: float | None = None
  metadata: dict | None = None
  # OpenAI tool schemas, sent with every request of the chat route (`--api chat`).
  tools: list[dict] | None = None

  def completion(self) -> str:
    """What the model wrote after the prompt."""
    if self.steps is not None:
      return "".join(s.text for s in self.steps)
    return self.text or ""

  def prefix(self, t: int) -> str:
    """The prompt and the first t steps: what the model had written before step t."""
    assert self.steps is not None
    return self.prompt + "".join(s.text for s in self.steps[:t])


def name_of(trace: TextTrace, episode: int) -> str:
  """The trace's name: its `id`, else trace_<its index in the file>."""
  return trace.id or f"trace_{episode}"


def _spans(text: str, cuts) -> list[str]:
  """text cut at the ends of the matches of `cuts` (each match stays with the span before)."""
  out, start = [], 0
  for m in cuts:
    if m.end() > start:
      out.append(text[start : m.end()])
      start = m.end()
  if start < len(text):
    out.append(text[start:])
  return out


def _merge_short(chunks: list[str]) -> list[str]:
  """Chunks with fewer than MIN_CHUNK_CHARS visible characters merged into the next one (the
  last into the one before): "3." on its own is no step."""
  out: list[str] = []
  carry = ""
  for chunk in chunks:
    carry += chunk
    if len(carry.strip()) >= MIN_CHUNK_CHARS:
      out.append(carry)
      carry = ""
  if carry:
    if out:
      out[-1] += carry
    else:
      out.append(carry)
  return out


def _join_blank(chunks: list[str]) -> list[str]:
  """Chunks with no visible character appended to the chunk before them (leading ones to
  the first visible chunk): each chunk keeps its trailing whitespace, as every rule cuts."""
  out: list[str] = []
  lead = ""
  for chunk in chunks:
    if chunk.strip():
      out.append(lead + chunk)
      lead = ""
    elif out:
      out[-1] += chunk
    else:
      lead += chunk
  if lead:  # nothing visible at all: the text is one (blank) chunk
    out.append(lead)
  return out


def check_chunking(rule: str) -> None:
  """A one-line HindsightError for a rule `chunk_text` does not know or cannot compile."""
  if rule in ("sentences", "newlines"):
    return
  if rule.startswith("re:"):
    try:
      re.compile(rule[3:])
    except re.error as e:
      raise HindsightError(f"chunking '{rule}': not a regular expression ({e})") from None
    if not rule[3:]:
      raise HindsightError("chunking 're:' needs a pattern after the colon")
    return
  raise HindsightError(f"unknown chunking '{rule}' (choose from {', '.join(CHUNKINGS)})")


def chunk_text(text: str, rule: str = "sentences") -> list[str]:
  """text -> its chunks by `rule` (the module docstring); "".join(chunks) == text, and every
  chunk holds a visible character unless the whole text is blank (then it is one chunk)."""
  check_chunking(rule)
  if rule == "sentences":
    return _merge_short(_spans(text, _SENTENCE_END.finditer(text)))
  if rule == "newlines":
    return _join_blank(_spans(text, re.finditer(r"\n", text)))
  return _join_blank(_spans(text, re.finditer(rule[3:], text)))


def chunked(trace: TextTrace, rule: str, name: str = "") -> TextTrace:
  """The trace with `steps`: its own, or its `text` chunked by `rule` (a one-line error,
  naming the trace by its id or `name`, when that text is empty)."""
  if trace.steps is not None:
    return trace
  text = trace.text or ""
  if not text.strip():
    raise HindsightError(f"trace {trace.id or name}: no steps (the completion is empty)")
  steps = [TextStep(text=c) for c in chunk_text(text, rule)]
  return msgspec.structs.replace(trace, steps=steps, text=None)


_DECODER = msgspec.json.Decoder(TextTrace)


def read_traces(path: str, limit: int | None = None) -> list[TextTrace]:
  """The traces of a JSONL file (the first `limit`), or a one-line error naming the line."""
  traces: list[TextTrace] = []
  try:
    f = open(path, "rb")  # noqa: SIM115 (closed below; a missing file is one line)
  except OSError as e:
    raise HindsightError(f"{path}: cannot read it ({e.strerror or e})") from None
  with f:
    for number, line in enumerate(f, 1):
      if limit is not None and len(traces) >= limit:
        break
      if not line.strip():
        continue
      try:
        trace = _DECODER.decode(line)
      except msgspec.DecodeError as e:
        raise HindsightError(f"{path}:{number}: not a trace ({e})") from None
      given = [f for f in ("steps", "text", "messages") if getattr(trace, f) is not None]
      if len(given) > 1:
        raise HindsightError(f"{path}:{number}: give one of `steps`, `text` or `messages`, "
                             f"not {' and '.join(given)}")  # fmt: skip
      if trace.messages is not None and trace.prompt:
        raise HindsightError(f"{path}:{number}: a `messages` trace holds its prompt in its "
                             "messages before the first assistant turn: drop `prompt`")  # fmt: skip
      if trace.messages is None and not trace.prompt:
        raise HindsightError(f"{path}:{number}: a trace needs `prompt` (or `messages`)")
      if trace.steps is not None and not trace.steps:
        raise HindsightError(f"{path}:{number}: `steps` is empty")
      blank = next((i for i, s in enumerate(trace.steps or ()) if not s.text.strip()), None)
      if blank is not None:
        raise HindsightError(
          f"{path}:{number}: trace {trace.id or number}: step {blank} is blank (whitespace "
          "only): join it to the step before it (a step is text the model wrote)"
        )
      traces.append(trace)
  if not traces:
    raise HindsightError(f"{path}: no traces in it")
  return traces


def write_traces(path: str, traces) -> None:
  """Traces as JSONL (atomically)."""
  from hindsight.files import atomic_open

  with atomic_open(path, "wb") as f:
    for trace in traces:
      f.write(msgspec.json.encode(trace) + b"\n")
