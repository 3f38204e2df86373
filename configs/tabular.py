"""Credit model on the bundled tabular MDP (`key_corridor`, `policy` replacement).

  python -m train.main --config configs/tabular.py --workdir runs/tabular

Expected (2-core CPU, 48s including labeling): on 205 held-out episodes, against the
training labels Spearman 0.713, Pearson 0.942, MAE 0.0148 (`pick` 0.043 labeled -> 0.027
predicted); against the exact DP (`hindsight eval`) Spearman 0.920 [0.904, 0.932], its
labels 0.733, 95% coverage 0.955 (docs/results.md).
The :smoke variant (64 episodes, K=8, 40 steps) is for tests.
"""

from hindsight import default_config as common


def get_config(arg: str = ""):
  c = common.base_config()
  c.data.label.env = "key_corridor"
  c.data.label.episodes = 2048
  c.data.label.num_rollouts = 64
  c.data.label.replacement = "policy"
  c.train.steps = 1000
  return common.with_variant(c, arg)
