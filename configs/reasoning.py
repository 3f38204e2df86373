"""Credit model on the `reasoning` environment (labels by the `policy` replacement).

  python -m train.main --config configs/reasoning.py --workdir runs/reasoning
  (`make demo` runs this config into runs/demo.)

Expected (2-core CPU, `make demo` 3m33s with .venv built; 9000 steps, the last one scored):
on the 1639 held-out episodes, against the training labels Spearman 0.615, Pearson 0.917,
MAE 0.0339; against the reference on 512 of them (`hindsight eval --episodes 512`, K=1024,
independent keys) Spearman 0.890 [0.878, 0.898] (noise ceiling 0.946), the labels
themselves 0.625, equivalent rollouts K = 151.3 [126.4, 176.4], 95% coverage 0.955 (the
README's results section, `python eval/readme_results.py`).
The :smoke variant (64 episodes, K=8, 40 steps) is for tests.
"""

from hindsight import default_config as common


def get_config(arg: str = ""):
  c = common.base_config()
  c.data.label.env = "reasoning"
  # The labeling budget spent on episodes (docs/results.md, "How to spend a labeling budget"):
  # at the same branch rollouts as 4096 x 256, 16384 x 64 trains a model worth K* = 140
  # rollouts per step against the reference instead of 104 (its labels alone are noisier;
  # the model averages their noise over 4x the situations).
  c.data.label.episodes = 16384
  c.data.label.num_rollouts = 64
  c.data.label.replacement = "policy"
  c.data.num_buckets = 2  # episodes are 2-20 steps
  # 9000 steps: on 16384 episodes 3x the steps took K* from 140 to 161 (6x: 148). The last
  # step is the model scored (checkpoint.evaluate's default): the cosine schedule ends on a
  # validation plateau, where a best-checkpoint pick is float rounding's choice.
  c.train.steps = 9000
  return common.with_variant(c, arg)
