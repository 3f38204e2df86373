"""Credit model on `team`: step credit and each agent's Shapley value from the joint trajectory.

  python -m train.main --config configs/team.py --workdir runs/team

Labels: `hindsight label --env team` (policy_other replacement), which also writes each
episode's agent-level Shapley values from coalition rollouts; the model's agent head is
scored against them on held-out episodes (report.json "agent").
Expected (2-core CPU, 1m57s including labeling): on 205 held-out episodes, agent Shapley values
Spearman 0.933, Pearson 0.985, MAE 0.014 (820 episode x agent pairs); step credit Spearman
0.997. The :smoke variant is for tests.
"""

from hindsight import default_config as common


def get_config(arg: str = ""):
  c = common.base_config()
  c.data.label.env = "team"
  c.data.label.episodes = 2048
  c.data.label.num_rollouts = 64
  c.data.label.replacement = "policy_other"
  c.data.num_buckets = 1  # every episode runs its 12 turns
  c.train.steps = 1500
  return common.with_variant(c, arg)
