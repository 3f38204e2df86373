"""`team`: agents taking turns on a shared task, built so that who earned what is known.

Agent t % n acts at step t, for `rounds` rounds (horizon = rounds * n). Roles:
  planner    restates the task: decorative by construction (changes nothing);
  researcher finds the solution: each `act` succeeds with probability p_find;
  critic     repairs the planted error in the solver's draft: worth something only after,
             and only together with, the solver's draft;
  solver     writes the draft once the solution is found; the draft carries a planted error
             with probability p_error.
Extra agents (n > 4) are planners: the scalable variant for sampled Shapley values.
Actions: 0 = null (a turn that does nothing), 1 = act (the role's work), 2 = chatter.
The episode pays 1 at its end if the draft is written and error-free (success).

Coalition values v(S) for one episode (`hindsight.labeling.agents.coalition_values`): agents in
S replay their actual actions, the others' turns are replaced (a null turn, or a fresh draw
from their own policy), and the rollout is repeated K times from the episode's true initial
state with common random numbers across coalitions. With p_error = 1 the game is a
unanimity game of {researcher, solver, critic}: equal Shapley values for the three, 0 for
planners, and positive pairwise interactions. With the default p_error = 0.5 a draft is
right half the time without the critic, so the solver earns more than the critic, whose
value is all interaction with it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hindsight import pytree
from hindsight.envs.base import Environment
from hindsight.errors import HindsightError
from hindsight.policies.base import Policy

PLANNER, RESEARCHER, CRITIC, SOLVER = range(4)
ROLE_NAMES = ("planner", "researcher", "critic", "solver")
NULL, ACT, CHATTER = range(3)


@pytree.dataclass
class TeamState:
  time: jax.Array  # int32 []
  done: jax.Array  # bool []
  found: jax.Array  # bool [] the solution is known
  drafted: jax.Array  # bool [] the solver wrote the draft
  error: jax.Array  # bool [] the draft carries the planted error


@pytree.dataclass
class TeamParams:
  p_find: jax.Array  # float32 []
  p_error: jax.Array  # float32 []


class Team(Environment):
  """See the module docstring."""

  name = "team"
  num_actions = 3
  null_action = NULL
  success_threshold = 0.5
  tag_names = tuple(f"{role}_{what}" for role in ROLE_NAMES for what in ("null", "act", "chatter"))

  def __init__(self, num_agents: int = 4, rounds: int = 3, p_find=0.7, p_error=0.5):
    if num_agents < 4:
      raise HindsightError(f"team needs at least 4 agents, got {num_agents}")
    self.num_agents, self.rounds = num_agents, rounds
    self.horizon = num_agents * rounds
    self.roles = np.array([PLANNER, RESEARCHER, CRITIC, SOLVER] + [PLANNER] * (num_agents - 4))
    self.agent_names = tuple(f"{i}:{ROLE_NAMES[r]}" for i, r in enumerate(self.roles))
    self._p_find, self._p_error = p_find, p_error

  def default_params(self) -> TeamParams:
    return TeamParams(p_find=jnp.float32(self._p_find), p_error=jnp.float32(self._p_error))

  def role(self, time) -> jax.Array:
    return jnp.asarray(self.roles)[self.agent_of_step(time)]

  def reset(self, key, params: TeamParams) -> TeamState:
    del key, params
    false = jnp.bool_(False)
    return TeamState(time=jnp.int32(0), done=false, found=false, drafted=false, error=false)

  def step(self, key, state: TeamState, action, params: TeamParams):
    u_find, u_error = jax.random.uniform(key, (2,))
    role, acts = self.role(state.time), action == ACT
    found = state.found | (acts & (role == RESEARCHER) & (u_find < params.p_find))
    writes = acts & (role == SOLVER) & state.found & ~state.drafted
    repairs = acts & (role == CRITIC) & state.drafted
    error = jnp.where(writes, u_error < params.p_error, state.error & ~repairs)
    drafted = state.drafted | writes
    time = state.time + 1
    done = time >= self.horizon
    reward = jnp.where(done & drafted & ~error, 1.0, 0.0).astype(jnp.float32)
    new = TeamState(time=time, done=done, found=found, drafted=drafted, error=error)
    return new, reward, done

  def return_bounds(self, state, params) -> jax.Array:
    """[0, 1]: the episode pays 1 or 0 at its end."""
    del state, params
    return jnp.array([0.0, 1.0], jnp.float32)

  def observation(self, state: TeamState, params) -> jax.Array:
    """float32 [4 + n]: found, drafted, error, time / H, and the acting agent one-hot."""
    del params
    flags = jnp.stack([state.found, state.drafted, state.error]).astype(jnp.float32)
    turn = jax.nn.one_hot(self.agent_of_step(state.time), self.num_agents)
    return jnp.concatenate([flags, jnp.float32(state.time / self.horizon)[None], turn])

  def tag(self, state: TeamState, action, params) -> jax.Array:
    del params
    return (self.role(state.time) * 3 + jnp.asarray(action)).astype(jnp.int32)


class TeamPolicy(Policy):
  """Every agent acts with probability p_act, chatters with 1 - p_act."""

  name = "team_scripted"

  def __init__(self, p_act: float = 0.6):
    self.p_act = p_act

  def default_params(self):
    return jnp.float32(self.p_act)

  def probs(self, params, state, env_params):
    del state, env_params
    return jnp.stack([jnp.float32(0.0), params, 1.0 - params])
