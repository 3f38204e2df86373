"""RL on gymnax's CartPole-v1 (episodes capped at 200 steps), from a uniform policy: an
environment nobody here wrote, where PPO with GAE has published learning curves
(purejaxrl, rejax: return near 500 within 5e5 env steps at horizon 500).

  hindsight rl --config rl_cartpole --sources outcome,gae,mc_credit --workdir runs/rl/cartpole

10 seeds x 50 updates x 16 episodes. The :smoke variant is for tests.
"""

from hindsight.rl.config import base_config, with_variant


def get_config(arg: str = ""):
  c = base_config()
  c.num_seeds = 10
  c.env = "gymnax:CartPole-v1"
  c.horizon = 200
  c.policy.prior = False
  c.ppo.updates = 50
  c.ppo.episodes = 16
  c.ppo.learning_rate = 1e-3
  c.label.num_rollouts = 4
  c.credit.model_episodes = 256
  c.eval.every = 10
  c.eval.episodes = 32
  c.eval.rollouts = 8
  # Audits of 200-step episodes are costly: a few episodes at K=4 per evaluation point.
  c.refresh.episodes = 4
  c.refresh.rollouts = 4
  return with_variant(c, arg)
