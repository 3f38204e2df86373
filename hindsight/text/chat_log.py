"""OpenAI chat logs as traces: a trace's `messages` read as a prompt and steps, and a prefix of
an agent's text read back as the messages a chat endpoint takes (`--api chat`).

A `messages` trace is what agents log: the messages before the first assistant turn are its
prompt; each assistant message (`content`, and `tool_calls` with `function.name` and
`function.arguments` as a JSON string or object) is one step, its calls written at its end as
the layout writes them (`tool_syntax.ToolLayout`); the `role: tool` messages that follow it
are one step of role `tool`, its results in the order of its calls (by `tool_call_id` where
every result carries one). Two calls in one assistant message (OpenAI's parallel calls) are
one step whose calls run in order; two assistant messages in a row (the first without
calls) are refused: a turn is one message.

The prompt is the chat template's rendering of the prompt messages with the generation
prompt and the trace's `tools` (`--chat-template`), or, without a template, their contents
joined by blank lines.
"""

from __future__ import annotations

import json

from hindsight.errors import HindsightError
from hindsight.text.tool_syntax import HERMES, ToolCall, ToolLayout, openai_call
from hindsight.text.trace import TextStep, TextTrace


def content_text(content) -> str:
  """A message's content: a string, or a list of parts whose text parts are joined with
  "\\n" (as vLLM's chat_utils joins them), None as ""."""
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):
    return "\n".join(p.get("text", "") for p in content
                     if isinstance(p, dict) and p.get("type", "text") == "text")  # fmt: skip
  raise HindsightError("a message's content must be a string or a list of parts")


def prompt_text(messages: list[dict], template=None, tools: list | None = None) -> str:
  """The prompt of the messages before the first assistant turn (module docstring), the
  template offering `tools` as it writes them (Qwen2.5's: in its system message)."""
  if template is not None:
    return template.render(messages, add_generation_prompt=True, tools=tools)
  return "\n\n".join(content_text(m.get("content")) for m in messages)


def _ordered_results(results: list[dict], calls: list[dict], where: str) -> list[str]:
  """The contents of a run of `tool` messages in the order of the calls they answer."""
  ids = [c.get("id") for c in calls]
  given = [r.get("tool_call_id") for r in results]
  if all(ids) and all(given):
    if sorted(ids) != sorted(given):
      raise HindsightError(f"{where}: the tool results answer {given}, the calls are {ids}")
    by_id = {r["tool_call_id"]: r for r in results}
    results = [by_id[i] for i in ids]
  return [content_text(r.get("content")) for r in results]


def from_messages(trace: TextTrace, where: str, layout: ToolLayout = HERMES, template=None):
  """(the trace as prompt + steps, its prompt messages) of a `messages` trace (module
  docstring); a one-line error naming the message that breaks the format."""
  messages = trace.messages or []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise HindsightError(f"{where}, message {i}: not a message (an object with a `role`)")
  first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
  head = messages[:first]
  if not head:
    raise HindsightError(f"{where}: no prompt (no message before the first assistant turn)")
  steps: list[TextStep] = []
  pending: list[dict] = []  # the calls of the last assistant message, awaiting their results
  i = first
  while i < len(messages):
    m, here = messages[i], f"{where}, message {i}"
    if m["role"] == "assistant":
      if pending:
        raise HindsightError(f"{here}: an assistant turn before the results of the calls "
                             "of the one before it")  # fmt: skip
      if steps and steps[-1].role != "tool":
        raise HindsightError(f"{here}: an assistant message right after one that made no call "
                             "(a turn is one assistant message: join them)")  # fmt: skip
      calls = m.get("tool_calls") or []
      if not isinstance(calls, list):
        raise HindsightError(f"{here}: `tool_calls` must be a list")
      parsed = [openai_call(c, here) for c in calls]
      content = content_text(m.get("content"))
      text = content + "".join(layout.render_call(c.name, c.arguments) for c in parsed)
      if not content:  # a template writes a turn of calls alone from its first call's markup
        text = text.lstrip()
      if not text.strip():
        raise HindsightError(f"{here}: an assistant turn with no content and no calls")
      steps.append(TextStep(text=text, tool_calls=calls or None))
      pending = calls
      i += 1
    elif m["role"] == "tool":
      j = i
      while j < len(messages) and messages[j]["role"] == "tool":
        j += 1
      if not pending:
        raise HindsightError(f"{here}: a tool result that follows no call")
      if j - i != len(pending):
        raise HindsightError(f"{here}: {j - i} tool results for {len(pending)} calls")
      observations = _ordered_results(messages[i:j], pending, here)
      steps.append(TextStep(text=layout.render_results(observations), role="tool"))
      pending = []
      i = j
    else:
      raise HindsightError(f"{here}: a {m['role']} message after the first assistant turn "
                           "(a trace credits one agent's turns against its tools)")  # fmt: skip
  if pending:
    raise HindsightError(f"{where}: its last assistant turn makes calls and no `tool` "
                         "message answers them")  # fmt: skip
  prompt = prompt_text(head, template, trace.tools)
  return TextTrace(prompt=prompt, steps=steps or None, id=trace.id, answer=trace.answer,
                   reference=trace.reference, outcome=trace.outcome, metadata=trace.metadata,
                   tools=trace.tools), head  # fmt: skip


def to_messages(head: list[dict], written: str, layout: ToolLayout) -> list[dict]:
  """The messages of a prompt's messages `head` and what the agent and the environment wrote
  after it (`written`, in the layout): each turn an assistant message (its text its
  content, its calls `tool_calls`), each results block its `tool` messages; text after the
  last block is the assistant message to continue (the last message then)."""
  out = [dict(m) for m in head]
  content, calls = "", []
  turn = 0
  for kind, piece in layout.pieces(written):
    if kind == "text":
      content += piece
    elif kind == "call":
      call = layout.parse_call(piece)
      if isinstance(call, ToolCall):
        function = {"name": call.name,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False)}  # fmt: skip
      else:  # the agent's own malformed markup: its text, as the model wrote it
        function = {"name": "malformed", "arguments": json.dumps({"text": piece})}
      calls.append({"id": f"call_{turn}_{len(calls)}", "type": "function", "function": function})
    else:
      message = {"role": "assistant", "content": _strip_turn(content, layout)}
      if calls:
        message["tool_calls"] = calls
      out.append(message)
      observations = layout.observations(piece) or []
      for k, observation in enumerate(observations):
        tool_id = calls[k]["id"] if k < len(calls) else f"call_{turn}_{k}"
        out.append({"role": "tool", "tool_call_id": tool_id, "content": observation})
      content, calls, turn = "", [], turn + 1
  if calls:
    out.append({"role": "assistant", "content": _strip_turn(content, layout),
                "tool_calls": calls})  # fmt: skip
  elif content:  # a turn cut short: continued as it stands, its spacing kept
    out.append({"role": "assistant", "content": content})
  return out


def _strip_turn(content: str, layout: ToolLayout) -> str:
  """An assistant message's content without the layout's spacing around its calls."""
  if layout.turn_end:
    content = content.replace(layout.turn_end, "")
  return content.rstrip() if content.strip() else ""
