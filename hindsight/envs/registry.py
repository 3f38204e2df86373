"""`--env` specs -> (environment, behaviour policy).

tabular:PATH.npz     a tabular MDP file (DESIGN section 2) with its policy pi
"""

from __future__ import annotations

from hindsight.envs.base import Environment
from hindsight.envs.tabular import TabularEnv, load_tabular
from hindsight.errors import HindsightError
from hindsight.policies.base import Policy
from hindsight.policies.tabular import TabularPolicy

KNOWN_SPECS = ("tabular:PATH.npz",)


def make(spec: str) -> tuple[Environment, Policy]:
  """Builds the environment and its behaviour policy named by an `--env` spec."""
  kind, sep, arg = spec.partition(":")
  if kind == "tabular":
    if not sep or not arg:
      raise HindsightError("--env tabular needs a file: tabular:PATH.npz")
    mdp = load_tabular(arg)
    return TabularEnv(mdp), TabularPolicy(mdp.pi)
  raise HindsightError(f"unknown environment '{spec}' (known: {', '.join(KNOWN_SPECS)})")
