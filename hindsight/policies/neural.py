"""A learnable policy the labeler branches like any other: pi_theta(a | s) from a flax.nnx MLP.

  logits_theta(s) = f_theta(x(s)) + log pi_0(a | s)        (log pi_0 = 0 without a prior)
  pi_theta(. | s) = softmax(logits_theta(s)) on the legal actions

x(s) are the policy's features of the full state (`features`, default the environment's
observation), f_theta an MLP whose last layer starts at zero, and pi_0 an optional prior
policy (a scripted `Policy`). So at initialisation pi_theta *is* the prior: a credit model
trained on the prior's labels describes the initial learner exactly, and RL starts from
the behaviour the environment's docstring documents.

The parameters are an `nnx.State` (a pytree of arrays): `probs(params, state, env_params)` is
a pure function of them, so the labeler's jitted rollouts can take the parameters of the
current update as an argument (`Labeler.label_under`) and an RL update can differentiate
`log_probs` through them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hindsight.policies.base import Policy

PyTree = Any
# Logit of an illegal (or prior-impossible) action: exp underflows to exactly 0 in float32,
# and unlike -inf it keeps p log p = 0 finite in the entropy.
_IMPOSSIBLE = -1e9


class MLP(nnx.Module):
  """x float [D] -> float [out]: tanh hidden layers (orthogonal init, as PPO's), a last
  layer initialised at `last_scale` (0: the output starts at exactly zero)."""

  def __init__(self, d_in: int, hidden: Sequence[int], d_out: int, last_scale: float, rngs):
    sizes = [d_in, *hidden]
    self.hidden = nnx.List(
      [
        nnx.Linear(a, b, kernel_init=nnx.initializers.orthogonal(jnp.sqrt(2.0)), rngs=rngs)
        for a, b in itertools.pairwise(sizes)
      ]
    )
    init = (
      nnx.initializers.zeros_init() if last_scale == 0 else nnx.initializers.orthogonal(last_scale)
    )
    self.out = nnx.Linear(sizes[-1], d_out, kernel_init=init, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    for layer in self.hidden:
      x = jnp.tanh(layer(x))
    return self.out(x)


def observation_features(env) -> Callable:
  """x(s) = the environment's observation (float [D]; a discrete id is one-hot)."""

  def features(state, env_params):
    obs = env.observation(state, env_params)
    if jnp.issubdtype(obs.dtype, jnp.integer) and obs.ndim == 0:
      return jax.nn.one_hot(obs, env.num_states, dtype=jnp.float32)
    return jnp.asarray(obs, jnp.float32).reshape(-1)

  return features


class NeuralPolicy(Policy):
  """pi_theta (module docstring). `default_params()` is theta_0 drawn from `seed`.

  env: the environment (its legal actions, and the default features): any functional
    environment, read by `envs.base.Environment`'s interface (policies sit below the
    environments, which build their scripted ones on `policies.base`).
  hidden: the MLP's hidden widths.
  prior, prior_params: pi_0, or None (then pi_theta starts uniform over the legal actions).
  features: x(state, env_params) -> float [D] (default `observation_features(env)`); a
    policy may read latents the observations leave out (`reasoning`'s competence).
  """

  name = "neural"

  def __init__(
    self,
    env,
    hidden: Sequence[int] = (64, 64),
    prior: Policy | None = None,
    prior_params: PyTree | None = None,
    features: Callable | None = None,
    seed: int = 0,
  ):
    self.env, self.prior = env, prior
    self.prior_params = (
      prior.default_params() if prior is not None and prior_params is None else prior_params
    )
    self.features = features or observation_features(env)
    params = env.default_params()
    example = jax.eval_shape(
      lambda k: self.features(env.reset(k, params), params), jax.random.key(0)
    )
    self.feature_dim = int(example.shape[-1])
    self.hidden = tuple(int(h) for h in hidden)
    self.graphdef, self._theta0 = nnx.split(self._net(nnx.Rngs(params=seed)))

  def _net(self, rngs: nnx.Rngs) -> MLP:
    return MLP(self.feature_dim, self.hidden, self.env.num_actions, 0.0, rngs)

  def default_params(self) -> nnx.State:
    return self._theta0

  def init_params(self, key: jax.Array) -> nnx.State:
    """A theta_0 drawn from `key` (an RL seed's): the hidden layers from the key, the last
    layer 0, so every draw starts as the prior too."""
    return nnx.state(self._net(nnx.Rngs(params=key)))

  def logits(self, params: nnx.State, state, env_params) -> jax.Array:
    """float [A]: logits_theta(s) (module docstring), _IMPOSSIBLE on illegal actions."""
    z = nnx.merge(self.graphdef, params)(self.features(state, env_params))
    possible = self.env.legal_actions(state, env_params)
    if self.prior is not None:
      p0 = self.prior.probs(self.prior_params, state, env_params)
      possible &= p0 > 0
      z = z + jnp.log(jnp.where(p0 > 0, p0, 1.0))
    return jnp.where(possible, z, _IMPOSSIBLE)

  def probs(self, params, state, env_params) -> jax.Array:
    return jax.nn.softmax(self.logits(params, state, env_params))


def critic(env_or_dim: int, hidden: Sequence[int] = (64, 64), seed: int = 0):
  """(graphdef, state) of a value MLP V(x) -> float [] over `env_or_dim` features (PPO's
  critic for the `gae` credit source); its last layer starts at scale 1."""
  net = MLP(int(env_or_dim), tuple(hidden), 1, 1.0, nnx.Rngs(params=seed))
  return nnx.split(net)
