"""Tool environments for tests/test_agents_text.py, named as `--tools tests.tool_envs:NAME`."""

from __future__ import annotations

from hindsight.text.tool_world import ToolWorldEnv


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


def unbranchable():
  return Unbranchable()


def drifting_replay():
  return DriftingReplay()


def snapshot_without_restore():
  return SnapshotWithoutRestore()
