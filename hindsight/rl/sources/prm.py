"""A learned process reward model as a source:

prm   A_t = p_t - p_{t-1}, p_t = PRM(h_<=t) = P(success | history), a causal history model
      trained by cross-entropy on the outcomes of the initial policy's episodes
      (`drift.baselines`); charged those episodes' steps
shaped A_t = R - p_{t-1}: the same PRM as a potential (Ng et al. 1999). With
      F_t = p_t - p_{t-1} added to every reward, the return from t becomes R - p_{t-1} (the
      potential of the terminal history is 0), and p_{t-1} reads nothing of a_t: a
      baseline, so the policy gradient stays unbiased however wrong the PRM is
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.drift.baselines import BaselineConfig, prm_increments, train_history_model
from hindsight.labeling.engine import Labeler, episode_key
from hindsight.labeling.trajectories import batch_spec, trajectory_batch
from hindsight.model.credit_model import ModelConfig
from hindsight.rl.sources.base import CreditSource, label_config, register_source


@register_source
class Prm(CreditSource):
  name = "prm"
  summary = "a learned process reward model's increments P(success | h<=t) - P(.. | h<t)"

  def prepare(self, progress: bool = False) -> None:
    task, config = self.task, self.config
    # Outcomes of the initial policy's episodes only: a PRM never sees a credit label.
    labeler = Labeler(task.env, task.policy, label_config(config, 2))
    n = int(config.credit.model_episodes)
    keys = jax.vmap(episode_key, (None, 0))(config.seed + 7919, jnp.arange(n))
    traj = labeler.sample(keys)
    batch = jax.tree.map(np.asarray, trajectory_batch(task.env, traj))
    spec = batch_spec(task.env, batch)
    model_cfg = ModelConfig(width=int(config.credit.model_width), depth=1, num_heads=2)
    rng = np.random.default_rng(config.seed)
    rows = [rng.integers(0, n, 32) for _ in range(int(config.credit.model_steps))]
    self.graphdef, self.aux = train_history_model(
      "prm",
      lambda i: {k: v[rows[i]] for k, v in batch.items()},
      spec,
      model_cfg,
      BaselineConfig(steps=int(config.credit.model_steps), seed=config.seed),
      return_scale=1.0,
      progress=progress,
    )
    self.base = float(batch["success"].mean())
    self.setup_steps = int(batch["mask"].sum())

  def logits(self, aux, traj, batch=None) -> jax.Array:
    """logit P(success | h_<=t) [E, H] of the sampled episodes (`batch`: their
    `trajectory_batch`, when the caller has it)."""
    batch = trajectory_batch(self.task.env, traj) if batch is None else batch
    return nnx.merge(self.graphdef, aux)(batch)

  def signal(self, aux, policy_params, traj, key):
    del policy_params, key
    return prm_increments(self.logits(aux, traj), traj.mask, self.base), self.no_steps()

  def credit_prediction(self):
    return lambda aux, traj, batch: prm_increments(
      self.logits(aux, traj, batch), traj.mask, self.base
    )


@register_source
class Shaped(Prm):
  name = "shaped"
  summary = "R - PRM(h<t): the PRM as a shaping potential, i.e. a baseline (unbiased)"
  unbiased = True

  def signal(self, aux, policy_params, traj, key):
    del policy_params, key
    p = jax.nn.sigmoid(self.logits(aux, traj))  # p_t = P(success | h_<=t)
    before = jnp.concatenate([jnp.full((p.shape[0], 1), self.base, p.dtype), p[:, :-1]], 1)
    R = traj.rewards.sum(-1)[:, None]
    return jnp.where(traj.mask, R - before, 0.0), self.no_steps()
