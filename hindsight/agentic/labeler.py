"""Agent traces: text traces whose steps call tools that an environment executes, labeled by
resampling with the tools run in every continuation (`--tools ENV`, docs/agents-text.md).

A trace's steps are the agent's (thoughts, and calls written as `tool_syntax` writes them, at
the end of their step) and the environment's (role `tool`: a call's result, right after the
step that made it). The labels are the agent's: each call step is merged with its result into
one step (its text: the call and the result it got, what the step leaves in the text), and
a result is never a step of its own, never credited as the agent's action.

`AgentLabeler` is the text labeler (`text.labeler`: the same pools, K, seeds, estimands,
stderrs, cache and resumable chunks) with multi-turn continuations: from the prefix before
step t and the environment's state there (`tools.Branches`: forked, replayed or restored),
the model writes until it makes a call (the stop sequence `</tool_call>`) or stops; the
environment executes the call on the continuation's own state and its result is appended;
and so on until the model stops without a call, the environment says the episode is done,
or `--max-turns` turns were written. The outcome is the verifier's on the whole text, or
the environment's on its final state (`--verifier env`). A model's turn is cut where it
starts writing a result itself (`<tool_response>` is a stop sequence too): every result in a
continuation is the environment's.

The replacements are `policy` (step t redrawn: the continuations of x_t) and `null` (step t
replaced by `--null-text`, which makes no call: the call is not made, its side effect never
happens); `policy_other` and `policy_no_repeat` are refused for agent traces. Each trace's
row counts its completions and its tool calls, and the dataset's metadata sums them
(`completions`, `tool_calls`).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib

import msgspec
import numpy as np

from hindsight.agentic.tools import (
  Branches,
  execute,
  guarded,
  has_outcome,
  load_tool_env,
  recheck,
)
from hindsight.errors import HindsightError, note
from hindsight.text.agent_trace import AGENT_TAGS, UNITS, AgentView, agent_view
from hindsight.text.client import Draw
from hindsight.text.labeler import (
  Ask,
  TextLabeler,
  name_of,
  prompt_name,
  request_seeds,
  step_name,
)
from hindsight.text.tool_syntax import ToolLayout
from hindsight.text.trace import TextTrace

ARM_ENV = 3  # the request-seed arm of each trace's environment seed


def turn_seed(seed: int, index: int, turn: int) -> int:
  """The request seed of continuation `index`'s turn `turn` (> 0) of a prefix seeded `seed`
  (31 bits; the first turn is the prefix's own block request)."""
  digest = hashlib.sha256(f"{seed}:{index}:{turn}".encode()).digest()
  return int.from_bytes(digest[:4], "little") >> 1


@dataclasses.dataclass
class Rollout:
  """One continuation of a prefix through the model and the environment: `text` everything
  written after the prefix (the model's turns, the results), `state` the environment's final
  state; what it cost in completions (`turns`), tokens and tool calls."""

  text: str
  finish_reason: str
  tokens: int
  state: object
  turns: int
  tool_calls: int


@dataclasses.dataclass
class _Live:
  ask: Ask
  index: int
  state: object
  text: str = ""
  finish: str = "stop"
  tokens: int = 0
  turns: int = 0
  calls: int = 0
  done: bool = False


class AgentLabeler(TextLabeler):
  """The text labeler with tools executed in every continuation (module docstring)."""

  def __init__(self, env: str, episodes: int, config, options):
    super().__init__(env, episodes, config, options)
    if config.replacement not in ("policy", "null"):
      raise HindsightError(
        f"replacement '{config.replacement}' is not available for agent traces (--tools): "
        "choose policy or null"
      )
    if self.layout.has_markup(options.null_text):
      raise HindsightError("--null-text makes a call: under null the step's call is not made")
    self.env = load_tool_env(options.tools)
    if not options.agent_steps:  # the environment's unit, else one step per turn
      unit = getattr(self.env, "agent_steps", None) or "turn"
      if unit not in UNITS:
        raise HindsightError(f"--tools {options.tools}: its agent_steps is '{unit}' (choose "
                             f"{' or '.join(UNITS)})")  # fmt: skip
      self.options = options = dataclasses.replace(options, agent_steps=unit)
    if options.verifier == "env" and not has_outcome(self.env):
      raise HindsightError(f"--verifier env: the environment {options.tools} has no outcome()")
    if options.verifier != "env" and has_outcome(self.env):
      note(f"--tools {options.tools}: the environment has outcome(), and --verifier "
           f"{options.verifier} scores the text instead: --verifier env scores each "
           "continuation by the environment's final state")  # fmt: skip
    # A turn may hold several calls where it ends by a marker of its own (a template's end of
    # turn) or a chat answer's message; on the completions route the layout's stops end it.
    self.several = bool(self.layout.turn_end) or options.api == "chat"
    if options.api == "completions":
      stops = tuple(s for s in self.layout.stops() if s not in self.sampling.stop)
      self.sampling = dataclasses.replace(self.sampling, stop=(*self.sampling.stop, *stops))
    self.tag_names = AGENT_TAGS
    self.views: dict[int, AgentView] = {}
    self.branches: dict[int, Branches] = {}
    self.spent: collections.Counter = collections.Counter()
    self.tool_calls: collections.Counter = collections.Counter()
    self.context_ends: collections.Counter = collections.Counter()
    self.turn_ends: collections.Counter = collections.Counter()
    self.checked: collections.Counter = collections.Counter()  # re-run (--tool-check)

  def check_tools(self) -> None:
    """Agent traces are what this labeler is for."""

  def load_verify(self):
    if self.options.verifier == "env":
      return None  # the environment's outcome() (`outcomes_of`)
    return super().load_verify()

  # -- traces -----------------------------------------------------------------------------
  def _env_seed(self, seed: int, episode: int) -> int:
    return int(request_seeds(seed, episode, ARM_ENV, 1)[0])

  def with_steps(self, traces: list[TextTrace], episodes: range, seed: int) -> list[TextTrace]:
    """Each trace's agent steps: its own, its text cut, or sampled from its prompt with the
    tools executed (`_roll` from the environment's first state); the environment's states
    along it (`Branches`), checked to give the trace's own results."""
    out = list(traces)
    # The trace's first turn as the text labeler draws a trace, then its later turns.
    todo, asks, first = self.sample_from_prompts(traces, episodes, seed)
    starts = [functools.partial(self.env.reset, traces[i], self._env_seed(seed, episodes[i]))
              for i in todo]  # fmt: skip
    for i, (rollout,) in zip(todo, self._roll(asks, starts, first) if todo else [], strict=True):
      out[i] = msgspec.structs.replace(traces[i], text=rollout.text)
    views = []
    for trace, e in zip(out, episodes, strict=True):
      where = f"{self.path}: trace {name_of(trace, e)}"
      view = self.view(trace, where)
      self.views[e] = view
      self.branches[e] = Branches(self.env, trace, self._env_seed(seed, e), view.calls,
                                  view.observations, where)  # fmt: skip
      views.append(view.trace)
    return views

  def check_context(self) -> None:
    """The longest prefix of every given trace must leave room in the model's context."""
    asks = []
    for e, trace in enumerate(self.traces):
      if trace.steps is None and trace.text is None:
        asks.append(Ask(trace.prompt, 0, 0, 1, prompt_name(trace, e)))
        continue
      view = self.view(trace, f"{self.path}: trace {name_of(trace, e)}")
      last = len(view.trace.steps) - 1
      null = self.options.null_text if self.config.replacement == "null" else ""
      asks.append(Ask(view.trace.prefix(last) + null, 0, 0, 1, step_name(view.trace, e, last)))
    self.caps(asks)

  def view(self, trace: TextTrace, where: str) -> AgentView:
    """The trace's agent steps as this job cuts them (`agent_view`)."""
    return agent_view(trace, where, self.options.chunking, self.layout, self.options.agent_steps)

  # -- continuations ------------------------------------------------------------------------
  def sample(self, asks: list[Ask]) -> list[list[Rollout]]:
    """Continuations lo .. hi-1 of every ask, each from its own fork of the environment's
    state before the ask's step."""
    starts = [functools.partial(self.branches[a.episode].at, a.t) for a in asks]
    rolled = self._roll(asks, starts)
    if self.options.tool_check:
      self._recheck(asks, rolled)
    return rolled

  def _recheck(self, asks: list[Ask], rolled: list[list[Rollout]]) -> None:
    """The self-check (`--tool-check N`): the first N continuations of each trace that made
    calls, their calls run again on a fresh fork (`tools.recheck`)."""
    for ask, row in zip(asks, rolled, strict=True):
      for j, roll in enumerate(row):
        if self.checked[ask.episode] >= self.options.tool_check:
          break
        calls, seen = [], []
        for kind, piece in self.layout.pieces(roll.text):
          if kind == "call":
            calls.append(self.layout.parse_call(piece))
          elif kind == "result":
            seen.extend(self.layout.observations(piece) or [])
        if calls:
          self.checked[ask.episode] += 1
          recheck(self.branches[ask.episode], ask.t, calls, seen,
                  f"{ask.where}, continuation {ask.lo + j}")  # fmt: skip

  def _roll(self, asks: list[Ask], starts: list, first=None) -> list[list[Rollout]]:
    """The multi-turn loop (module docstring), every live continuation's next turn requested
    together: turn 0 is the ask's own block request (`TextLabeler.sample`, or `first`'s
    completions), turn u > 0 of continuation j one request seeded `turn_seed(seed, j, u)`."""
    live, out = [], []
    if first is None:
      first = super().sample(asks)
    for ask, turn, start in zip(asks, first, starts, strict=True):
      row = [_Live(ask, ask.lo + j, start()) for j in range(len(turn))]
      for r, completion in zip(row, turn, strict=True):
        self._take(r, completion)
      live.extend(r for r in row if not r.done)
      out.append(row)
    while live:
      going = []
      for r, cap in zip(live, self._turn_caps([r.ask.prompt + r.text for r in live]),
                        strict=True):  # fmt: skip
        if cap == 0:  # the text fills the model's context: the episode ends as written
          r.done, r.finish = True, "length"
          self.context_ends[r.ask.episode] += 1
        else:
          going.append((r, cap))
      draws = [Draw(r.ask.prompt + r.text, turn_seed(r.ask.seed, r.index, r.turns), 0, 1,
                    cap, f"{r.ask.where}, continuation {r.index}, turn {r.turns}", r.ask.episode)
               for r, cap in going]  # fmt: skip
      for (r, _), (completion,) in zip(going, self.client.sample(draws) if draws else [],
                                       strict=True):  # fmt: skip
        self._take(r, completion)
      live = [r for r, _ in going if not r.done]
    result = []
    for row in out:
      for r in row:
        self.spent[r.ask.episode] += r.turns
        self.tool_calls[r.ask.episode] += r.calls
      result.append([Rollout(r.text, r.finish, r.tokens, r.state, r.turns, r.calls) for r in row])
    return result

  def _turn_caps(self, prompts: list[str]) -> list[int | None]:
    """Each later turn's max_tokens: None (--max-tokens), what its text leaves of the
    model's context where that is less (`rooms`), 0 where nothing is left."""
    rooms = self.rooms(prompts)
    if rooms is None:
      return [None] * len(prompts)
    return [max(room, 0) if room < self.options.max_tokens else None for room in rooms]

  def _take(self, r: _Live, completion) -> None:
    """One turn of a continuation: the model's text (cut after its calls, or where it starts
    a result itself), then its calls executed in order on the continuation's state, their
    results appended as one block. A call that ends the episode is its turn's last: the
    calls written after it are cut from the text, never executed."""
    text, called = self.layout.end_turn(completion.text, completion.finish_reason, self.several)
    r.turns += 1
    r.tokens += completion.tokens
    r.finish = completion.finish_reason
    if not called:
      r.text += text
      r.done = True
      return
    calls = self.layout.trailing_calls(text)
    observations, done = [], False
    for k, call in enumerate(calls):
      r.state, observation, done = execute(self.env, r.state, call)
      r.calls += 1
      observations.append(observation)
      if done:
        text = _drop_calls(text, len(calls) - k - 1, self.layout)
        break
    r.text += text + self.layout.render_results(observations)
    r.done = done or r.turns >= self.options.max_turns
    if not done and r.done:  # cut by --max-turns: scored as written, counted apart
      self.turn_ends[r.ask.episode] += 1

  # -- outcomes -----------------------------------------------------------------------------
  def _env_outcome(self, state, where: str) -> float:
    value = guarded("outcome()", self.env.outcome, state)
    try:
      number = float(value)
    except (TypeError, ValueError):
      number = float("nan")
    if not 0.0 <= number <= 1.0:
      raise HindsightError(f"--verifier env: the environment's outcome() is {value} on "
                           f"{where}: outcomes must be in [0, 1]")  # fmt: skip
    return number

  def outcomes_of(self, trace: TextTrace, t: int, completions, inserted: str = "") -> np.ndarray:
    if self.verify is None:
      where = f"trace {trace.id or '?'}, step {t}"
      return np.array([self._env_outcome(c.state, where) for c in completions], np.float64)
    return super().outcomes_of(trace, t, completions, inserted)

  def trace_outcome(self, trace: TextTrace, episode: int) -> float:
    if self.verify is None:
      return self._env_outcome(self.branches[episode].final, f"trace {name_of(trace, episode)}")
    return super().trace_outcome(trace, episode)

  def _trace_arrays(self, trace: TextTrace, episode: int, drawn: int) -> dict:
    """The text labeler's arrays, with what the trace cost: every completion of every turn
    (`completions`) and every call the environment executed (`tool_calls`)."""
    del drawn  # continuations are several completions each: counted as they were drawn
    out = super()._trace_arrays(trace, episode, 0)
    out["completions"] = self.spent.pop(episode, 0)
    out["tool_calls"] = self.tool_calls.pop(episode, 0)
    # Continuations ended because the text (a long tool result, say) filled the model's
    # context: scored as they stand, counted apart so a user sees the bias they bring.
    out["context_ends"] = self.context_ends.pop(episode, 0)
    out["turn_ends"] = self.turn_ends.pop(episode, 0)  # ... and by --max-turns
    out["tool_checked"] = self.checked.pop(episode, 0)  # continuations --tool-check re-ran
    return out


def _drop_calls(text: str, count: int, layout: ToolLayout) -> str:
  """`text` without its last `count` calls (and the whitespace between them)."""
  parts = layout.pieces(text)
  while count and parts:
    kind, _ = parts.pop()
    count -= kind == "call"
  while parts and not parts[-1][1].strip():
    parts.pop()
  return "".join(p for _, p in parts)
