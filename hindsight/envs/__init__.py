"""Functional environments (gymnax style) and the `--env` spec parser."""

from hindsight.envs.base import Environment
from hindsight.envs.registry import make, make_labeled
from hindsight.envs.tabular import (
  TabularEnv,
  TabularMDP,
  TabularParams,
  TabularState,
  key_corridor_mdp,
  load_tabular,
  peaked_mdp,
  random_mdp,
  rare_success_mdp,
)

__all__ = [
  "Environment",
  "TabularEnv",
  "TabularMDP",
  "TabularParams",
  "TabularState",
  "key_corridor_mdp",
  "load_tabular",
  "make",
  "make_labeled",
  "peaked_mdp",
  "random_mdp",
  "rare_success_mdp",
]
