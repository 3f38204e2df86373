"""Credit model on `key_to_door` (labels by the `policy_other` replacement).

  python -m train.main --config configs/key_to_door.py --workdir runs/key_to_door

Expected (2-core CPU, 1m39s-4m14s including labeling): on 205 held-out episodes, scored with
the best checkpoint (step 1750), Spearman 0.463 (most labels tie at 0, which caps it at 0.554;
README), Pearson 0.992, MAE 0.0492; key 9.997 labeled -> 10.019 predicted, apples 5.415 ->
5.440.
The :smoke variant (32 episodes, K=8, 40 steps) is for tests.
"""

from configs import common


def get_config(arg: str = ""):
  c = common.base_config()
  c.data.label.env = "key_to_door"
  c.data.label.episodes = 2048
  c.data.label.rollouts = 32
  c.data.label.replacement = "policy_other"
  c.data.num_buckets = 1  # every episode runs to the door: lengths barely differ
  c.data.batch_size = 16
  # Most steps tie in every branch, in the labels and in the truth: the exact-zero head
  # learns the ties (Spearman against the reference 0.467 -> 0.788, README).
  c.loss.zero_ties = True
  c.train.steps = 3000
  return common.with_variant(c, arg, smoke_episodes=32)
