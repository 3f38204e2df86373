"""Credit as a variance reducer around the outcome: sources built on a small ensemble of
per-action credit heads f_m(x(s)) in R^A (m = 1..M, `head.members`), MLPs over the policy's
own features, fitted by regression on interventional credit labels of the initial policy
(`head.episodes` episodes at K = `head.rollouts`, charged to the run):

  f_m(x(s_t))[a_t] ~ credit_t = Q(s_t, a_t) - E_{a ~ q} Q(s_t, a)   (q = pi: A^pi(s_t, a_t))

with f = mean_m f_m and sigma_f = std_m f_m, the ensemble's disagreement (Lakshminarayanan
et al. 2017; as reward-model ensembles, Coste et al. 2023, Eisenstein et al. 2023).

  credit_cv      A_t = (R - mean_batch R) - f(s_t, a_t),  plus the analytic term
                 sum_a pi_theta(a | s_t) f(s_t, a) in the loss (Q-Prop, Gu et al. 2017):
                 unbiased whatever f is, so a stale head costs variance, never direction
  credit_cv_current  the same, with each seed's heads audited at every evaluation point
                 on head.refresh_episodes fresh episodes at K = head.refresh_rollouts
                 (charged) and refit on them when they drift (`rl.refresh`)
  anchored       A_t = (R - mean_batch R) + head.beta x f(s_t, a_t): biased by beta x the
                 head's error, bounded by the outcome term it rides on
  credit_gated   A_t = f(s_t, a_t) where sigma_f(s_t, a_t) <= head.gate, else R - mean R:
                 learned credit on the head's support, the outcome off it (biased)

docs/rl.md derives which of these keep the policy gradient unbiased.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from ml_collections import ConfigDict

from hindsight.errors import HindsightError
from hindsight.policies.neural import MLP
from hindsight.rl.sources.base import (
  ConfigNode,
  CreditSource,
  Terms,
  register_config_node,
  register_source,
)
from hindsight.rl.sources.learned import initial_labels
from hindsight.rl.sources.refresh import Refreshing

# the heads' labels (initial_labels' seed offset); + 1: the fit's minibatches, + 2: bootstrap
_HEAD_STREAM = 15485863


def _head_config() -> ConfigDict:
  """credit_cv, credit_cv_current, anchored, credit_gated: an ensemble of per-action credit
  heads over the policy's features, fitted on labels of the initial policy (charged)."""
  c = ConfigDict()
  c.episodes = 128  # episodes of the initial policy labeled for the heads
  c.rollouts = 8  # their K
  c.members = 4  # ensemble size (its std is credit_gated's uncertainty)
  c.hidden = (64, 64)
  c.steps = 1000  # Adam steps (minibatches of 256 steps, bootstrap weights per member)
  c.learning_rate = 1e-3
  c.beta = 1.0  # anchored: A = R - b + beta f(s, a)
  c.gate = 0.05  # credit_gated: ensemble std above which a step takes R - b
  # credit_cv_current: each audit labels this many fresh episodes of the current policy at
  # this K and refits the heads on them (refresh.steps Adam steps) when the test fires
  c.refresh_episodes = 32
  c.refresh_rollouts = 8
  return c


def _check_head(c: ConfigDict) -> None:
  if int(c.head.members) < 1 or int(c.head.episodes) < 1 or int(c.head.steps) < 1:
    raise HindsightError("head.members, head.episodes and head.steps must be >= 1")
  if min(c.head.rollouts, c.head.refresh_rollouts) < 2:
    raise HindsightError("head.rollouts and head.refresh_rollouts must be >= 2")
  if int(c.head.refresh_episodes) < 1:
    raise HindsightError(f"head.refresh_episodes must be >= 1, got {c.head.refresh_episodes}")


register_config_node(
  ConfigNode(
    "head",
    _head_config,
    smoke={"episodes": 16, "rollouts": 4, "members": 2, "hidden": (16,), "steps": 20,
           "refresh_episodes": 8, "refresh_rollouts": 4},
    check=_check_head,
  )
)  # fmt: skip


def init_heads(dim: int, num_actions: int, head: ConfigDict, seed: int):
  """(graphdef, stacked state [M]) of M = head.members fresh heads, each with its own init."""
  make = lambda k: MLP(dim, tuple(head.hidden), num_actions, 1.0, nnx.Rngs(params=k))  # noqa: E731
  states = [nnx.state(make(1000 * seed + m)) for m in range(int(head.members))]
  return nnx.graphdef(make(0)), jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def head_fitter(graphdef, learning_rate: float, steps: int):
  """fit(state [M], x [N, D], actions [N], y [N], w [M, N], n, key) -> state [M]: `steps`
  Adam steps from `state` on the bootstrap-weighted squared error of every member m,

       L_m = sum_i w_mi (f_m(x_i)[a_i] - y_i)^2 / sum_i w_mi,

  over the first n rows (the rest is padding, so audits of different sizes share one
  compiled program); minibatches of 256 rows. w are each member's bootstrap weights
  (Poisson(1)) and its init is its own, so members disagree where data is thin."""
  tx = optax.adam(learning_rate)

  def member_loss(params, x, a, y, w, rows):
    pred = jnp.take_along_axis(nnx.merge(graphdef, params)(x[rows]), a[rows, None], -1)
    return jnp.sum(w[rows] * jnp.square(pred[:, 0] - y[rows])) / jnp.maximum(w[rows].sum(), 1e-6)

  @jax.jit
  def fit(state, x, a, y, w, n, key):
    members, batch = w.shape[0], min(256, x.shape[0])

    def step(carry, k):
      params, opt = carry
      rows = jax.random.randint(k, (members, batch), 0, n)
      grads = jax.vmap(jax.grad(member_loss), (0, None, None, None, 0, 0))(params, x, a, y, w, rows)
      updates, opt = jax.vmap(tx.update)(grads, opt, params)
      return (optax.apply_updates(params, updates), opt), None

    keys = jax.random.split(key, steps)
    return jax.lax.scan(step, (state, jax.vmap(tx.init)(state)), keys)[0][0]

  return fit


class _Heads(CreditSource):
  """The ensemble of the module docstring: prepared once, read inside the update's jit."""

  def prepare(self, progress: bool = False) -> None:
    del progress
    task, config = self.task, self.config
    head, seed = config.head, int(config.seed)
    traj, labels, self.setup_steps = initial_labels(
      task, config, int(head.rollouts), seed_offset=_HEAD_STREAM, episodes=int(head.episodes)
    )
    rows = self.rows(traj, labels)
    self.graphdef, state = init_heads(rows[0].shape[-1], task.env.num_actions, head, seed)
    lr = float(head.learning_rate)
    fit = head_fitter(self.graphdef, lr, int(head.steps))
    self.aux = fit(state, *rows, jax.random.fold_in(jax.random.key(seed), _HEAD_STREAM + 1))

  def rows(self, traj, labels, key: jax.Array | None = None):
    """(x [N, D], actions [N], y [N], w [M, N], n): the labeled steps of `traj` as the heads'
    training rows, the n valid ones first and padding after (N = episodes x horizon), and
    each member's Poisson(1) bootstrap weights (from `key`, else the run's seed)."""
    H, members = self.task.env.horizon, int(self.config.head.members)
    states = jax.tree.map(lambda s: s[:, :H], traj.states)
    x = np.asarray(self.task.step_features(states)).reshape(traj.mask.size, -1)
    credit = np.asarray(labels["credit"]).reshape(-1)
    ok = np.asarray(traj.mask).reshape(-1) & np.isfinite(credit)
    order = np.argsort(~ok, kind="stable")  # valid rows first
    a = np.asarray(traj.actions).reshape(-1)[order]
    y = np.where(ok, credit, 0.0)[order]
    if key is None:
      key = jax.random.fold_in(jax.random.key(int(self.config.seed)), _HEAD_STREAM + 2)
    w = jax.random.poisson(key, 1.0, (members, y.size)).astype(jnp.float32)
    w = jnp.where(jnp.arange(y.size) < ok.sum(), w, 0.0)
    return (jnp.asarray(x[order], jnp.float32), jnp.asarray(a), jnp.asarray(y, jnp.float32), w,
            jnp.int32(ok.sum()))  # fmt: skip

  def heads(self, aux, traj) -> jax.Array:
    """f_m(x(s_t)) [M, E, H, A] of every member at the sampled episodes' steps."""
    H = self.task.env.horizon
    x = self.task.step_features(jax.tree.map(lambda s: s[:, :H], traj.states))
    apply = lambda p: nnx.merge(self.graphdef, p)(x)  # noqa: E731
    return jax.vmap(apply)(aux)

  def taken(self, aux, traj) -> tuple[jax.Array, jax.Array]:
    """(f, sigma_f) [E, H] at the taken actions: the members' mean and std."""
    f = jnp.take_along_axis(self.heads(aux, traj), traj.actions[None, ..., None], -1)[..., 0]
    return f.mean(0), f.std(0)

  def credit_prediction(self):
    return lambda aux, traj, batch: self.taken(aux, traj)[0]

  def signal(self, aux, policy_params, traj, key):
    del policy_params, key
    R = traj.rewards.sum(-1)
    outcome = jnp.broadcast_to((R - R.mean())[:, None], traj.mask.shape)
    a = self.advantage(outcome, *self.taken(aux, traj))
    return jnp.where(traj.mask, a, 0.0), self.no_steps()

  def advantage(self, outcome, f, sigma) -> jax.Array:
    """A_t [E, H] from the centred outcome R - mean_batch R, f and sigma_f at the taken
    actions (module docstring)."""
    raise NotImplementedError


@register_source
class CreditCv(_Heads):
  """Q-Prop: A_t = R - b - f(s_t, a_t), and the action values enter the loss through their
  expectation under pi_theta, whose gradient is sum_a grad pi(a | s) f(s, a): the sampled
  term corrects their bias, so the gradient is unbiased whatever f is."""

  name = "credit_cv"
  summary = "Q-Prop: R - b - f(s, a) plus E_pi f(s, .), f a per-action credit head (unbiased)"
  unbiased = True

  def advantage(self, outcome, f, sigma):
    return outcome - f

  def action_values(self, aux, traj) -> jax.Array:
    """f(s_t, .) [E, H, A]: the members' mean at every action."""
    return self.heads(aux, traj).mean(0)

  def terms(self, aux, state, policy_params, traj, key) -> Terms:
    advantages, steps = self.signal(aux, policy_params, traj, key)
    return Terms(advantages, steps, {"action_values": self.action_values(aux, traj)})

  def loss(self, state, logits, batch, scale):
    """Q-Prop's analytic term, -mean_t sum_a pi_theta(a | s_t) f(s_t, a) / sigma: f in the
    advantages' units (`scale` = 1 / sigma)."""
    del state
    mask = batch["mask"]
    f = jnp.where(mask[..., None], batch["action_values"] * scale, 0.0)
    expected = jnp.sum(jax.nn.softmax(logits) * f, -1)
    return -(jnp.sum(expected * mask) / jnp.maximum(mask.sum(), 1))


@register_source
class CreditCvCurrent(Refreshing, CreditCv):
  name = "credit_cv_current"
  summary = "credit_cv with its heads audited along training and refit on fresh labels"

  def audit_size(self) -> tuple[int, int]:
    head = self.config.head
    return int(head.refresh_episodes), int(head.refresh_rollouts)

  def prepare(self, progress: bool = False) -> None:
    super().prepare(progress)
    lr, steps = float(self.config.head.learning_rate), int(self.config.refresh.steps)
    self._refit = head_fitter(self.graphdef, lr, steps)

  def refit(self, model_state, traj, labels, batch, seed: int):
    del batch
    rows = self.rows(traj, labels, jax.random.fold_in(jax.random.key(seed), 1))
    return self._refit(model_state, *rows, jax.random.key(seed))


@register_source
class Anchored(_Heads):
  name = "anchored"
  summary = "R - b + head.beta x f(s, a): the outcome with learned credit added (biased)"

  def advantage(self, outcome, f, sigma):
    return outcome + float(self.config.head.beta) * f


@register_source
class CreditGated(_Heads):
  name = "credit_gated"
  summary = "f(s, a) where the heads agree (std <= head.gate), else R - b (biased)"

  def advantage(self, outcome, f, sigma):
    return jnp.where(sigma <= float(self.config.head.gate), f, outcome)
