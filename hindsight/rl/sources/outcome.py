"""Sources that need no labels: the outcome itself, and GAE over a learned critic.

outcome   A_t = R - mean_batch(R)          (REINFORCE with a baseline), R = sum_t r_t
gae       rlax GAE(lambda) over a critic V(x) that `rl.ppo` trains beside the policy
"""

from __future__ import annotations

import jax.numpy as jnp

from hindsight.rl.sources.base import CreditSource, register_source


@register_source
class Outcome(CreditSource):
  name = "outcome"
  summary = "R - mean batch R at every step (REINFORCE with a baseline)"

  def signal(self, aux, policy_params, traj, key):
    del aux, policy_params, key
    R = traj.rewards.sum(-1)
    return jnp.where(traj.mask, (R - R.mean())[:, None], 0.0), self.no_steps()


@register_source
class Gae(CreditSource):
  name = "gae"
  summary = "GAE(lambda) with a learned critic V(x) (PPO's default)"
  critic = True  # rl.ppo computes the advantages over its critic
