"""`--env` specs -> (environment, behaviour policy), through the registry of environment
families (`hindsight.envs.families`: what each spec prefix names, who labels it)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from hindsight.envs.base import Environment
from hindsight.envs.families import (
  EXTERNAL,
  EnvOptions,
  family_of,
  known_specs,
  split_spec,
)
from hindsight.errors import HindsightError
from hindsight.policies.base import Policy


def make_labeled(metadata: Mapping, spec: str | None = None) -> tuple[Environment, Policy]:
  """(environment, policy) a label dataset was labeled on: its --env spec with the --policy,
  horizon and --return-range of its job (a gymnax job's horizon as it labeled, from the
  metadata). `spec`: evaluate another environment instead (`make(spec)`), unless it is the
  dataset's own. Every job after labeling (eval, audit) builds the environment here, so
  none of them drops the options the labels were made with."""
  labeled = str(metadata.get("env", ""))
  spec = spec or labeled
  if spec != labeled or not family_of(spec).options & EXTERNAL:
    return make(spec)
  job = json.loads(metadata.get("job", "{}"))
  return_range = job.get("return_range")
  return make(
    spec,
    job.get("policy"),
    int(metadata["horizon"]) if "horizon" in metadata else job.get("horizon"),
    tuple(float(x) for x in return_range) if return_range is not None else None,
  )


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


__all__ = ["family_of", "known_specs", "make", "make_labeled"]
