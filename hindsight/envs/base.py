"""The functional environment protocol (gymnax style).

An environment is a *static* Python object (sizes, horizon, names: everything that shapes
compiled code) plus two pytrees: `EnvParams` (arrays that parameterise the dynamics) and
`EnvState` (the *full* state, latent variables included). `reset` and `step` are pure
functions of an explicit key, so branching a trajectory at step t is nothing more than
calling `step` again on the saved state s_t.

Every state carries `time` (steps taken since reset, int32 scalar) and `done` (bool scalar):
the engine needs both to know how many steps of the horizon remain and whether a branch
starts after the episode has already ended.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


class Environment(abc.ABC):
  """A discrete-action episodic environment with a fixed horizon.

  Attributes (static; changing one means recompiling):
    name: short identifier written into label metadata.
    num_actions: A, actions are int32 in [0, A).
    horizon: H, the episode ends at the latest after H steps.
    null_action: the declared "do nothing" action, or None if the environment has none.
    tag_names: names of the per-step tags returned by `tag` (index -> name).
    success_threshold: an episode succeeds when its return exceeds this.
    num_step_uniforms: n > 0 declares that `step` consumes exactly n uniform numbers and
      that `step_from_uniforms` exists. The labeler's branches then take the step's
      uniforms straight from the hash that also draws the policy's (rollout.step_randomness)
      instead of building a key for `step` (Threefry dominates rollout cost on CPU).
    has_action_classes: `action_class` names the content class of an action (what it
      does), which the `policy_no_repeat` replacement needs.
    num_agents, agent_names, agent_of_step: the agents of a multi-agent environment (0:
      single-agent).
  """

  name: str
  num_actions: int
  horizon: int
  null_action: int | None = None
  tag_names: tuple[str, ...] = ()
  success_threshold: float = 0.0
  num_step_uniforms: int = 0
  has_action_classes: bool = False
  # Multi-agent environments declare their agents: then every labeling job also writes
  # agent-level credit (hindsight.labeling.agents), turns ablated to `null_action`.
  num_agents: int = 0
  agent_names: tuple[str, ...] = ()

  def agent_of_step(self, time) -> jax.Array:
    """int32 []: the agent who acts at step `time` (default: turns in order)."""
    return jnp.asarray(time, jnp.int32) % max(self.num_agents, 1)

  @abc.abstractmethod
  def default_params(self) -> PyTree:
    """The environment's parameters as a pytree of arrays."""

  @abc.abstractmethod
  def reset(self, key: jax.Array, params: PyTree) -> PyTree:
    """Draws s_0. Returns the state pytree (time 0, not done)."""

  @abc.abstractmethod
  def step(
    self, key: jax.Array, state: PyTree, action: jax.Array, params: PyTree
  ) -> tuple[PyTree, jax.Array, jax.Array]:
    """One transition. Returns (s_{t+1}, r_t float32 [], done_{t+1} bool []).

    `done` is True when the episode ends with this step (terminal state or horizon).
    The returned state carries time + 1 and the done flag.
    """

  def step_from_uniforms(
    self, u: jax.Array, state: PyTree, action: jax.Array, params: PyTree
  ) -> tuple[PyTree, jax.Array, jax.Array]:
    """`step` driven by u float32 [num_step_uniforms] instead of a key (optional)."""
    raise NotImplementedError(f"{self.name} declares no uniform-driven step")

  @abc.abstractmethod
  def observation(self, state: PyTree, params: PyTree) -> jax.Array:
    """What an agent (and the credit model) may see of the state; latents excluded."""

  def success(self, final_state: PyTree, episode_return: jax.Array) -> jax.Array:
    """bool []: did the episode that ended in `final_state` with this return succeed?

    Default: return > success_threshold (docs/design.md, section 1). Environments whose success is
    an event rather than a return level (a door opened) override this.
    """
    del final_state
    return episode_return > self.success_threshold

  @property
  def success_from_return(self) -> bool:
    """Whether `success` is the default return level (not overridden): only then can an
    episode's success be derived from its rewards alone (`DataSpec.success_from_return`)."""
    return type(self).success is Environment.success

  def return_bounds(self, state: PyTree, params: PyTree) -> jax.Array:
    """float32 [2]: (lo, hi) with lo <= G_t <= hi for every return-to-go from `state`, under
    any first action and the policy after it, and every gamma in (0, 1].

    The labeler needs it to bound Monte Carlo estimates whose branches all tie (see
    `credit.estimators`); it sets (0, 0) itself for states that are done. Default: unknown,
    (-inf, inf), which makes the stderr of a tied estimate infinite (honest, not useful):
    environments should declare a range.
    """
    del state, params
    return jnp.array([-jnp.inf, jnp.inf], jnp.float32)

  def legal_actions(self, state: PyTree, params: PyTree) -> jax.Array:
    """bool [A]: which actions are legal in `state`. Default: all of them."""
    del state, params
    return jnp.ones((self.num_actions,), dtype=bool)

  def tag(self, state: PyTree, action: jax.Array, params: PyTree) -> jax.Array:
    """int32 []: index into `tag_names` naming what taking `action` in `state` does."""
    del state, params
    return jnp.asarray(action, jnp.int32)

  def action_class(self, state: PyTree, action: jax.Array, params: PyTree) -> jax.Array:
    """int32 []: the content class of `action` in `state` (see `has_action_classes`)."""
    raise NotImplementedError(f"{self.name} declares no action classes")

  def state_index(self, state: PyTree) -> jax.Array | None:
    """int32 [] index of a discrete state (exported as `states`), or None if not discrete."""
    del state
    return None
