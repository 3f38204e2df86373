"""Credit model on the bundled tabular MDP (data/key_corridor.npz, `policy` replacement).

  python -m train.main --config configs/tabular.py --workdir runs/tabular

Expected (2-core CPU, 29s-1m22s including labeling): on 205 held-out episodes, Spearman
0.743, Pearson 0.940, MAE 0.0150 (`pick` 0.043 labeled -> 0.027 predicted).
The :smoke variant (64 episodes, K=8, 40 steps) is for tests.
"""

from configs import common


def get_config(arg: str = ""):
  c = common.base_config()
  c.data.label.env = "tabular:data/key_corridor.npz"
  c.data.label.episodes = 2048
  c.data.label.rollouts = 64
  c.data.label.replacement = "policy"
  c.train.steps = 1000
  return common.with_variant(c, arg)
