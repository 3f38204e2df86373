"""Per-step credit inside Tunix's GRPO learner: an `RLCluster` (actor, reference and rollout
roles on a mesh) and a `GRPOLearner` whose advantages come from a credit source.

Tunix's `GRPOLearner._generate_and_compute_advantage` samples the group through the
cluster's rollout worker, scores each completion with reward functions and spreads one
advantage per completion over its tokens. `CreditGRPOLearner` overrides it: the completions
and every Monte Carlo pool a source draws go through the cluster's rollout worker
(`engine_rollout.EngineRollout` here: one prefill per pool prefix), the source turns them into
a signal per step, and each step's signal lands on exactly that step's tokens
(`grpo.token_advantages`), an [B, C] advantage that Tunix's GRPO loss takes as it is:

    loss_ij = max(-A_ij r, -A_ij clip(r, 1 - eps, 1 + eps)) + beta KL_j(pi_theta || pi_0)

The reference log-probabilities come from the cluster's reference role and the update from
its actor trainer (Tunix's `rl.trainer.Trainer` with the loss `GRPOLearner` installs); the
rollout worker samples the actor's own module, so the next update samples the new weights.

`train_step` is one update, in the order `RLLearner.train` runs one global step (advantages,
`update_actor`, weight sync); `hindsight rl` drives it itself rather than through
`RLLearner.train`'s data queue, so that each update's prompts and keys come from the run's seed,
each seed is measured between updates, and a killed run resumes at its last checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo.grpo_learner import GRPOConfig, GRPOLearner, TrainExample
from tunix.rl.rollout import base_rollout

from hindsight.lm.rl.engine_rollout import EngineRollout, TunixTokenizer


class _NoHbmNoticeOnCpu(logging.Filter):
  """Tunix reports HBM use when it builds a cluster and warns, twice a cluster, that a CPU
  has none: noise on every seed of a CPU run."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "Skipping non-TPU device" not in record.getMessage()


logging.getLogger("absl").addFilter(_NoHbmNoticeOnCpu())

# What each update's log keeps of the aux Tunix's GRPO loss returns.
METRICS = ("kl", "pg_loss", "entropy", "pg_clipfrac")


def algo_config(grpo) -> GRPOConfig:
  """Tunix's GRPO settings of config node `grpo` (rl_text's)."""
  return GRPOConfig(num_generations=int(grpo.group), beta=float(grpo.beta),
                    epsilon=float(grpo.epsilon), kl_loss_mode=str(grpo.kl))  # fmt: skip


def optimizer(grpo) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(float(grpo.max_grad_norm)),
                     optax.adam(float(grpo.learning_rate)))  # fmt: skip


def make_cluster(lm, grpo, mesh=None) -> rl_cluster_lib.RLCluster:
  """An `RLCluster` for `lm` (actor and rollout from its state, the reference a copy of it)
  with the slot engine as rollout worker; every role on `mesh` (default: one device, axes
  (data, fsdp, tp) of size 1, `model.sharding.make_mesh`: a TPU slice or GPUs are a mesh
  away)."""
  from hindsight.model.sharding import make_mesh, state_shardings

  if mesh is None:
    mesh = make_mesh(1, 1, jax.devices()[:1])
  roles = rl_cluster_lib.Role
  training = rl_cluster_lib.RLTrainingConfig(
    actor_optimizer=optimizer(grpo), eval_every_n_steps=10**9, pbar_description=None,
  )  # fmt: skip
  rollout = base_rollout.RolloutConfig(
    max_tokens_to_generate=int(grpo.max_tokens), temperature=float(grpo.temperature),
    max_prompt_length=int(lm.cfg.max_len), kv_cache_size=int(lm.cfg.max_len),
  )  # fmt: skip
  cluster = rl_cluster_lib.ClusterConfig(
    role_to_mesh={roles.ACTOR: mesh, roles.REFERENCE: mesh, roles.ROLLOUT: mesh},
    rollout_engine=functools.partial(EngineRollout, cfg=lm.cfg,
                                     temperature=float(grpo.temperature)),
    training_config=training, rollout_config=rollout,
  )  # fmt: skip
  # The weights placed on the mesh first (each array cut as its own axes say, where the mesh
  # has them), so Tunix finds them there and does not reshard.
  abstract = nnx.state(nnx.eval_shape(lambda: nnx.merge(lm.graphdef, lm.state)))
  shardings = state_shardings(abstract, mesh, specs=nnx.get_partition_spec(abstract))
  with mesh:
    actor = nnx.merge(lm.graphdef, jax.device_put(lm.state, shardings))
    reference = nnx.merge(lm.graphdef, jax.device_put(jax.tree.map(jnp.copy, lm.state),
                                                      shardings))  # fmt: skip
  return rl_cluster_lib.RLCluster(actor=actor, reference=reference,
                                  tokenizer=TunixTokenizer(lm.tokenizer, lm.cfg),
                                  cluster_config=cluster)  # fmt: skip


@dataclasses.dataclass
class Batch:
  """What one update's `make_batch` returns: Tunix's arrays (`grpo.batch_arrays`: prompt ids
  [B, P], completion ids [B, C], completion mask [B, C], advantages [B, C]) and whatever the
  caller logs (the rollouts and the source's signal)."""

  arrays: dict
  info: object = None


def _no_reward(prompts, completions, **_):
  """Tunix asks for a reward function; the advantages here come from the credit source."""
  return [0.0] * len(completions)


class CreditGRPOLearner(GRPOLearner):
  """Tunix's GRPO learner with advantages from `make_batch(training_input, state) -> Batch`
  (module docstring): `state` is the parameters the cluster's rollout worker (`rollout`)
  samples from now."""

  def __init__(self, cluster, algo: GRPOConfig, make_batch):
    super().__init__(rl_cluster=cluster, algo_config=algo, reward_fns=[_no_reward])
    cluster.actor_trainer.with_rl_metrics_to_log({name: np.mean for name in METRICS})
    self.make_batch = make_batch
    self.last: Batch | None = None

  @property
  def rollout(self) -> EngineRollout:
    return self.rl_cluster.rollout

  def _generate_and_compute_advantage(self, training_input, mode=rl_cluster_lib.Mode.TRAIN):
    worker = self.rollout
    batch = self.make_batch(training_input, worker.state)
    a = {k: jnp.asarray(v) for k, v in batch.arrays.items()}
    pad, eos = worker.pad_id(), worker.eos_id()
    ref = None
    if self.algo_config.beta != 0.0:
      ref = self.rl_cluster.get_ref_per_token_logps(
        prompt_tokens=a["prompt_ids"], completion_tokens=a["completion_ids"], pad_id=pad,
        eos_id=eos,
      )  # fmt: skip
    self.last = batch
    return TrainExample(
      prompt_ids=a["prompt_ids"], prompt_mask=a["prompt_ids"] != pad,
      completion_ids=a["completion_ids"], completion_mask=a["completion_mask"],
      advantages=a["advantages"], ref_per_token_logps=ref, old_per_token_logps=None,
    )  # fmt: skip

  def train_step(self, training_input) -> tuple[Batch, dict]:
    """One update (module docstring): (the batch, the step's loss and METRICS)."""
    example = self._generate_and_compute_advantage(training_input)
    trainer = self.rl_cluster.actor_trainer
    self.rl_cluster.update_actor([example], None, False)
    self._sync()
    # Tunix writes a step's metrics to its logger one step late; the step's own buffer is
    # what it keeps in between.
    step = trainer._prev_buffered_train_metrics
    aux = {"loss": float(np.asarray(step.loss))}
    for name in METRICS:
      aux[name] = float(np.mean(np.asarray(step.additional_metrics[name][0])))
    return self.last, aux

  def _sync(self) -> None:
    """The rollout worker's weights brought to the actor's (`RLLearner.train`'s rule: a
    worker that shares the actor's module needs none), and Tunix's global step counted."""
    if self.should_sync_weights:
      self.rl_cluster.sync_weights()
    else:
      self.rl_cluster.global_steps += 1

  # -- the policy's parameters and optimizer state, for the run's own checkpoints ------------

  def parts(self) -> nnx.State:
    t = self.rl_cluster.actor_trainer
    return nnx.state({"model": t.model, "optimizer": t.optimizer})

  def load(self, parts: nnx.State, updates: int) -> None:
    """Restores `parts` (as `parts()` wrote them after `updates` updates) into the actor, the
    rollout worker's weights and Tunix's global step with it."""
    t = self.rl_cluster.actor_trainer
    nnx.update({"model": t.model, "optimizer": t.optimizer}, parts)
    if self.should_sync_weights:
      self.rl_cluster.sync_weights()
    self.rl_cluster.global_steps = int(updates)
