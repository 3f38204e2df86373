"""Tool environments: what executes an agent's tool calls while its traces are resampled
(`hindsight label --env text:FILE.jsonl --tools ENV`, docs/agents-text.md).

An environment is any object with

  branching                  "functional", "replay" or "snapshot": how a state is forked
  reset(trace, seed)         -> state: the world a trace starts in (its prompt, a seed)
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
first and checks that they give the trace's own observations.

Environments are named `--tools NAME` (registered with `register_tool_env`; `tool-world` is
built in) or `--tools MODULE:ENV` (a class or a function that returns the environment).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from hindsight.errors import HindsightError
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


def register_tool_env(name: str, factory: Callable[[], object]) -> None:
  """Makes `--tools NAME` build the environment `factory()`."""
  _TOOL_ENVS[name] = factory


def load_tool_env(spec: str):
  """The environment `--tools SPEC` names, checked to be one the labeler can branch."""
  factory = _TOOL_ENVS.lookup(spec)
  if factory is None:
    if ":" not in spec:
      known = ", ".join(sorted(_TOOL_ENVS)) or "none"
      raise HindsightError(f"--tools {spec}: no such environment (registered: {known}; or "
                           "MODULE:ENV)")  # fmt: skip
    from hindsight.plugins import import_function

    factory = import_function(spec, "--tools")[1]
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
  return state, str(observation), bool(done)


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

  steps: the trace's calls, one per step (None for a step that makes none), and observations
  [T] (the trace's own results; None where no call). `at(t)` is a fresh state before step t;
  `final` the state after the trace (what `--verifier env` scores)."""

  def __init__(self, env, trace, seed: int, calls: list, observations: list, where: str):
    self.env, self.trace, self.seed, self.where = env, trace, seed, where
    self.calls, self.observations = calls, observations
    self.branching = env.branching
    self._saved: list = []  # per step: a deep copy (functional) or a snapshot
    state = guarded("reset()", env.reset, trace, seed)
    for t in range(len(calls) + 1):
      if self.branching == "functional":
        self._saved.append(guarded("state (deep-copied)", copy.deepcopy, state))
      elif self.branching == "snapshot":
        self._saved.append(guarded("snapshot()", env.snapshot, state))
      if t < len(calls):
        state = self._replay_step(state, t)
    self.final = state

  def _replay_step(self, state, t: int):
    """The state after the trace's step t, checked against the trace's own observation."""
    call = self.calls[t]
    if call is None:
      return state
    # `step` may mutate `state`: under functional branching the copies in `_saved` were
    # taken before, and no one else holds this one.
    state, observation, _ = execute(self.env, state, call)
    if observation != self.observations[t]:
      raise HindsightError(
        f"{self.where}, step {t}: the environment answers {observation!r} where the trace "
        f"holds {self.observations[t]!r}: its tools are not deterministic, or the trace comes "
        "from another environment (branches must start where the trace was)"
      )
    return state

  def at(self, t: int):
    """A fresh state before step t (after the trace's steps 0 .. t-1)."""
    if self.branching == "functional":
      return copy.deepcopy(self._saved[t])
    if self.branching == "snapshot":
      return guarded("restore()", self.env.restore, self._saved[t])
    state = guarded("reset()", self.env.reset, self.trace, self.seed)
    for j in range(t):
      state = self._replay_step(state, j)
    return state


def _tool_world():
  from hindsight.text.tool_world import ToolWorldEnv

  return ToolWorldEnv()


register_tool_env("tool-world", _tool_world)
