"""Adapters for environments users already have: Gymnasium and dm_env (bsuite included).

These environments are stateful Python objects, so branching at step t means restoring
s_t: by `copy.deepcopy` of the environment, or, where deepcopy fails, by deterministic
replay: re-create, reset with the episode's seed, and replay the recorded actions (checked
against the recorded observations). A restored copy carries the random state the
environment had at s_t, which every branch would then share; `reseed` gives each branch
(t, k) its own noise, common to the arms of that branch only (common random numbers).

  --env gymnasium:ENV_ID          gymnasium.make(ENV_ID), discrete action space
  --env dm_env:MODULE:FACTORY     MODULE.FACTORY() returns a dm_env.Environment (given a
                                  `seed` parameter, it is called with each episode's seed)
  --policy MODULE:FN              FN(observation, rng) -> action; default uniform

Observations are exported as float32 vectors (flattened).
"""

from __future__ import annotations

import copy
import importlib

import numpy as np

from hindsight.errors import HindsightError
from hindsight.plugins import import_function

DEFAULT_HORIZON = 1000
# Where gymnax, Gymnasium, dm_env and bsuite come from: the package's optional extra.
ADAPTERS_EXTRA = "pip install 'hindsight[adapters]'; in a checkout pip install -e '.[adapters]'"


class PyEnv:
  """A stateful discrete-action environment behind one small interface.

  reset(seed) -> obs; step(action) -> (obs, reward, done); clone() -> an independent copy
  at the same state (None if this environment cannot be deep-copied).
  """

  spec: str
  name: str
  num_actions: int
  horizon: int

  def reset(self, seed: int) -> np.ndarray:
    raise NotImplementedError

  def step(self, action: int) -> tuple[np.ndarray, float, bool]:
    raise NotImplementedError

  def clone(self):
    try:
      return copy.deepcopy(self)
    except Exception:  # any object inside may refuse to be copied
      return None

  def reseed(self, seed: int) -> bool:
    """Replaces the environment's random state by one seeded with `seed`; False where the
    environment keeps none that can be found (its branches then share its noise)."""
    return _reseed_attributes(self._env, seed)


_RNG_ATTRIBUTES = ("np_random", "_np_random", "_rng", "_random_state", "rng", "random_state")


def _reseed_attributes(env, seed: int) -> bool:
  """Replaces the first NumPy random state found on `env` (or its `unwrapped`) by one seeded
  with `seed`, of the same type. Gymnasium keeps it in `np_random`, bsuite in `_rng`."""
  target = getattr(env, "unwrapped", env)
  for name in _RNG_ATTRIBUTES:
    current = getattr(target, name, None)
    if isinstance(current, np.random.Generator):
      setattr(target, name, np.random.default_rng(seed))
      return True
    if isinstance(current, np.random.RandomState):
      setattr(target, name, np.random.RandomState(seed % 2**32))
      return True
  return False


def _flat(obs) -> np.ndarray:
  return np.asarray(obs, np.float32).reshape(-1)


class GymnasiumEnv(PyEnv):
  def __init__(self, env_id: str, horizon: int | None = None):
    try:
      import gymnasium
    except ImportError:
      raise HindsightError(f"env gymnasium: needs gymnasium ({ADAPTERS_EXTRA})") from None
    try:
      self._env = gymnasium.make(env_id)
    except Exception as e:
      raise HindsightError(f"env gymnasium:{env_id}: {type(e).__name__}: {e}") from None
    space = self._env.action_space
    if not isinstance(space, gymnasium.spaces.Discrete):
      raise HindsightError(f"env gymnasium:{env_id}: only Discrete action spaces, got {space}")
    self.spec, self.name = f"gymnasium:{env_id}", env_id
    self.num_actions = int(space.n)
    self._start = int(space.start)
    limit = self._env.spec.max_episode_steps if self._env.spec else None
    self.horizon = int(horizon or limit or DEFAULT_HORIZON)
    self._t = 0

  def reset(self, seed):
    self._t = 0
    obs, _ = self._env.reset(seed=int(seed))
    return _flat(obs)

  def step(self, action):
    obs, reward, terminated, truncated, _ = self._env.step(int(action) + self._start)
    self._t += 1
    done = bool(terminated or truncated or self._t >= self.horizon)
    return _flat(obs), float(reward), done


class DmEnv(PyEnv):
  def __init__(self, module: str, factory: str, horizon: int | None = None):
    try:
      fn = getattr(importlib.import_module(module), factory)
    except (ImportError, AttributeError) as e:
      raise HindsightError(f"env dm_env:{module}:{factory}: cannot load it ({e})") from None
    import inspect

    try:
      self._seeded = "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
      self._seeded = False
    self._factory = fn
    self._env = fn(seed=0) if self._seeded else fn()
    spec = self._env.action_spec()
    if not hasattr(spec, "num_values"):
      raise HindsightError(f"env dm_env:{module}:{factory}: only discrete actions")
    self.spec, self.name = f"dm_env:{module}:{factory}", factory
    self.num_actions = int(spec.num_values)
    self.horizon = int(horizon or DEFAULT_HORIZON)
    self._t = 0

  def reset(self, seed):
    # dm_env has no seeded reset. A FACTORY that takes `seed` (bsuite's environments do) is
    # re-created with the episode's seed, which makes episodes reproducible and replayable;
    # any other factory is reset as it is, and its episodes are only as reproducible as it.
    self._t = 0
    if self._seeded:
      self._env = self._factory(seed=int(seed))
    return _flat(self._env.reset().observation)

  def step(self, action):
    ts = self._env.step(int(action))
    self._t += 1
    return (
      _flat(ts.observation),
      float(ts.reward or 0.0),
      bool(ts.last() or self._t >= self.horizon),
    )


def import_policy(spec: str):
  """(module, FN) of a `--policy MODULE:FN`; a one-line error if either cannot be had."""
  return import_function(spec, "--policy")


def python_policy(spec: str | None, num_actions: int):
  """The behaviour policy of a Python environment: FN(observation, rng) -> action from
  MODULE:FN, or uniform over the actions."""
  if not spec:
    return lambda obs, rng: int(rng.integers(num_actions))
  return import_policy(spec)[1]
