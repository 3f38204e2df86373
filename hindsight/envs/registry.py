"""`--env` specs -> (environment, behaviour policy), through the registry of environment
families (`hindsight.envs.families`: what each spec prefix names, who labels it)."""

from __future__ import annotations

from hindsight.envs.base import Environment
from hindsight.envs.families import EnvOptions, family_of, known_specs, split_spec
from hindsight.errors import HindsightError
from hindsight.policies.base import Policy


def make(
  spec: str,
  policy: str | None = None,
  horizon: int | None = None,
  return_range: tuple[float, float] | None = None,
) -> tuple[Environment, Policy]:
  """Builds the environment and its behaviour policy named by an `--env` spec. policy,
  horizon and return_range reach the families that take them (`EnvFamily.options`: gymnax)."""
  family = family_of(spec)
  if family.make is None:
    functional = known_specs(where=lambda f: f.functional)
    raise HindsightError(
      f"'{spec}': {family.name} environments are not functional JAX environments (only "
      f"`hindsight label` labels them); functional ones: {functional}"
    )
  return family.make(split_spec(spec)[1], EnvOptions(policy, horizon, return_range))


__all__ = ["family_of", "known_specs", "make"]
