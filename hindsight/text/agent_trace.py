"""Agent traces as a format: a text trace whose steps call tools (written as `tool_syntax`
writes them, at the end of their step) and whose results are the environment's (role `tool`,
right after the step that made the call).

What the labels read (`agent_view`): each call step merged with its result into one step, a
result never a step of its own; `agent_steps` cuts an agent's text into its steps, `unmerged`
undoes the merge, and `refuse_tool_traces` refuses such traces where no environment executes
their calls. The labeler that resamples them with the tools run (`hindsight.agentic.labeler`)
and the text library's readers (`episodes`, `evaluate`, `labeler`) import it from here.
"""

from __future__ import annotations

import dataclasses

import msgspec

from hindsight.errors import HindsightError
from hindsight.text.tool_syntax import HERMES, Malformed, ToolLayout, given_calls, is_agent_trace
from hindsight.text.trace import TextStep, TextTrace, chunk_text, name_of

AGENT_TAGS = ("step", "tool_call")
# What an agent step is (`agent_view`): one assistant turn, or the old cut of every thought
# chunk and every call on its own (the bundled tool world's choices: its exact credit).
UNITS = ("turn", "chunks")


@dataclasses.dataclass
class AgentView:
  """An agent trace as the labels see it: `trace` with one step per agent step (a step that
  calls tools holds their results), each step's calls (a tuple, empty where it makes none;
  a `Malformed` one is answered with an error), the results the trace holds for them, and
  the entry of the trace's `steps` each agent step begins at (`name`)."""

  trace: TextTrace
  calls: list
  observations: list
  entries: list = dataclasses.field(default_factory=list)

  def name(self, t: int) -> str:
    """Agent step t as an error names it: by its entry in `steps` too where they differ."""
    entry = self.entries[t] if t < len(self.entries) else t
    return f"step {t}" + (f" (entry {entry} of 'steps')" if entry != t else "")


def agent_steps(text: str, chunking: str, layout: ToolLayout = HERMES,
                unit: str = "turn") -> list[TextStep]:  # fmt: skip
  """An agent's text (calls and results inline) -> its steps, each results block a step of
  role `tool`. unit "turn": each turn one step (its text and its calls, up to their results;
  the text after the last results the last step); "chunks": the text between calls cut by
  the chunking rule, each run of calls a step."""
  steps: list[TextStep] = []
  calling: list[bool] = []  # whether each step holds calls
  lead = ""
  for kind, piece in layout.pieces(text):
    if kind == "result":
      steps.append(TextStep(text=lead + piece, role="tool"))
      calling.append(False)
    elif kind == "call" and steps and calling[-1]:  # a parallel call: the same step
      steps[-1] = msgspec.structs.replace(steps[-1], text=steps[-1].text + lead + piece)
    elif kind == "call" and unit == "turn" and steps and steps[-1].role != "tool":
      steps[-1] = msgspec.structs.replace(steps[-1], text=steps[-1].text + lead + piece)
      calling[-1] = True
    elif kind == "call":
      steps.append(TextStep(text=lead + piece))
      calling.append(True)
    elif not piece.strip():  # whitespace between pieces joins the step before it
      if steps:
        steps[-1] = msgspec.structs.replace(steps[-1], text=steps[-1].text + piece)
      else:
        lead += piece
      continue
    elif unit == "turn":
      steps.append(TextStep(text=lead + piece))
      calling.append(False)
    else:
      chunks = chunk_text(piece, chunking)
      steps.extend(TextStep(text=c) for c in [lead + chunks[0], *chunks[1:]])
      calling.extend([False] * len(chunks))
    lead = ""
  return steps


def unmerged(step_texts, layout: ToolLayout = HERMES) -> list[TextStep]:
  """A labeled agent trace's steps (each calling step holding its results) as the trace
  format writes them: each step's results block a step of role `tool` after it."""
  out = []
  for text in step_texts:
    parts = layout.pieces(text)
    if parts and parts[-1][0] == "result":
      out.append(TextStep(text="".join(p for _, p in parts[:-1])))
      out.append(TextStep(text=parts[-1][1], role="tool"))
    else:
      out.append(TextStep(text=text))
  return out


def _call_record(calls) -> dict | None:
  """A merged step's `tool_call` (what its tag and the dataset read): its call, or its
  calls, or why its call is malformed."""
  records = [{"malformed": c.reason} if isinstance(c, Malformed)
             else {"name": c.name, "arguments": c.arguments} for c in calls]  # fmt: skip
  if not records:
    return None
  return records[0] if len(records) == 1 else {"parallel": records}


def agent_view(trace: TextTrace, where: str, chunking: str = "sentences",
               layout: ToolLayout = HERMES, unit: str = "turn") -> AgentView:  # fmt: skip
  """The trace's agent steps (module docstring), or a one-line error naming the step that
  breaks the format: a result block not after calls, calls without their results, a call
  not at the end of its step, `tool_call(s)` that are not the calls its text holds. Steps
  are named by their entry in the trace's `steps` and, where merging moved it, by the agent
  step it became. unit "turn": steps without calls merge into the turn they begin (an
  agent step is one assistant turn: its text, its calls and their results); "chunks": every
  given step is its own."""
  if unit not in UNITS:
    raise HindsightError(f"agent steps '{unit}': choose {' or '.join(UNITS)}")
  steps = (trace.steps if trace.steps is not None
           else agent_steps(trace.text or "", chunking, layout, unit))  # fmt: skip
  merged: list[TextStep] = []
  calls: list = []
  observations: list = []
  entries: list[int] = []
  open_turn = False  # the last merged step has no calls yet: a turn still being written
  for k, step in enumerate(steps):
    here = f"{where}, step {k}" + (f" (agent step {len(merged)})" if len(merged) != k else "")
    if step.role not in (None, "assistant", "tool"):
      raise HindsightError(f"{here}: role '{step.role}': an agent trace's step is the agent's "
                           "(no role, or assistant) or the environment's (tool)")  # fmt: skip
    if step.role == "tool":
      found = layout.observations(step.text)
      if found is None:
        example, found = layout.render_results(["..."]), step.text[:80]
        raise HindsightError(f"{here}: a `tool` step holds the results of the calls before "
                             f"it, written {example!r}; it holds {found!r}")  # fmt: skip
      if not merged or not calls[-1] or observations[-1] is not None:
        raise HindsightError(f"{here}: a tool result that follows no call")
      if len(found) != len(calls[-1]):
        raise HindsightError(f"{here}: {len(found)} results for the {len(calls[-1])} calls of "
                             "the step before it")  # fmt: skip
      merged[-1] = msgspec.structs.replace(merged[-1], text=merged[-1].text + step.text)
      observations[-1] = tuple(found)
      open_turn = False
      continue
    if merged and calls[-1] and observations[-1] is None:
      raise HindsightError(f"{where}, step {k - 1}: a call and no `tool` step after it with "
                           "its result")  # fmt: skip
    made = layout.trailing_calls(step.text)
    parts = layout.pieces(step.text)
    while made and parts and (parts[-1][0] == "call" or not parts[-1][1].strip()):
      parts.pop()
    inner = "".join(p for _, p in parts) if made else step.text
    if layout.has_markup(inner) or layout.call_close in inner:
      raise HindsightError(f"{here}: tool markup inside the step (a step's calls are at its "
                           "end; results are steps of role `tool`)")  # fmt: skip
    given = given_calls(step, here)
    if given is not None and given != list(made):
      held = ", ".join(str(c) for c in made) or "no call"
      raise HindsightError(f"{here}: `tool_call(s)` give {', '.join(map(str, given))} but the "
                           f"step's text holds {held}")  # fmt: skip
    if unit == "turn" and open_turn:  # the turn goes on: this step is more of it
      merged[-1] = msgspec.structs.replace(merged[-1], text=merged[-1].text + step.text,
                                           tool_call=_call_record(made))  # fmt: skip
      calls[-1] = tuple(made)
    else:
      # Every step here is the agent's: a role it carries ("assistant") says nothing more.
      merged.append(TextStep(text=step.text, tool_call=_call_record(made)))
      calls.append(tuple(made))
      observations.append(None)
      entries.append(k)
    open_turn = not made
  if not merged:
    raise HindsightError(f"{where}: no agent steps")
  if calls[-1] and observations[-1] is None:
    raise HindsightError(f"{where}, its last step: a call and no `tool` step after it with "
                         "its result")  # fmt: skip
  view = msgspec.structs.replace(trace, steps=merged, text=None, messages=None)
  return AgentView(view, calls, observations, entries)


def refuse_tool_traces(traces: list[TextTrace], path: str, layout: ToolLayout = HERMES) -> None:
  """Without an environment, a trace with tool calls is refused: resampled as text, the
  model would write the tools' results itself."""
  for e, trace in enumerate(traces):
    k = is_agent_trace(trace, layout)
    if k is not None:
      where = f"step {k}" if k >= 0 else "its text"
      raise HindsightError(
        f"{path}: trace {name_of(trace, e)} ({where}) calls tools: label it with --tools ENV "
        "(the environment that executes the calls); resampled as text, the model would "
        "write the tools' results itself"
      )
