"""A learned process reward model as a source:

prm   A_t = p_t - p_{t-1}, p_t = PRM(h_<=t) = P(success | history), a causal history model
      trained by cross-entropy on the outcomes of the initial policy's episodes
      (`drift.baselines`); charged those episodes' steps
shaped A_t = R - p_{t-1}: the same PRM as a potential (Ng et al. 1999). With
      F_t = p_t - p_{t-1} added to every reward, the return from t becomes R - p_{t-1} (the
      potential of the terminal history is 0), and p_{t-1} reads nothing of a_t: a
      baseline, so the policy gradient stays unbiased however wrong the PRM is

Both read the PRM through `Steps.history` (p before step 0, then after each step), so one
class serves both trainers: here the PRM is a causal history model of the episode; on a
language model (`lm.rl.models`) an MLP on the starting LM's hidden states. Where the trainer
keeps a training alarm (the language model's, `Steps.alarm` steps per batch), the signal
comes with that many uniformly drawn steps Monte Carlo labelled (`Steps.branch`, charged)
and the PRM's increment on each (`StepSignal.checks`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.drift.baselines import BaselineConfig, train_history_model
from hindsight.labeling.engine import Labeler, episode_key
from hindsight.labeling.trajectories import batch_spec, trajectory_batch
from hindsight.model.credit_model import ModelConfig
from hindsight.rl.sources.base import CreditSource, label_config, register_source
from hindsight.rl.sources.steps import Steps, StepSignal, check_rows


@register_source
class Prm(CreditSource):
  name = "prm"
  summary = "a learned process reward model's increments P(success | h<=t) - P(.. | h<t)"
  trainers = ("symbolic", "text")
  model = "prm"

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

  def history(self, aux, traj, batch):
    """p [E, H + 1]: the training success rate before any step (p_{-1} of
    `drift.baselines.prm_increments`), then P(success | h_<=t)."""
    p = jax.nn.sigmoid(self.logits(aux, traj, batch))
    return jnp.concatenate([jnp.full((p.shape[0], 1), self.base, p.dtype), p], 1)

  # -- the math, for every trainer ---------------------------------------------------------

  def prediction(self, steps: Steps):
    """The PRM's increments p_{t+1} - p_t [E, H] (0 on padding)."""
    p = steps.history()
    return jnp.where(steps.mask, p[:, 1:] - p[:, :-1], 0.0)

  def prm_signal(self, steps: Steps):
    return self.prediction(steps)

  def step_signal(self, steps: Steps, key) -> StepSignal:
    return alarm_checks(self, steps, StepSignal(self.prm_signal(steps), steps.zero), key)


@register_source
class Shaped(Prm):
  name = "shaped"
  summary = "R - PRM(h<t): the PRM as a shaping potential, i.e. a baseline (unbiased)"
  unbiased = True

  def prm_signal(self, steps: Steps):
    """R - p_t [E, H]: p_t reads the history before step t only."""
    p = steps.history()
    return jnp.where(steps.mask, steps.outcome[:, None] - p[:, :-1], 0.0)


def alarm_checks(source, steps: Steps, signal: StepSignal, key) -> StepSignal:
  """`signal` with the training alarm's checks (`Steps.alarm` steps drawn uniformly from the
  batch's valid steps, without replacement, each Monte Carlo labelled and held against the
  source's prediction), their cost added and recorded (`alarm_cost`). Host only; `signal`
  as it is where the trainer keeps no alarm."""
  n = steps.alarm
  if not n or n <= 0:  # None inside the symbolic update's jit: nothing here traces
    return signal
  mask = np.asarray(steps.mask)
  valid = np.argwhere(mask)  # (i, t) in trace order
  if not len(valid):
    return signal
  k_pick, k_label = jax.random.split(key)
  picks = np.sort(np.asarray(jax.random.choice(k_pick, len(valid), (min(n, len(valid)),),
                                               replace=False)))  # fmt: skip
  chosen = valid[picks]
  z = np.zeros(mask.shape, bool)
  z[chosen[:, 0], chosen[:, 1]] = True
  branched = steps.branch(z, k_label)
  checks = check_rows(chosen[:, 0], chosen[:, 1], source.prediction(steps), branched.credit)
  record = {**signal.record, "alarm_cost": branched.cost}
  cost = signal.cost + branched.cost
  return dataclasses.replace(signal, cost=cost, record=record, checks=checks)
