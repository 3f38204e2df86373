"""How tool calls and their results are written in an agent's text (`/v1/completions`).

The plain-text syntax is the one Qwen2.5's and Hermes' chat templates render tool calls in,
so a chat model served on `/v1/completions` writes it as it was trained to:

  <tool_call>{"name": "lookup", "arguments": {"box": 2}}</tool_call>
  <tool_response>box 2 holds 17 apples</tool_response>

The model writes the call; the labeler asks for completions with the stop sequence
`</tool_call>` (servers strip it from the text, the labeler puts it back), executes the call in
the environment, and appends the result as written by `render_result` (a newline before and
after the response markup). A trace's step may also carry the call as OpenAI's tool-calling
format writes it (`{"name": ..., "arguments": "<JSON object>"}`, or the `tool_calls` entry
`{"type": "function", "function": {...}}`): it must be the call its text holds.
"""

from __future__ import annotations

import dataclasses
import json
import re

from hindsight.errors import HindsightError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"
# A result as the labeler writes it, and as a trace's `tool` step must hold it.
_RESULT = re.compile(r"\s*<tool_response>(.*?)</tool_response>\s*", re.S)
# The pieces of an agent's text: a call, a result (with the whitespace around it), or text.
_PIECE = re.compile(r"<tool_call>.*?</tool_call>|\s*<tool_response>.*?</tool_response>\s*", re.S)


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """A call the agent made: the tool's name and its arguments (a JSON object)."""

  name: str
  arguments: dict

  def render(self) -> str:
    return render_call(self.name, self.arguments)


@dataclasses.dataclass(frozen=True)
class Malformed:
  """Call markup that does not parse: what is wrong, as the agent reads it."""

  reason: str


def render_call(name: str, arguments: dict) -> str:
  """The call as the agent writes it."""
  return CALL_OPEN + json.dumps({"name": name, "arguments": arguments}) + CALL_CLOSE


def render_result(observation: str) -> str:
  """The environment's observation as appended to the agent's text."""
  return "\n" + RESULT_OPEN + observation + RESULT_CLOSE + "\n"


def result_of(text: str) -> str | None:
  """The observation a `tool` step's text holds (`render_result`'s inverse), else None."""
  m = _RESULT.fullmatch(text)
  return m.group(1) if m else None


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
  """A step's `tool_call` in OpenAI's format (module docstring) as a ToolCall."""
  function = value.get("function", value) if isinstance(value, dict) else None
  call = call_from_json(json.dumps(function)) if isinstance(function, dict) else None
  if not isinstance(call, ToolCall):
    reason = call.reason if isinstance(call, Malformed) else "not an object"
    raise HindsightError(f"{where}: `tool_call` is not a call ({reason})")
  return call


def trailing_call(text: str) -> ToolCall | Malformed | None:
  """The call that ends `text` (markup at its end, whitespace aside), else None."""
  body = text.rstrip()
  if not body.endswith(CALL_CLOSE):
    return None
  start = body.rfind(CALL_OPEN)
  if start < 0:
    return Malformed(f"{CALL_CLOSE} without {CALL_OPEN}")
  return call_from_json(body[start + len(CALL_OPEN) : -len(CALL_CLOSE)])


def end_turn(text: str, finish_reason: str) -> tuple[str, bool]:
  """(a turn's text, whether it ends in a call): the text up to and including its first
  call, the stop sequence the server stripped put back. A call cut by the token cap
  (finish_reason "length") is no call: the turn ends the episode before its unfinished
  markup (which no step could hold)."""
  start = text.find(CALL_OPEN)
  if start < 0:
    return text, False
  close = text.find(CALL_CLOSE, start)
  if close >= 0:
    return text[: close + len(CALL_CLOSE)], True
  if finish_reason == "length":
    return text[:start], False
  return text + CALL_CLOSE, True


def has_tool_markup(text: str) -> bool:
  return CALL_OPEN in text or RESULT_OPEN in text


def is_agent_trace(trace) -> int | None:
  """The index of the first step of a `TextTrace` that calls a tool or holds a result (None:
  a plain text trace); -1 for a `text` trace with tool markup."""
  for k, step in enumerate(trace.steps or ()):
    if step.role == "tool" or step.tool_call is not None or has_tool_markup(step.text):
      return k
  if trace.text is not None and has_tool_markup(trace.text):
    return -1
  return None


def pieces(text: str) -> list[tuple[str, str]]:
  """text -> [(kind, piece)] tiling it: kind "call", "result" or "text"."""
  out, start = [], 0
  for m in _PIECE.finditer(text):
    if m.start() > start:
      out.append(("text", text[start : m.start()]))
    out.append(("call" if m.group().startswith(CALL_OPEN) else "result", m.group()))
    start = m.end()
  if start < len(text):
    out.append(("text", text[start:]))
  return out
