"""Key-to-door: the classic delayed-credit benchmark, as a reduced corridor.

After the TVT task of Hung et al. (2019), used by the hindsight / counterfactual credit
assignment papers (Harutyunyan et al. 2019, Mesnard et al. 2021). Three phases, switched by
time, the agent placed at cell 0 of a fresh corridor at each switch:

  phase 1 (15 steps)  a corridor of 5 cells with a key on a random cell (1..3): `grab` there
                      picks it up
  phase 2 (90 steps)  10 apples worth U(1, 10) each (drawn at reset, held in the state),
                      one passing by every 9 steps: `grab` at that step eats it, otherwise
                      it is gone (a reduced corridor: apples are distractors whose reward
                      variance hides the key's delayed effect, not a navigation problem)
  phase 3 (15 steps)  a corridor of 5 cells with a door on the last: `grab` there opens it
                      if the agent holds the key: reward 10 and the episode ends

Actions: 0 `noop` (the null action), 1 `left`, 2 `right`, 3 `grab`.
Tags: `key` (the grab that takes the key), `apple` (a grab that eats an apple), `door` (the
grab that opens the door), `move` (everything else).
The key is worth nothing until 90+ steps later, behind the apples' reward variance: that
delay and that noise are what make credit hard here.

The behaviour policy (`KeyToDoorPolicy`) walks towards what is useful with some noise, grabs
the key with probability `p_key` when it first stands on it and otherwise walks on without
ever turning back for it, so a missed key stays missed (the credit of the pickup is then the
door's value, not diluted by second chances).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight import pytree
from hindsight.envs.base import Environment
from hindsight.policies.base import Policy

NOOP, LEFT, RIGHT, GRAB = range(4)
TAGS = ("move", "key", "apple", "door")
MOVE, KEY, APPLE, DOOR = range(4)


@pytree.dataclass
class KeyToDoorState:
  time: jax.Array  # int32 []
  done: jax.Array  # bool []
  pos: jax.Array  # int32 [] cell in the current phase's corridor
  has_key: jax.Array  # bool []
  key_pos: jax.Array  # int32 [] the key's cell in phase 1
  apple_values: jax.Array  # float32 [n_apples]
  door_open: jax.Array  # bool []


@pytree.dataclass
class KeyToDoorParams:
  door_reward: jax.Array  # float32 []
  apple_low: jax.Array  # float32 []
  apple_high: jax.Array  # float32 []


class KeyToDoor(Environment):
  """See the module docstring. Sizes are static (they shape the compiled rollout)."""

  name = "key_to_door"
  num_actions = 4
  null_action = NOOP
  tag_names = TAGS
  num_step_uniforms = 0  # deterministic dynamics: the only randomness is at reset

  def __init__(
    self,
    key_steps: int = 15,
    apple_steps: int = 90,
    door_steps: int = 15,
    corridor: int = 5,
    num_apples: int = 10,
    door_reward: float = 10.0,
  ):
    self.key_steps, self.apple_steps, self.door_steps = key_steps, apple_steps, door_steps
    self.corridor, self.num_apples = corridor, num_apples
    self.horizon = key_steps + apple_steps + door_steps
    self._door_reward = door_reward
    self.success_threshold = door_reward  # informational: success is the door (see success)

  def success(self, final_state: KeyToDoorState, episode_return) -> jax.Array:
    """The door was opened. (Apples alone can add up past the door's 10, so success is an
    event here, not a return level.)"""
    del episode_return
    return final_state.door_open

  def default_params(self) -> KeyToDoorParams:
    return KeyToDoorParams(
      door_reward=jnp.float32(self._door_reward),
      apple_low=jnp.float32(1.0),
      apple_high=jnp.float32(10.0),
    )

  def reset(self, key, params: KeyToDoorParams) -> KeyToDoorState:
    k_key, k_apple = jax.random.split(key)
    return KeyToDoorState(
      time=jnp.int32(0),
      done=jnp.bool_(False),
      pos=jnp.int32(0),
      has_key=jnp.bool_(False),
      # Never on the last cell: walking on from the key must leave it behind.
      key_pos=jax.random.randint(k_key, (), 1, self.corridor - 1),
      apple_values=jax.random.uniform(
        k_apple, (self.num_apples,), minval=params.apple_low, maxval=params.apple_high
      ),
      door_open=jnp.bool_(False),
    )

  def phase(self, time: jax.Array) -> jax.Array:
    """1, 2 or 3."""
    return 1 + (time >= self.key_steps) + (time >= self.key_steps + self.apple_steps)

  def apple_here(self, time: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(an apple passes at this step, its index)."""
    since = time - self.key_steps
    every = self.apple_steps // self.num_apples
    index = jnp.clip(since // every, 0, self.num_apples - 1)
    return (self.phase(time) == 2) & (since % every == 0) & (
      since // every < self.num_apples
    ), index

  def return_bounds(self, state: KeyToDoorState, params: KeyToDoorParams) -> jax.Array:
    """(0, the apples still to pass + the door unless opened): rewards are never negative."""
    every = self.apple_steps // self.num_apples
    apple_times = self.key_steps + every * jnp.arange(self.num_apples)
    apples = jnp.sum(jnp.where(apple_times >= state.time, state.apple_values, 0.0))
    door = jnp.where(state.door_open, 0.0, params.door_reward)
    return jnp.stack([jnp.float32(0.0), apples + door]).astype(jnp.float32)

  def _events(self, state: KeyToDoorState, action):
    """(takes_key, eats_apple, opens_door) for `action` in `state`."""
    phase = self.phase(state.time)
    grab = action == GRAB
    takes_key = grab & (phase == 1) & (state.pos == state.key_pos) & ~state.has_key
    eats_apple = grab & self.apple_here(state.time)[0]
    opens_door = grab & (phase == 3) & (state.pos == self.corridor - 1) & state.has_key
    return takes_key, eats_apple, opens_door

  def step(self, key, state: KeyToDoorState, action, params: KeyToDoorParams):
    del key  # deterministic transitions
    takes_key, eats_apple, opens_door = self._events(state, action)
    reward = (
      jnp.where(eats_apple, state.apple_values[self.apple_here(state.time)[1]], 0.0)
      + jnp.where(opens_door, params.door_reward, 0.0)
    ).astype(jnp.float32)
    move = jnp.where(action == LEFT, -1, jnp.where(action == RIGHT, 1, 0))
    pos = jnp.clip(state.pos + move, 0, self.corridor - 1)
    time = state.time + 1
    # A new phase starts at cell 0 of its own corridor.
    pos = jnp.where(self.phase(time) != self.phase(state.time), 0, pos)
    done = opens_door | (time >= self.horizon)
    next_state = state.replace(
      time=time,
      done=done,
      pos=pos,
      has_key=state.has_key | takes_key,
      door_open=state.door_open | opens_door,
    )
    return next_state, reward, done

  def observation(self, state: KeyToDoorState, params) -> jax.Array:
    """float32 [8]: phase one-hot, position, key held, key cell, apple here (its value)."""
    del params
    phase = self.phase(state.time)
    apple_here, here = self.apple_here(state.time)
    return jnp.concatenate(
      [
        jax.nn.one_hot(phase - 1, 3),
        jnp.stack(
          [
            state.pos / self.corridor,
            state.has_key.astype(jnp.float32),
            state.key_pos / self.corridor,
            apple_here.astype(jnp.float32),
            jnp.where(apple_here, state.apple_values[here], 0.0) / 10.0,
          ]
        ),
      ]
    ).astype(jnp.float32)

  def tag(self, state: KeyToDoorState, action, params) -> jax.Array:
    del params
    takes_key, eats_apple, opens_door = self._events(state, action)
    return jnp.select([takes_key, eats_apple, opens_door], [KEY, APPLE, DOOR], MOVE).astype(
      jnp.int32
    )

  def action_class(self, state: KeyToDoorState, action, params) -> jax.Array:
    """Content class for `policy_no_repeat`: the tag (taking the key is one class)."""
    return self.tag(state, action, params)


# Situations the behaviour policy tells apart, and its action distribution in each
# (noop, left, right, grab). Row ON_KEY's grab probability is p_key.
ON_KEY, BEFORE_KEY, PAST_KEY, ON_APPLE, NO_APPLE, AT_DOOR, TO_DOOR = range(7)
_DEFAULT_TABLE = (
  (0.0, 0.0, 0.0, 0.0),  # ON_KEY: grab with p_key, else walk on
  (0.1, 0.05, 0.8, 0.05),  # BEFORE_KEY: walk right towards the key
  (0.3, 0.0, 0.65, 0.05),  # PAST_KEY (or key held): never turns back for a missed key
  (0.2, 0.15, 0.15, 0.5),  # ON_APPLE: eat it half the time
  (0.5, 0.2, 0.2, 0.1),  # NO_APPLE: idle
  (0.1, 0.0, 0.0, 0.9),  # AT_DOOR with the key: open
  (0.1, 0.05, 0.8, 0.05),  # TO_DOOR: walk right
)


class KeyToDoorPolicy(Policy):
  """A noisy scripted policy; p_key = probability of grabbing when standing on the key."""

  name = "key_to_door_scripted"

  def __init__(self, env: KeyToDoor, p_key: float = 0.5):
    self.env, self.p_key = env, p_key

  def default_params(self) -> jax.Array:
    rest = 1.0 - self.p_key
    on_key = [0.0, 0.0, rest, self.p_key]  # noop, left, right, grab
    table = jnp.asarray(_DEFAULT_TABLE, jnp.float32)
    return table.at[ON_KEY].set(jnp.asarray(on_key, jnp.float32))

  def probs(self, params, state: KeyToDoorState, env_params) -> jax.Array:
    env = self.env
    phase = env.phase(state.time)
    situation = jnp.select(
      [
        (phase == 1) & ~state.has_key & (state.pos == state.key_pos),
        (phase == 1) & ~state.has_key & (state.pos < state.key_pos),
        phase == 1,
        env.apple_here(state.time)[0],
        phase == 2,
        (state.pos == env.corridor - 1) & state.has_key,
      ],
      [ON_KEY, BEFORE_KEY, PAST_KEY, ON_APPLE, NO_APPLE, AT_DOOR],
      TO_DOOR,
    )
    return params[situation]
