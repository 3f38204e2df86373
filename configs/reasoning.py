"""Credit model on the `reasoning` environment (labels by the `policy` replacement).

  python -m train.main --config configs/reasoning.py --workdir runs/reasoning
  (`make demo` runs this config into runs/demo.)

Expected (2-core CPU): on 410 held-out episodes, scored with the best checkpoint (step 2000),
against the training labels Spearman 0.768, Pearson 0.950, MAE 0.0226; against the
reference (`hindsight eval`, K=1024, independent keys) Spearman 0.864 [0.850, 0.876], the
labels themselves 0.804 [0.782, 0.825], equivalent rollouts K = 104.5 [80.4, 137.0].
The :smoke variant (64 episodes, K=8, 40 steps) is for tests.
"""

from configs import common


def get_config(arg: str = ""):
  c = common.base_config()
  c.data.label.env = "reasoning"
  c.data.label.episodes = 4096
  # Credits under `policy` are small (facts ~0.04): K=256 keeps the labels' own noise from
  # capping the rank correlation (at K=64 labels + their noise reach Spearman 0.79 only).
  c.data.label.rollouts = 256
  c.data.label.replacement = "policy"
  c.data.num_buckets = 2  # episodes are 2-20 steps
  c.train.steps = 3000
  return common.with_variant(c, arg)
