"""RL on `key_to_door` (apple phase shortened to 30 steps: horizon 60), from the scripted
policy that grabs the key half the time: credit's classic long-delay case.

  hindsight rl --config rl_key_to_door --sources all --workdir runs/rl/key_to_door

10 seeds x 40 updates x 32 episodes. The :smoke variant is for tests.
"""

from hindsight.rl.config import base_config, with_variant


def get_config(arg: str = ""):
  c = base_config()
  c.num_seeds = 10
  c.env = "key_to_door:apple_steps=30"
  c.ppo.updates = 40
  c.ppo.episodes = 32
  c.label.num_rollouts = 4
  c.credit.model_episodes = 512
  # the credit heads: 64 episodes at K=4, about 1/20 of mc_credit's branches in a run
  c.head.episodes = 64
  c.head.rollouts = 4
  c.eval.every = 10
  c.eval.episodes = 64
  c.eval.rollouts = 16
  return with_variant(c, arg)
