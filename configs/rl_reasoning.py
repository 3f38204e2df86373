"""RL on `reasoning`: the learner starts as the scripted policy (reading its competence c).

  python -m train.rl --config configs/rl_reasoning.py --workdir runs/rl/reasoning/SOURCE \
      --config.source=SOURCE
  (eval/rl_experiment.py runs every source.)

5 seeds x 60 updates x 64 episodes (about 40k policy env steps per seed). The :smoke variant
(2 seeds, 4 updates of 16 episodes, tiny models) is for tests.
"""

from hindsight.rl.config import base_config, with_variant


def get_config(arg: str = ""):
  c = base_config()
  c.env = "reasoning"
  c.ppo.updates = 60
  c.ppo.episodes = 64
  c.eval.every = 10
  return with_variant(c, arg)
