"""One compiled program for a chunk of policy updates, in the purejaxrl shape.

Per seed, one update is
  1. roll E episodes of pi_theta (`labeling.rollout.sample_episode`, padded to H);
  2. the credit source's terms (`CreditSource.terms`): the per-step signal A_t, what it
     spent, and any per-step data its own loss term reads;
  3. advantages standardised over the batch's valid steps (`ppo.normalize`): A_t -> (A_t - m)
     / sigma (the source's loss gets 1 / sigma, to put terms in advantage units alike);
  4. `ppo.epochs` passes of `ppo.minibatches` minibatches (episodes shuffled) of
       L = clipped surrogate (rlax.clipped_surrogate_pg_loss, on the valid steps)
           - entropy_coef x entropy (rlax.entropy_loss)
           [+ the source's own term, `CreditSource.loss`: GAE's critic regression, Q-Prop's
              analytic term, a KL to theta_0]
     with Adam and global-norm clipping (optax) over the policy's parameters and the
     source's trainable ones (`CreditSource.init`: a critic);
  5. metrics of the batch: success rate, mean length, mean return, the share of each tag
     among the valid steps, and the env steps spent (policy rollouts, credit: int32 per
     update, summed on the host, where no int32 overflows).
`chunk(state, aux, n)` scans n updates and vmaps the scan over seeds: state leaves and aux
leaves carry a leading seed axis. aux is an argument, so a new credit model (same shapes)
runs through the same compiled program.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
import rlax
from flax import struct
from ml_collections import ConfigDict

from hindsight.labeling.rollout import sample_episode
from hindsight.rl.sources import CreditSource

PyTree = Any


@struct.dataclass
class TrainState:
  """One seed's learner (a leading seed axis when stacked)."""

  params: PyTree  # theta (nnx.State)
  source_params: PyTree  # the source's trainable state (`CreditSource.init`: a critic), or None
  source_fixed: PyTree  # the source's fixed state (theta_0 of a trust region), or None
  opt_state: PyTree
  key: jax.Array  # the next update's key
  update: jax.Array  # int32 [] updates done


def optimizer(config: ConfigDict) -> optax.GradientTransformation:
  return optax.chain(
    optax.clip_by_global_norm(config.ppo.max_grad_norm), optax.adam(config.ppo.learning_rate)
  )


class Programs:
  """The update of one (task, source, config) and its chunk program."""

  def __init__(self, source: CreditSource, config: ConfigDict):
    self.source, self.config, self.task = source, config, source.task
    self.tx = optimizer(config)
    # One device, stated: a credit model fitted on a mesh would otherwise hand its
    # shardings to the outputs, and the next call (new input shardings) would recompile.
    self.device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    self.chunk = jax.jit(self._chunk, static_argnums=2, donate_argnums=0, out_shardings=self.device)

  def place(self, tree):
    """Puts a pytree (a train state, a source's aux) where the chunk program keeps it."""
    return jax.device_put(tree, self.device)

  # -- state ------------------------------------------------------------------------------

  def init(self, seed_keys: jax.Array) -> TrainState:
    """Stacked train states of the seeds whose root keys are `seed_keys` [S]."""

    def one(key):
      params = self.task.policy.init_params(jax.random.fold_in(key, 0))
      trainable, fixed = self.source.init(params)
      return TrainState(
        params=params,
        source_params=trainable,
        source_fixed=fixed,
        opt_state=self.tx.init((params, trainable)),
        key=jax.random.fold_in(key, 1),
        update=jnp.int32(0),
      )

    return jax.vmap(one)(seed_keys)

  # -- pieces ---------------------------------------------------------------------------

  def _loss(self, trained, batch, fixed, scale):
    """The minibatch's loss (module docstring) of trained = (theta, the source's trainable
    state)."""
    params, source_params = trained
    cfg = self.config.ppo
    task, mask = self.task, batch["mask"]
    logits = task.per_step(task.policy.logits, params, batch["states"])  # [m, H, A]
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), batch["actions"][..., None], -1)
    ratio = jnp.exp(logp[..., 0] - batch["old_logp"])
    n, valid = mask.size, jnp.maximum(mask.sum(), 1)
    adv = jnp.where(mask, batch["advantages"], 0.0)
    # rlax averages over every position; padding contributes 0 (its advantage is 0), so
    # n / valid turns that into the mean over the valid steps.
    pg = rlax.clipped_surrogate_pg_loss(ratio.reshape(-1), adv.reshape(-1), cfg.clip) * n / valid
    w = mask.reshape(-1).astype(jnp.float32)
    entropy_term = rlax.entropy_loss(logits.reshape(-1, logits.shape[-1]), w) * n / valid
    loss = pg + cfg.entropy * entropy_term
    own = self.source.loss((source_params, fixed), logits, batch, scale)
    return loss if own is None else loss + own

  # -- one update -------------------------------------------------------------------------

  def update(self, ts: TrainState, aux) -> tuple[TrainState, dict]:
    cfg, task = self.config.ppo, self.task
    E, H = int(cfg.episodes), task.env.horizon
    key, k_roll, k_credit, k_shuffle = jax.random.split(ts.key, 4)
    keys = jax.random.split(k_roll, E)
    sample = functools.partial(sample_episode, task.env, task.policy, task.env_params)
    traj = jax.vmap(sample, (None, 0))(ts.params, keys)
    states = jax.tree.map(lambda x: x[:, :H], traj.states)
    state = (ts.source_params, ts.source_fixed)
    terms = self.source.terms(aux, state, ts.params, traj, k_credit)
    adv, credit_steps = terms.advantages, terms.credit_steps
    mask = traj.mask
    scale = jnp.ones(())
    if cfg.normalize:
      valid = jnp.maximum(mask.sum(), 1)
      mean = jnp.sum(adv * mask) / valid
      std = jnp.sqrt(jnp.sum(jnp.square(adv - mean) * mask) / valid)
      scale = 1.0 / (std + 1e-8)
      adv = jnp.where(mask, (adv - mean) * scale, 0.0)
    logits = task.per_step(task.policy.logits, ts.params, states)
    old_logp = jnp.take_along_axis(jax.nn.log_softmax(logits), traj.actions[..., None], -1)
    data = {
      "states": states,
      "actions": traj.actions,
      "mask": mask,
      "advantages": adv,
      "old_logp": old_logp[..., 0],
      **terms.data,
    }
    M = int(cfg.minibatches)

    def minibatch(carry, rows):
      trained, opt_state = carry
      batch = jax.tree.map(lambda x: x[rows], data)
      loss, grads = jax.value_and_grad(self._loss)(trained, batch, ts.source_fixed, scale)
      updates, opt_state = self.tx.update(grads, opt_state, trained)
      return (optax.apply_updates(trained, updates), opt_state), loss

    def epoch(carry, k):
      rows = jax.random.permutation(k, E).reshape(M, E // M)
      return jax.lax.scan(minibatch, carry, rows)

    (trained, opt_state), losses = jax.lax.scan(
      epoch, ((ts.params, ts.source_params), ts.opt_state), jax.random.split(k_shuffle, cfg.epochs)
    )
    policy_steps = mask.sum().astype(jnp.int32)
    tags = task.step_tags(traj)
    n_tags = max(len(task.env.tag_names), 1)
    tag_share = (jax.nn.one_hot(tags, n_tags) * mask[..., None]).sum((0, 1)) / jnp.maximum(
      mask.sum(), 1
    )
    metrics = {
      "success": traj.success.astype(jnp.float32).mean(),
      "length": mask.sum(-1).astype(jnp.float32).mean(),
      "return": traj.rewards.sum(-1).mean(),
      "tag_share": tag_share,
      "loss": losses.mean(),
      "policy_steps": policy_steps,
      "credit_steps": credit_steps,
      "record": terms.record,  # for the source, between chunks
    }
    new = ts.replace(
      params=trained[0],
      source_params=trained[1],
      opt_state=opt_state,
      key=key,
      update=ts.update + 1,
    )
    return new, metrics

  def _chunk(self, ts: TrainState, aux, n: int):
    """n updates of every seed: (state, metrics with leaves [S, n, ...])."""

    def run(ts, aux):
      return jax.lax.scan(lambda t, _: self.update(t, aux), ts, length=n)

    return jax.vmap(run)(ts, aux)
