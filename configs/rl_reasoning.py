"""RL on `reasoning`: the learner starts as the scripted policy (reading its competence c).

  hindsight rl --config rl_reasoning --workdir runs/rl/reasoning/SOURCE --config.source=SOURCE
  hindsight rl --config rl_reasoning --sources all --workdir runs/rl/reasoning   # every source
  (in a checkout also python -m train.rl / python eval/rl_experiment.py, the same program)

10 seeds x 60 updates x 64 episodes (about 40k policy env steps per seed). The :smoke variant
(2 seeds, 4 updates of 16 episodes, tiny models) is for tests.
"""

from hindsight.rl.config import base_config, with_variant


def get_config(arg: str = ""):
  c = base_config()
  c.num_seeds = 10
  c.env = "reasoning"
  c.ppo.updates = 60
  c.ppo.episodes = 64
  c.eval.every = 10
  return with_variant(c, arg)
