"""What an RL run is judged by, at every evaluation point: fresh episodes of the current
policy labeled by a reference labeler (K = eval.rollouts, keys of their own), never by the
signal being trained on.

Per seed: success rate, mean trace length, mean return, the share of the valid steps in
each reference class (KLASS_NAMES: decorative, load_bearing, harmful, undetermined, by the
labels' own rule at the labeler's tolerance and confidence) and in each environment tag
(on `reasoning` the tags are the planted roles), and, for learned sources, the credit
model's drift from the reference: mean gap (prediction - reference credit), MAE and
Spearman over the valid steps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from hindsight.credit.estimators import KLASS_NAMES
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.engine import Labeler
from hindsight.labeling.rollout import sample_episode
from hindsight.labeling.trajectories import trajectory_batch
from hindsight.rl.task import Task


def point_keys(seed_key: jax.Array, stream: int, update: int, n: int) -> jax.Array:
  """n episode keys of one (stream, update) of a seed: 2 = evaluation, 3 = refresh audits.
  The training updates draw from stream 1 (`ppo.Programs.init`), so none overlap."""
  root = jax.random.fold_in(jax.random.fold_in(seed_key, stream), update)
  return jax.vmap(jax.random.fold_in, (None, 0))(root, jnp.arange(n))


class LabeledSampler:
  """Samples and labels episodes of pi_theta for any theta, compiled once per labeler."""

  def __init__(self, task: Task, config: LabelConfig):
    self.task = task
    self.labeler = Labeler(task.env, task.policy, config)
    sample = functools.partial(sample_episode, task.env, task.policy, task.env_params)
    self._run = jax.jit(
      lambda params, keys: self._labeled(jax.vmap(sample, (None, 0))(params, keys), params, keys)
    )

  def _labeled(self, traj, params, keys):
    labels = self.labeler.label_under(params, traj, keys)
    return traj, labels, trajectory_batch(self.task.env, traj, labels)

  def __call__(self, params, keys):
    """(trajectories, labels, labeled batch) of the episodes of `keys` under `params`."""
    return self._run(params, keys)


def evaluate_point(sampler: LabeledSampler, params, keys, score=None, model_state=None):
  """The measurements of the module docstring for one seed (plain floats); score: the
  credit model's jitted `credit_fn` (learned sources) and model_state its parameters."""
  traj, labels, batch = jax.device_get(sampler(params, keys))
  mask = np.asarray(traj.mask)
  n_valid = max(int(mask.sum()), 1)
  klass = np.asarray(labels["klass"])[mask]
  out = {
    "success": float(np.mean(traj.success)),
    "length": float(mask.sum(-1).mean()),
    "return": float(np.asarray(traj.rewards).sum(-1).mean()),
    "klass_share": {k: float(np.sum(klass == i) / n_valid) for i, k in enumerate(KLASS_NAMES)},
  }
  env = sampler.task.env
  if env.tag_names:
    tags = np.asarray(labels["tags"])[mask]
    out["tag_share"] = {t: float(np.sum(tags == i) / n_valid) for i, t in enumerate(env.tag_names)}
  if score is not None:
    pred = np.asarray(score(model_state, batch)["mean"])[mask]
    ref = np.asarray(labels["credit"])[mask]
    ok = np.isfinite(ref)
    gap = pred[ok] - ref[ok]
    rho = stats.spearmanr(pred[ok], ref[ok]).statistic if ok.sum() > 2 else float("nan")
    out["drift"] = {
      "mean_gap": float(gap.mean()),
      "mae": float(np.abs(gap).mean()),
      "spearman": float(rho),
    }
  return out
