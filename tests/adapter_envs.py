"""dm_env environments that cannot be deep-copied, for the adapters' replay fallback.

`Uncopyable(seed)`: a random walk on 0..4 whose steps are drawn from its seeded generator;
it holds a lock, so `copy.deepcopy` raises and branching must replay. `Drifting(seed)`: the
same, but every instance draws from one shared stream, so a replay does not reproduce the
recording (not deterministic under reset(seed)).
"""

import itertools
import threading

import dm_env
import numpy as np
from dm_env import specs

_SHARED = itertools.count()


class Uncopyable(dm_env.Environment):
  def __init__(self, seed: int = 0):
    self._lock = threading.Lock()  # deepcopy cannot copy a lock
    self._seed = seed
    self._rng = np.random.default_rng(seed)
    self._pos, self._t = 2, 0

  def _draw(self) -> float:
    return float(self._rng.random())

  def reset(self):
    self._pos, self._t = 2, 0
    return dm_env.restart(np.array([self._pos], np.float32))

  def step(self, action):
    self._t += 1
    move = (int(action) * 2 - 1) if self._draw() < 0.8 else 0  # slips 20% of the time
    self._pos = int(np.clip(self._pos + move, 0, 4))
    obs = np.array([self._pos], np.float32)
    if self._pos == 4:
      return dm_env.termination(1.0, obs)
    return dm_env.truncation(0.0, obs) if self._t >= 8 else dm_env.transition(0.0, obs)

  def observation_spec(self):
    return specs.Array((1,), np.float32)

  def action_spec(self):
    return specs.DiscreteArray(2)


class Copyable(Uncopyable):
  """Uncopyable's twin without the lock: branched by deepcopy."""

  def __init__(self, seed: int = 0):
    super().__init__(seed)
    del self._lock


class Drifting(Uncopyable):
  def _draw(self) -> float:
    return float(np.random.default_rng([self._seed, next(_SHARED)]).random())
