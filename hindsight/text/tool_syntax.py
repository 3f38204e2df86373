"""How tool calls and their results are written in an agent's text.

A `ToolLayout` says where the markup goes. The default, `HERMES`, is the inline syntax of
Hermes-style tool calling, one call per turn:

  <tool_call>{"name": "lookup", "arguments": {"box": 2}}</tool_call>
  <tool_response>box 2 holds 17 apples</tool_response>

A chat model's own layout comes from its chat template (`layout_from_template`: a
`tokenizer_config.json`'s template rendered on a probe conversation), so a model served on
`/v1/completions` reads its results as it was trained to. Qwen2.5-Instruct's, for one:

  ...<tool_call>\\n{"name": ...}\\n</tool_call><|im_end|>\\n<|im_start|>user\\n<tool_response>
  \\n...\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n

The model writes its calls; the labeler asks for completions with a stop sequence (the call's
close tag under HERMES, where a call ends the turn; the end-of-turn marker under a template,
where a turn may hold several calls: OpenAI's parallel calls), executes the calls in order
and appends their results as one block (`ToolLayout.render_results`). A trace's step may
also carry its calls as OpenAI's format writes them (`tool_call`, or the `tool_calls` list:
`{"name": ..., "arguments": "<JSON object>"}` or `{"type": "function", "function": {...}}`):
they must be the calls its text holds.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

from hindsight.errors import HindsightError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """A call the agent made: the tool's name and its arguments (a JSON object)."""

  name: str
  arguments: dict

  def render(self) -> str:
    return render_call(self.name, self.arguments)

  def __str__(self) -> str:
    return f"{self.name}({json.dumps(self.arguments, ensure_ascii=False)})"


@dataclasses.dataclass(frozen=True)
class Malformed:
  """Call markup that does not parse: what is wrong, as the agent reads it."""

  reason: str

  def __str__(self) -> str:
    return f"a malformed call ({self.reason})"


def _loose(literal: str) -> str:
  """A regex for `literal` with the whitespace around it optional (and any amount)."""
  core = literal.strip()
  return r"\s*" + re.escape(core) + r"\s*" if core else r"\s*"


@dataclasses.dataclass(frozen=True)
class ToolLayout:
  """Where the markup of calls and results goes in an agent's text (module docstring).

    one call           call_prefix + {"name": ..., "arguments": {...}} + call_suffix
    a turn's results   results_open + (result_prefix + observation + result_suffix) x n
                       + results_close, the n results of the turn's n calls in order
    turn_end           the model's end-of-turn marker, a stop sequence ("": a call ends the
                       turn, the stop being the call's close tag)

  Reading is tolerant of the whitespace around each piece of markup (a call's JSON is
  parsed, its spacing free); writing is exact, call JSON as templates' `tojson` writes it
  (non-ASCII text kept as it is)."""

  call_prefix: str = CALL_OPEN
  call_suffix: str = CALL_CLOSE
  results_open: str = ""
  result_prefix: str = "\n" + RESULT_OPEN
  result_suffix: str = RESULT_CLOSE + "\n"
  results_close: str = ""
  turn_end: str = ""
  name: str = "hermes"

  def __post_init__(self):
    for tag in ("call_prefix", "call_suffix", "result_prefix", "result_suffix"):
      if not getattr(self, tag).strip():
        raise HindsightError(f"tool layout {self.name}: {tag} holds no markup")

  # -- writing --------------------------------------------------------------------------------
  def render_call(self, name: str, arguments: dict) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return self.call_prefix + body + self.call_suffix

  def render_results(self, observations) -> str:
    """The results of one turn's calls, as the environment's block after the turn."""
    inner = "".join(self.result_prefix + o + self.result_suffix for o in observations)
    return self.results_open + inner + self.results_close

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, record: dict | None) -> ToolLayout:
    if not record:
      return HERMES
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in record.items() if k in known})

  # -- reading --------------------------------------------------------------------------------
  @property
  def call_open(self) -> str:
    return self.call_prefix.strip()

  @property
  def call_close(self) -> str:
    return self.call_suffix.strip()

  @property
  def result_open(self) -> str:
    return self.result_prefix.strip()

  @functools.cached_property
  def _result(self) -> str:
    """One result; group 1 its observation (the whitespace inside the markup is the
    layout's own, so an observation reads back exactly as it was written)."""
    start, end = self.result_prefix.lstrip(), self.result_suffix.rstrip()
    return r"\s*" + re.escape(start) + r"(.*?)" + re.escape(end) + r"\s*"

  @functools.cached_property
  def _block(self) -> re.Pattern:
    """A results block: the results of one turn, with the markup around them."""
    return re.compile(_loose(self.results_open) + "(?:" + self._result.replace("(.*?)", "(?:.*?)")
                      + ")+" + _loose(self.results_close), re.S)  # fmt: skip

  @functools.cached_property
  def _piece(self) -> re.Pattern:
    call = re.escape(self.call_open) + r".*?" + re.escape(self.call_close)
    return re.compile(f"(?P<call>{call})|(?P<result>{self._block.pattern})", re.S)

  def pieces(self, text: str) -> list[tuple[str, str]]:
    """text -> [(kind, piece)] tiling it: kind "call", "result" (one turn's results block)
    or "text"."""
    out, start = [], 0
    for m in self._piece.finditer(text):
      if m.start() > start:
        out.append(("text", text[start : m.start()]))
      out.append(("call" if m.group("call") is not None else "result", m.group()))
      start = m.end()
    if start < len(text):
      out.append(("text", text[start:]))
    return out

  def observations(self, text: str) -> list[str] | None:
    """The observations a results block holds (`render_results`' inverse), else None."""
    if not self._block.fullmatch(text):
      return None
    return [m.group(1) for m in re.finditer(self._result, text, re.S)]

  def parse_call(self, piece: str) -> ToolCall | Malformed:
    """A call piece (its markup included) as a call."""
    body = piece.strip()
    return call_from_json(body[len(self.call_open) : len(body) - len(self.call_close)])

  def trailing_calls(self, text: str) -> list:
    """The calls that end `text` (markup at its end, only whitespace between them), in
    order: [] where it ends in none; a close tag without its open is a `Malformed` call."""
    parts = self.pieces(text)
    calls = []
    while parts and (parts[-1][0] == "call" or not parts[-1][1].strip()):
      kind, piece = parts.pop()
      if kind == "call":
        calls.append(self.parse_call(piece))
    if not calls and text.rstrip().endswith(self.call_close):
      return [Malformed(f"{self.call_close} without {self.call_open}")]
    return calls[::-1]

  def has_markup(self, text: str) -> bool:
    return self.call_open in text or self.result_open in text

  def stops(self) -> tuple[str, ...]:
    """The stop sequences of an agent's turn: where it ends (its end-of-turn marker, or the
    call's close tag where a call ends the turn) and where it would start writing a result
    itself (every result in a continuation is the environment's)."""
    return (self.turn_end or self.call_close, self.result_open)

  def end_turn(self, text: str, finish_reason: str,
               several: bool | None = None) -> tuple[str, bool]:  # fmt: skip
    """(a turn's text, whether it ends in calls): the text before any result markup the
    model began itself, up to and including its calls (the first one where a call ends the
    turn; the run of calls that follows its first one where a turn may hold `several`: by
    default, where the layout has an end of turn); the stop sequence the
    server stripped put back. A call cut by the token cap (finish_reason "length") is no
    call: the turn ends the episode before its unfinished markup (which no step could
    hold); one left open at a stop is a malformed call."""
    cut = text.find(self.result_open)
    if cut >= 0:
      text = text[:cut]
    if self.turn_end and self.turn_end in text:
      text = text[: text.find(self.turn_end)]
    start = text.find(self.call_open)
    if start < 0:
      return text, False
    close = text.find(self.call_close, start)
    if close < 0:
      if finish_reason == "length":
        return text[:start], False
      return text + self.call_suffix, True
    end = close + len(self.call_close)
    while bool(self.turn_end) if several is None else several:
      nxt = text.find(self.call_open, end)
      if nxt < 0 or text[end:nxt].strip():
        break
      close = text.find(self.call_close, nxt)
      if close < 0:
        break
      end = close + len(self.call_close)
    # The layout's own spacing after a call, where the model wrote it (Qwen's "\n" before
    # its end of turn belongs to the call markup, not to the next turn).
    tail = self.call_suffix[len(self.call_suffix.rstrip()) :]
    if tail and text[end:].startswith(tail):
      end += len(tail)
    return text[:end], True


HERMES = ToolLayout()


# -- the template's layout ---------------------------------------------------------------------
_PROBE_CALLS = ({"name": "hindsight_probe_a", "arguments": {"k": 1}},
                {"name": "hindsight_probe_b", "arguments": {"k": 2}})  # fmt: skip
_THOUGHT, _FINAL = "HSPROBE_THOUGHT", "HSPROBE_END"
_RESULTS = ("HSPROBE_RESULT_A", "HSPROBE_RESULT_B")


def _probe(template, calls: int) -> str:
  """The template's rendering of: a user asks, the assistant thinks and makes `calls` calls,
  the tools answer, the assistant ends."""
  tool_calls = [{"id": f"call_{i}", "type": "function", "function": dict(_PROBE_CALLS[i])}
                for i in range(calls)]  # fmt: skip
  messages = [{"role": "user", "content": "HSPROBE_USER"},
              {"role": "assistant", "content": _THOUGHT, "tool_calls": tool_calls}]  # fmt: skip
  for i in range(calls):
    messages.append({"role": "tool", "tool_call_id": f"call_{i}",
                     "name": _PROBE_CALLS[i]["name"], "content": _RESULTS[i]})  # fmt: skip
  messages.append({"role": "assistant", "content": _FINAL})
  return template.render(messages, add_generation_prompt=False)


def layout_from_template(template, name: str = "template") -> ToolLayout:
  """The layout a chat template (`chat_template.ChatTemplate`) writes calls and results in,
  read off its renderings of a probe conversation with two parallel calls and with one; a
  one-line error where it writes calls other than as {"name", "arguments"} JSON between
  tags (Qwen2.5's, Hermes' and most open models' do), or its two renderings disagree."""
  refuse = f"chat template {name}: "
  two, one = _probe(template, 2), _probe(template, 1)
  jsons = [json.dumps(c, ensure_ascii=False) for c in _PROBE_CALLS]
  try:
    thought = two.index(_THOUGHT) + len(_THOUGHT)
    a = two.index(jsons[0], thought)
    b = two.index(jsons[1], a)
    ra, rb = two.index(_RESULTS[0], b), two.index(_RESULTS[1])
    final = two.index(_FINAL, rb)
  except ValueError:
    raise HindsightError(refuse + "it does not write tool calls as "
                         '{"name": ..., "arguments": {...}} JSON (or drops tool results): '
                         "the labeler reads Hermes-style calls") from None  # fmt: skip
  prefix = two[thought:a]
  between = two[a + len(jsons[0]) : b]
  if not prefix.strip() or not between.endswith(prefix):
    raise HindsightError(refuse + "its calls are not wrapped in markup of their own")
  suffix = between[: len(between) - len(prefix)]
  after_calls = two[b + len(jsons[1]) : ra]
  between_results, tail = two[ra + len(_RESULTS[0]) : rb], two[rb + len(_RESULTS[1]) : final]
  # result_suffix is what ends every result; what follows it is the next result's prefix or
  # the block's close: their common start is the suffix, cut back to its markup's end.
  common = 0
  while (common < min(len(between_results), len(tail))
         and between_results[common] == tail[common]):  # fmt: skip
    common += 1
  result_suffix = between_results[:common]
  close_at = result_suffix.rfind(">")
  if close_at >= 0:
    result_suffix = result_suffix[: close_at + 1]
  result_prefix = between_results[len(result_suffix) :]
  if not after_calls.startswith(suffix) or not after_calls.endswith(result_prefix):
    raise HindsightError(refuse + "its tool results are not wrapped in markup of their own")
  # The model's end of turn: what the template writes after an assistant's last words (its
  # eos token where it writes nothing).
  end_of_turn = two[final + len(_FINAL) :].strip() or dict(template.tokens).get("eos_token", "")
  layout = ToolLayout(
    call_prefix=prefix,
    call_suffix=suffix,
    results_open=after_calls[len(suffix) : len(after_calls) - len(result_prefix)],
    result_prefix=result_prefix,
    result_suffix=result_suffix,
    results_close=tail[len(result_suffix) :],
    turn_end=end_of_turn.split()[0] if end_of_turn else "",
    name=name,
  )
  expected = (layout.render_call(**_PROBE_CALLS[0]) + layout.render_results(_RESULTS[:1])
              + _FINAL)  # fmt: skip
  if expected not in one:
    raise HindsightError(refuse + "its rendering of one call differs from its rendering of "
                         "two (the layout could not be read off it)")  # fmt: skip
  return layout


# -- the default layout's functions (HERMES) ---------------------------------------------------
def render_call(name: str, arguments: dict, layout: ToolLayout = HERMES) -> str:
  """The call as the agent writes it."""
  return layout.render_call(name, arguments)


def render_result(observation: str, layout: ToolLayout = HERMES) -> str:
  """One call's observation as appended to the agent's text."""
  return layout.render_results([observation])


def result_of(text: str, layout: ToolLayout = HERMES) -> str | None:
  """The observation a one-result block holds (`render_result`'s inverse), else None."""
  found = layout.observations(text)
  return found[0] if found is not None and len(found) == 1 else None


def trailing_call(text: str, layout: ToolLayout = HERMES) -> ToolCall | Malformed | None:
  """The last call that ends `text` (markup at its end, whitespace aside), else None."""
  calls = layout.trailing_calls(text)
  return calls[-1] if calls else None


def pieces(text: str, layout: ToolLayout = HERMES) -> list[tuple[str, str]]:
  return layout.pieces(text)


def end_turn(text: str, finish_reason: str, layout: ToolLayout = HERMES) -> tuple[str, bool]:
  return layout.end_turn(text, finish_reason)


def has_tool_markup(text: str, layout: ToolLayout = HERMES) -> bool:
  return layout.has_markup(text)


def call_from_json(body: str) -> ToolCall | Malformed:
  """The call inside <tool_call>...</tool_call>, or why it is not one."""
  try:
    value = json.loads(body)
  except ValueError as e:
    return Malformed(f"the call is not JSON ({e})")
  if not isinstance(value, dict) or not isinstance(value.get("name"), str):
    return Malformed('a call is {"name": TOOL, "arguments": {...}}')
  arguments = value.get("arguments", {})
  if isinstance(arguments, str):  # OpenAI's tool-calling format: arguments as a JSON string
    try:
      arguments = json.loads(arguments)
    except ValueError as e:
      return Malformed(f"the call's arguments are not JSON ({e})")
  if not isinstance(arguments, dict):
    return Malformed("a call's arguments must be a JSON object")
  return ToolCall(value["name"], arguments)


def openai_call(value: dict, where: str) -> ToolCall:
  """A call in OpenAI's format (module docstring) as a ToolCall."""
  function = value.get("function", value) if isinstance(value, dict) else None
  call = call_from_json(json.dumps(function)) if isinstance(function, dict) else None
  if not isinstance(call, ToolCall):
    reason = call.reason if isinstance(call, Malformed) else "not an object"
    raise HindsightError(f"{where}: `tool_call` is not a call ({reason})")
  return call


def given_calls(step, where: str) -> list[ToolCall] | None:
  """The calls a trace's step carries in OpenAI's format (`tool_call` or the `tool_calls`
  list), None where it carries none."""
  if step.tool_call is not None and step.tool_calls is not None:
    raise HindsightError(f"{where}: give `tool_call` or `tool_calls`, not both")
  if step.tool_call is not None:
    return [openai_call(step.tool_call, where)]
  if step.tool_calls is not None:
    if not isinstance(step.tool_calls, list):
      raise HindsightError(f"{where}: `tool_calls` must be a list of calls")
    return [openai_call(c, where) for c in step.tool_calls]
  return None


def is_agent_trace(trace, layout: ToolLayout = HERMES) -> int | None:
  """The index of the first step of a `TextTrace` that calls a tool or holds a result (None:
  a plain text trace); -1 for a `text` trace with tool markup."""
  for k, step in enumerate(trace.steps or ()):
    if (step.role == "tool" or step.tool_call is not None or step.tool_calls
        or layout.has_markup(step.text)):  # fmt: skip
      return k
  if trace.text is not None and layout.has_markup(trace.text):
    return -1
  return None
