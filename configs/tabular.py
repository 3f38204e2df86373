"""Credit model on the bundled tabular MDP (`key_corridor`, `policy` replacement).

  python -m train.main --config configs/tabular.py --workdir runs/tabular

Expected (2-core CPU, 25 s including labeling; the last of its steps scored): on 205
held-out episodes, against the training labels Pearson 0.945, MAE 0.0146 (`pick` 0.043
labeled -> 0.028 predicted; 53% of the labels are exactly 0, so their Spearman is
undefined); against the exact DP (`hindsight eval`) Spearman 0.916 [0.900, 0.929], its
labels 0.733, K* 43.7 [35.0, 59.0], 95% coverage 0.947 (docs/results.md).
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
