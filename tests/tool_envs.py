"""Tool environments for tests/test_agents_text.py, named as `--tools tests.tool_envs:CLASS`
(a class is the factory `--tools MODULE:ENV` calls)."""

from __future__ import annotations

import threading

from hindsight.agentic.tools import ToolEnv
from hindsight.worlds.tool_world import ToolWorldEnv


class Unbranchable(ToolWorldEnv):
  """An environment that says nothing about how to fork its state."""

  branching = None

  def __init__(self):
    pass


class DriftingReplay(ToolWorldEnv):
  """A replayed environment whose tools are not deterministic: every lookup of a box counts
  one apple more than the one before it (across resets)."""

  def __init__(self):
    super().__init__("replay")
    self.drift = 0

  def step(self, state, call):
    state, observation, done = super().step(state, call)
    if call.name == "lookup":
      self.drift += 1
      observation = f"{observation} (and {self.drift} more)"
    return state, observation, done


class LateDriftReplay(ToolWorldEnv):
  """A replayed environment that answers the trace's own run as the world does, and every
  replay after it one apple off: what only a check at each replay sees."""

  def __init__(self):
    super().__init__("replay")
    self.resets: dict = {}

  def reset(self, trace, seed):
    self.resets[trace.prompt] = self.resets.get(trace.prompt, 0) + 1
    ledger = super().reset(trace, seed)
    ledger.replay = self.resets[trace.prompt] > 1  # this trace was run before
    return ledger

  def step(self, state, call):
    state, observation, done = super().step(state, call)
    if call.name == "lookup" and state.replay:
      observation += " and one more"
    return state, observation, done


class Shifted(ToolWorldEnv):
  """A functional environment whose boxes hold one apple more than the world's: the traces
  of the world did not come from it."""

  def reset(self, trace, seed):
    ledger = super().reset(trace, seed)
    ledger.counts = tuple(c + 1 for c in ledger.counts)
    return ledger


class Crashing(ToolWorldEnv):
  """An environment whose tools fail with an error of their own (not a ToolError)."""

  def step(self, state, call):
    raise ZeroDivisionError("the tool broke")


class SnapshotWithoutRestore(ToolWorldEnv):
  def __init__(self):
    super().__init__("snapshot")

  restore = None


class Recording(ToolWorldEnv):
  """The tool world, every observation it writes recorded (what a resample's results must
  be drawn from)."""

  def __init__(self, branching: str = "functional"):
    super().__init__(branching)
    self.written: list[str] = []

  def step(self, state, call):
    state, observation, done = super().step(state, call)
    self.written.append(observation)
    return state, observation, done


class NoOutcome(ToolWorldEnv):
  """The tool world without outcome(): nothing for --verifier env to score."""

  outcome = None


class BaseOutcome(ToolWorldEnv):
  """The tool world with `ToolEnv`'s outcome() (which scores nothing) in place of its own."""

  outcome = ToolEnv.outcome


class Scored(ToolWorldEnv):
  """The tool world whose outcome() is `value`, whatever the state."""

  value: object = 1.0

  def outcome(self, state):
    del state
    return self.value


class Locked(ToolWorldEnv):
  """A functional environment whose state holds a lock (as a connection or an open file
  would): it cannot be deep-copied."""

  def reset(self, trace, seed):
    ledger = super().reset(trace, seed)
    ledger.lock = threading.Lock()
    return ledger
