"""`gymnax:ID`: any gymnax environment inside the jitted labeler (no replay, no copies).

gymnax states are pytrees and `step_env` is a pure function of (key, state, action, params),
which is all the labeler needs: branching at step t is calling `step_env` again on the
saved state, and the arms of a branch draw their step keys from the same continuation key
(common random numbers). `GymnaxEnv` wraps the environment in hindsight's protocol: its
state carries the gymnax state, the last observation (some `get_obs` draw noise, so the
observation is kept rather than recomputed), the steps taken and a done flag. Episodes end
at gymnax's own termination or after `horizon` steps (default: the environment's
`max_steps_in_episode`); gymnax's auto-reset (`env.step`) is not used.

The behaviour policy is a JAX function (`--policy MODULE:FN`):
  FN(obs, key)            or
  FN(params, obs, key)    with params = MODULE.params (a pytree, or a function returning one)
returning action probabilities or logits [A] (an output that is not a distribution, with a
negative entry or a sum off 1, is taken as logits). The key is fixed: return the
distribution and hindsight draws the action. Without --policy: uniform over the actions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from hindsight import pytree
from hindsight.envs.adapters import ADAPTERS_EXTRA, import_policy
from hindsight.envs.base import Environment
from hindsight.errors import HindsightError
from hindsight.policies.base import Policy

PyTree = Any


@pytree.dataclass
class GymnaxState:
  env_state: PyTree  # the gymnax state
  obs: jax.Array  # the observation of env_state (float32)
  time: jax.Array  # int32 [] steps taken since reset
  done: jax.Array  # bool []


class GymnaxEnv(Environment):
  """A gymnax environment (discrete actions) as a hindsight Environment."""

  def __init__(
    self,
    env_id: str,
    horizon: int | None = None,
    return_range: tuple[float, float] | None = None,
    success_threshold: float = 0.0,
  ):
    try:
      import gymnax
    except ImportError:
      raise HindsightError(f"env gymnax: needs gymnax ({ADAPTERS_EXTRA})") from None
    try:
      self.env, self._params = gymnax.make(env_id)
    except Exception as e:  # gymnax raises ValueError or its own types for unknown ids
      raise HindsightError(f"env gymnax:{env_id}: unknown gymnax environment ({e})") from None
    space = self.env.action_space(self._params)
    if not hasattr(space, "n"):
      raise HindsightError(f"env gymnax:{env_id}: only discrete action spaces are supported")
    self.name = f"gymnax:{env_id}"
    self.num_actions = int(space.n)
    longest = int(getattr(self._params, "max_steps_in_episode", 0) or 0)
    self.horizon = int(horizon or longest)
    if self.horizon < 1:
      raise HindsightError(f"env gymnax:{env_id}: give --horizon (no max_steps_in_episode)")
    self.success_threshold = success_threshold
    self._range = return_range
    self.tag_names = tuple(f"a{i}" for i in range(self.num_actions))

  def default_params(self) -> PyTree:
    return self._params

  def reset(self, key, params) -> GymnaxState:
    obs, state = self.env.reset_env(key, params)
    return GymnaxState(env_state=state, obs=_flat(obs), time=jnp.int32(0), done=jnp.bool_(False))

  def step(self, key, state: GymnaxState, action, params):
    obs, env_state, reward, done, _ = self.env.step_env(key, state.env_state, action, params)
    time = state.time + 1
    done = jnp.asarray(done, bool) | (time >= self.horizon)
    new = GymnaxState(env_state=env_state, obs=_flat(obs), time=time, done=done)
    return new, jnp.asarray(reward, jnp.float32), done

  def observation(self, state: GymnaxState, params) -> jax.Array:
    del params
    return state.obs

  def return_bounds(self, state: GymnaxState, params) -> jax.Array:
    if self._range is None:
      return super().return_bounds(state, params)
    return jnp.asarray(self._range, jnp.float32)


def _flat(obs) -> jax.Array:
  return jnp.asarray(obs, jnp.float32).reshape(-1)


class FunctionPolicy(Policy):
  """pi(. | s) = FN(obs, key) or FN(params, obs, key) on the state's observation: the
  probabilities it returns, or the softmax of its logits."""

  def __init__(self, fn: Callable, params: PyTree = None, name: str = "function"):
    self.fn, self.params, self.name = fn, params, name
    self._takes_params = params is not None

  def default_params(self) -> PyTree:
    return self.params if self._takes_params else jnp.zeros(())

  def probs(self, params, state: GymnaxState, env_params) -> jax.Array:
    del env_params
    key = jax.random.key(0)  # the distribution is the policy's; hindsight draws the action
    out = self.fn(params, state.obs, key) if self._takes_params else self.fn(state.obs, key)
    out = jnp.asarray(out, jnp.float32).reshape(-1)
    is_dist = (out.min() >= 0) & (jnp.abs(out.sum() - 1.0) < 1e-4)
    return jnp.where(is_dist, out, jax.nn.softmax(out))


class UniformPolicy(Policy):
  name = "uniform"

  def __init__(self, num_actions: int):
    self.num_actions = num_actions

  def default_params(self) -> PyTree:
    return jnp.zeros(())

  def probs(self, params, state, env_params) -> jax.Array:
    del params, state, env_params
    return jnp.full((self.num_actions,), 1.0 / self.num_actions, jnp.float32)


def load_jax_policy(spec: str | None, num_actions: int) -> Policy:
  """The policy of `--policy MODULE:FN` (see the module docstring), or uniform."""
  if not spec:
    return UniformPolicy(num_actions)
  module, fn = import_policy(spec)
  try:
    arity = len(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    arity = 2
  if arity not in (2, 3):
    raise HindsightError(f"policy {spec}: expected FN(obs, key) or FN(params, obs, key)")
  params = None
  if arity == 3:
    params = getattr(module, "params", None)
    if params is None:
      raise HindsightError(f"policy {spec}: FN(params, obs, key) needs {module.__name__}.params")
    params = params() if callable(params) else params
  return FunctionPolicy(fn, params, name=spec)


def make_gymnax(
  spec: str,
  policy: str | None = None,
  horizon: int | None = None,
  return_range: tuple[float, float] | None = None,
) -> tuple[GymnaxEnv, Policy]:
  """`gymnax:ID` -> (environment, behaviour policy)."""
  env_id = spec.partition(":")[2]
  if not env_id:
    raise HindsightError("env gymnax needs an environment id: gymnax:ID")
  env = GymnaxEnv(env_id, horizon, return_range)
  return env, load_jax_policy(policy, env.num_actions)
