"""Tool environments: what executes an agent's tool calls while its traces are resampled
(`hindsight label --env text:FILE.jsonl --tools ENV`, docs/agents-text.md).

An environment is any object with

  branching                  "functional", "replay" or "snapshot": how a state is forked
  reset(trace, seed)         -> state: the world a trace starts in. `trace` is the
                             `TextTrace` (its prompt, id, reference and `metadata`, as the
                             file gives them); `seed` comes from the job's key (`--seed`), not
                             from the trace, so a recorded trace needs a start that does not
                             depend on it (or read from `trace.metadata`)
  step(state, call)          -> (state, observation, done): executes one `ToolCall`; raising
                             `ToolError(message)` answers the agent "error: message"
  snapshot(state) -> blob,   (branching "snapshot") a user's pair that saves and restores
  restore(blob) -> state     a state that cannot be copied (a sandbox, a database)
  outcome(state)             optional: the trace's outcome in [0, 1] from the final state
                             (`--verifier env`)

and the branching names how the labeler gets the state before step t of a trace, once for
every continuation it draws from there:

  functional   the state is data: the labeler runs the trace's calls once and deep-copies the
               state before each step (`step` may mutate what it is given);
  replay       the tools are deterministic: the state is rebuilt for every continuation by
               `reset` and the trace's own calls up to step t, each replay checked to give
               the trace's own observations (one that does not is refused: the tools are not
               deterministic, and the branches would not start where the trace was);
  snapshot     `snapshot` after each of the trace's steps, `restore` for each continuation.

An environment with none of them is refused in one line: its continuations would share one
state, each seeing the side effects of the others. Every branching runs the trace's calls
first and checks that they give the trace's own observations: the environment's answer to a
well-formed call, and for a call that does not parse (`Malformed`: it never reaches the
environment, hindsight's parser answers it `error: <why>`) any result the trace recorded as
`error: ...`, since another agent framework words its parse errors its own way. A call the
trace makes after the environment said the episode was done is labeled as given, with a
note once per trace.

Environments are named `--tools NAME` (registered with `register_tool_env`; `tool-world` is
built in) or `--tools MODULE:ENV` (a class or a function that returns the environment).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from hindsight.errors import HindsightError, note
from hindsight.plugins import Registry
from hindsight.text.tool_syntax import Malformed, ToolCall

BRANCHINGS = ("functional", "replay", "snapshot")
_TOOL_ENVS: Registry = Registry()


class ToolError(Exception):
  """A call the environment refuses: the agent reads "error: <message>" as its result."""


class ToolEnv:
  """A base class for environments (the module docstring's protocol; duck typing works)."""

  branching = "functional"

  def reset(self, trace, seed: int):
    raise NotImplementedError

  def step(self, state, call: ToolCall):
    raise NotImplementedError

  def outcome(self, state) -> float | None:
    return None


def register_tool_env(name: str, factory: Callable[[], object] | str) -> None:
  """Makes `--tools NAME` build the environment `factory()`; a "MODULE:FACTORY" string is
  imported only when NAME is asked for."""
  _TOOL_ENVS[name] = factory


def load_tool_env(spec: str):
  """The environment `--tools SPEC` names, checked to be one the labeler can branch."""
  factory = _TOOL_ENVS.lookup(spec)
  if factory is None:
    if ":" not in spec:
      known = ", ".join(sorted(_TOOL_ENVS)) or "none"
      raise HindsightError(f"--tools {spec}: no such environment (registered: {known}; or "
                           "MODULE:ENV)")  # fmt: skip
    factory = spec
  if isinstance(factory, str):  # MODULE:ENV, given or registered by name
    from hindsight.plugins import import_function

    factory = import_function(factory, "--tools")[1]
  try:
    env = factory()
  except Exception as e:  # user code: its failure named in one line
    raise HindsightError(f"--tools {spec}: building it raised {type(e).__name__}: {e}") from None
  for method in ("reset", "step"):
    if not callable(getattr(env, method, None)):
      raise HindsightError(f"--tools {spec}: the environment has no {method}()")
  branching = getattr(env, "branching", None)
  pair = all(callable(getattr(env, m, None)) for m in ("snapshot", "restore"))
  if branching not in BRANCHINGS or (branching == "snapshot" and not pair):
    raise HindsightError(
      f"--tools {spec}: the environment cannot be branched (set branching = 'functional' "
      "(its state is data), 'replay' (its tools are deterministic) or 'snapshot' (with "
      "snapshot() and restore())): its continuations would share one state"
    )
  return env


def execute(env, state, call: ToolCall | Malformed):
  """(state, observation, done) of one call: the environment's answer, or the error the agent
  reads for a malformed call or a `ToolError` (the state unchanged, the episode going on)."""
  if isinstance(call, Malformed):
    return state, f"error: {call.reason}", False
  try:
    state, observation, done = guarded(f"step({call.name})", env.step, state, call)
  except ToolError as e:
    return state, f"error: {e}", False
  return state, cut_result(str(observation), getattr(env, "max_result_chars", None)), bool(done)


def cut_result(observation: str, limit: int | None) -> str:
  """An observation of at most `limit` characters (None: as it is): a longer one keeps its
  first `limit` and says how much was cut. An environment sets `max_result_chars` to have
  every result cut so (a result that fills the model's context ends the continuation)."""
  if limit is None or len(observation) <= limit:
    return observation
  return observation[:limit] + f" [... {len(observation) - limit} more characters]"


def recheck(branches: Branches, t: int, calls: list, observations: list, where: str) -> None:
  """The self-check of a continuation from step t (`--tool-check`): its calls run again in
  order on a fresh fork of the state before step t, each result compared with the one the
  continuation got; a difference is a one-line error (the environment's answers depend on
  something outside its state, so its labels would not reproduce)."""
  state = branches.at(t)
  for k, (call, seen) in enumerate(zip(calls, observations, strict=True)):
    state, observation, _ = execute(branches.env, state, call)
    if observation != seen:
      raise HindsightError(
        f"{where}: its call {k + 1} ({call}) run again on a fresh fork of the state before "
        f"the step answers {observation!r} where the continuation got {seen!r}: the "
        "environment's answers depend on something outside its state (a clock, a random "
        "draw, a global, a server), so its labels would not reproduce"
      )


def is_error(observation: str) -> bool:
  """A result that reports an error (`error: ...`, any case): what a trace may record for a
  malformed call, however its agent framework worded the parse error."""
  return observation.lstrip().lower().startswith("error:")


def has_outcome(env) -> bool:
  """The environment scores a final state (an `outcome` of its own, not `ToolEnv`'s)."""
  outcome = getattr(env, "outcome", None)
  return callable(outcome) and getattr(outcome, "__func__", None) is not ToolEnv.outcome


def guarded(what: str, fn, *args):
  """fn(*args); an exception of the environment's own as a one-line HindsightError (a
  `ToolError` passes: it is the agent's answer, `execute`'s to give)."""
  try:
    return fn(*args)
  except (HindsightError, ToolError):
    raise
  except Exception as e:
    raise HindsightError(f"the tool environment's {what} raised {type(e).__name__}: {e}") from None


class Branches:
  """The environment's state before each step of one agent trace, forked for each use.

  calls [T]: each step's calls (a tuple, empty for a step that makes none, several for
  parallel calls, run in order), and observations [T] (the trace's own results: a tuple
  per step, None where no call). `at(t)` is a fresh state before step t;
  `final` the state after the trace (what `--verifier env` scores)."""

  def __init__(self, env, trace, seed: int, calls: list, observations: list, where: str):
    self.env, self.trace, self.seed, self.where = env, trace, seed, where
    self.calls, self.observations = calls, observations
    self.branching = env.branching
    self._saved: list = []  # per step: a deep copy (functional) or a snapshot
    state = guarded("reset()", env.reset, trace, seed)
    ended, noted = None, False  # the step at which the environment said the episode was done
    for t in range(len(calls) + 1):
      if self.branching == "functional":
        self._saved.append(self._copy(state))
      elif self.branching == "snapshot":
        self._saved.append(guarded("snapshot()", env.snapshot, state))
      if t < len(calls):
        if ended is not None and calls[t] and not noted:
          note(f"{where}, step {t}: a call after the environment said the episode was done "
               f"(at step {ended}): labeled as given, run on the state the episode ended "
               "in")  # fmt: skip
          noted = True
        state, done = self._replay_step(state, t)
        if done and ended is None:
          ended = t
    self.final = state

  def _copy(self, state):
    """A deep copy of a functional environment's state, or a one-line error naming the fix."""
    try:
      return copy.deepcopy(state)
    except Exception as e:
      raise HindsightError(
        f"{self.where}: the environment's state cannot be deep-copied under branching "
        f"'functional' ({type(e).__name__}: {e}): use branching 'replay' or 'snapshot', or keep "
        "the handle out of the state"
      ) from None

  def _replay_step(self, state, t: int):
    """(the state after the trace's step t, done): its calls run in order, each checked
    against the trace's own observation: the environment's for a well-formed call; for a
    malformed one (hindsight's parser answers it, the environment never sees it) any
    recorded `error: ...`."""
    done = False
    for k, call in enumerate(self.calls[t]):
      # `step` may mutate `state`: under functional branching the copies in `_saved` were
      # taken before, and no one else holds this one.
      state, observation, ended = execute(self.env, state, call)
      done = done or ended
      recorded = self.observations[t][k]
      which = f" (call {k + 1} of {len(self.calls[t])})" if len(self.calls[t]) > 1 else ""
      if isinstance(call, Malformed):
        if not is_error(recorded):
          raise HindsightError(
            f"{self.where}, step {t}{which}: a malformed call ({call.reason}), which "
            f"hindsight's parser answers (the environment never sees it) with {observation!r}, "
            f"where the trace holds {recorded!r}: record a malformed call's result as "
            "`error: ...`"
          )
      elif observation != recorded:
        raise HindsightError(
          f"{self.where}, step {t}{which}: the environment answers {observation!r} where the "
          f"trace holds {recorded!r}: its tools are not deterministic, or the trace comes from "
          "another environment (branches must start where the trace was)"
        )
    return state, done

  def at(self, t: int):
    """A fresh state before step t (after the trace's steps 0 .. t-1)."""
    if self.branching == "functional":
      return copy.deepcopy(self._saved[t])
    if self.branching == "snapshot":
      return guarded("restore()", self.env.restore, self._saved[t])
    state = guarded("reset()", self.env.reset, self.trace, self.seed)
    for j in range(t):
      state, _ = self._replay_step(state, j)
    return state


# The built-ins, by name: imported when named (the registry never imports what fills it).
register_tool_env("tool-world", "hindsight.worlds.tool_world:ToolWorldEnv")
