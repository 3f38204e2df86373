"""Sources that branch the current policy's own episodes with the labeler (K rollouts per
step, `label.num_rollouts`), charged the arms they run:

  mc_progress   A_t = progress_t = r_t + V(s_{t+1}) - V(s_t), V by K rollouts of pi from
                each state (VinePPO); charged the phi arm's env steps
  mc_credit     A_t = credit_t, the labeler's interventional credit with K branch pairs
                under pi_theta itself (the oracle); rolls and is charged the keep and
                replace arms only. On a language model the branches are K continuations
                of each prefix (`lm.rl.credit`): one class for both trainers (`step_signal`)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight.labeling.engine import Labeler
from hindsight.rl.sources.base import PHI, CreditSource, label_config, register_source
from hindsight.rl.sources.steps import Steps, StepSignal


class _Branched(CreditSource):
  """Labels of the sampled episodes under the current policy (`Labeler.label_under`)."""

  def prepare(self, progress: bool = False) -> None:
    del progress
    task, config = self.task, self.config
    self.labeler = Labeler(task.env, task.policy, label_config(config))

  def labels(self, policy_params, traj, key) -> dict:
    keys = jax.random.split(key, traj.mask.shape[0])
    return self.labeler.label_under(policy_params, traj, keys)


@register_source
class McProgress(_Branched):
  name = "mc_progress"
  summary = "VinePPO: r_t + V(s_{t+1}) - V(s_t), V by K policy rollouts per step"

  def signal(self, aux, policy_params, traj, key):
    del aux
    labels = self.labels(policy_params, traj, key)
    return jnp.where(traj.mask, labels["progress"], 0.0), labels["arm_steps"][:, PHI].sum()


@register_source
class McCredit(_Branched):
  name = "mc_credit"
  summary = "the oracle: interventional credit by K branch pairs per step"
  unbiased = True
  trainers = ("symbolic", "text")

  def step_signal(self, steps: Steps, key) -> StepSignal:
    branched = steps.branch(None, key)  # every step; credit only (no phi arm to roll)
    credit = jnp.where(jnp.isfinite(branched.credit), branched.credit, 0.0)
    return StepSignal(jnp.where(steps.mask, credit, 0.0), branched.cost)
