"""What an RL run trains: the environment, the learner pi_theta and its features.

The learner is a `NeuralPolicy` over the environment's observations. With `policy.prior`
it starts *as* the environment's scripted behaviour policy (its log-probabilities are the
logits' offset and the MLP's last layer starts at zero), so the environment's structure is there
at update 0: on `reasoning` the learner also reads its own competence c (`policy.latent`),
which raises restating, verifying and searching exactly as the scripted policy does, while
the trace a credit model or PRM sees never shows c. Decorative steps then co-occur with
success without causing it: a signal that can be fooled has something to fool it.

Someone else's environment (gymnax) declares a cap that can be far above its episodes'
lengths (Catch-bsuite: 1,000 steps for episodes of 9), and every update computes on the
padded horizon. With `horizon = 0` such a run fits it, as `hindsight label` does: the
longest of FIT_EPISODES episodes of the initial policy. The policy moves, so every
evaluation point also measures the share of its episodes the fitted horizon cuts
(`rl.measure`), and warns when there are any.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from hindsight.envs import make
from hindsight.envs.base import Environment
from hindsight.envs.families import family_of
from hindsight.envs.reasoning import Reasoning, competence_features
from hindsight.errors import HindsightError, note
from hindsight.labeling.rollout import episode_length
from hindsight.policies.neural import NeuralPolicy, observation_features

PyTree = Any
FIT_EPISODES = 1024  # episodes of the initial policy the horizon is fitted to
FIT_STREAM = 5  # their keys: fold_in(key(seed), FIT_STREAM), then the episode index


@dataclasses.dataclass
class Task:
  env: Environment
  env_params: PyTree
  policy: NeuralPolicy  # a seed's theta_0: policy.init_params(key)
  # With a fitted horizon: the environment at its declared one, whose episodes the
  # evaluation points measure to see what the fitted horizon cuts (else None).
  declared: Environment | None = None
  # Whether returns-to-go have known bounds (the environment's own, or return_range): without
  # them a tied step has no finite stderr.
  bounded: bool = True

  def per_step(self, fn, params, states) -> jax.Array:
    """fn(params, state, env_params) over states with leaves [E, T, ...] -> [E, T, ...]
    (the policy's logits at every step, under any parameters)."""
    f = jax.vmap(jax.vmap(fn, (None, 0, None)), (None, 0, None))
    return f(params, states, self.env_params)

  def step_tags(self, traj) -> jax.Array:
    """The environment's tag id of every step [E, H] of trajectories with leaves [E, H + 1,
    ...] (0 where it has no tags)."""
    states = jax.tree.map(lambda x: x[:, : self.env.horizon], traj.states)
    tag = jax.vmap(jax.vmap(self.env.tag, (0, 0, None)), (0, 0, None))
    return tag(states, traj.actions, self.env_params)

  def step_features(self, states) -> jax.Array:
    """x(s_t) [E, T, D]: the policy's features of states with leaves [E, T, ...] (what the
    policy, the critic and the credit heads read)."""
    f = jax.vmap(jax.vmap(self.policy.features, (0, None)), (0, None))
    return f(states, self.env_params)


def parse_return_range(text: str) -> tuple[float, float] | None:
  """config.return_range "LO:HI" -> (lo, hi); "" -> None (the environment's own bounds)."""
  if not text:
    return None
  lo, sep, hi = str(text).partition(":")
  try:
    if not sep:
      raise ValueError
    bounds = float(lo), float(hi)
  except ValueError:
    raise HindsightError(f"return_range must be LO:HI, got '{text}'") from None
  if not bounds[0] < bounds[1]:
    raise HindsightError(f"return_range {text}: LO must be below HI")
  return bounds


def _make(config: ConfigDict, family, horizon: int | None):
  spec, bounds = config.env, parse_return_range(config.return_range)
  if bounds is None:
    return make(spec, horizon=horizon)
  if "return_range" not in family.options:
    raise HindsightError(
      f"return_range: {spec} declares its own return bounds (only gymnax, Gymnasium and "
      "dm_env environments take one)"
    )
  return make(spec, horizon=horizon, return_range=bounds)


def make_task(config: ConfigDict) -> Task:
  family, given = family_of(config.env), int(config.horizon) or None
  env, scripted = _make(config, family, given)
  prior = bool(config.policy.prior)
  if prior and scripted.name == "uniform" and "policy" in family.options:
    note(f"policy.prior: {config.env} has no scripted policy, so the learner starts uniform "
         "(policy.prior=False says so and silences this)")  # fmt: skip
    prior = False
  latent = isinstance(env, Reasoning) and bool(config.policy.latent)

  def learner(env):
    features = competence_features(env) if latent else observation_features(env)
    return NeuralPolicy(env, hidden=tuple(config.policy.hidden),
                        prior=scripted if prior else None, features=features,
                        seed=int(config.seed))  # fmt: skip

  policy, declared = learner(env), None
  if given is None and family.fit_horizon:
    # Fitted once per process for a config's environment and theta_0 (an experiment
    # and load_policy make the task again).
    what = (config.env, config.return_range, tuple(config.policy.hidden), prior, int(config.seed))
    if what not in _FITTED:
      _FITTED[what] = _longest_episode(env, policy, int(config.seed))
    longest = _FITTED[what]
    if longest < env.horizon:
      note(f"{config.env}: horizon {longest}, the longest of {FIT_EPISODES} episodes of the "
           f"initial policy (the environment declares {env.horizon}; evaluation points say "
           "how many episodes it cuts; --config.horizon sets another)")  # fmt: skip
      declared = env
      env, scripted = _make(config, family, longest)
      policy = learner(env)
  bounded = "return_range" not in family.options or bool(config.return_range)
  return Task(env, env.default_params(), policy, declared, bounded)


_FITTED: dict[tuple, int] = {}


def _longest_episode(env: Environment, policy: NeuralPolicy, seed: int) -> int:
  """The longest of FIT_EPISODES episodes of theta_0 at the environment's horizon (no
  states kept: an episode costs only the steps it takes)."""
  theta0 = policy.default_params()
  params = env.default_params()
  root = jax.random.fold_in(jax.random.key(seed), FIT_STREAM)
  keys = jax.vmap(jax.random.fold_in, (None, 0))(root, jnp.arange(FIT_EPISODES))
  lengths = jax.jit(jax.vmap(lambda k: episode_length(env, policy, params, theta0, k)))(keys)
  return int(np.max(lengths))
