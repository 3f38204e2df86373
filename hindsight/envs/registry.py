"""`--env` specs -> (environment, behaviour policy).

tabular:PATH.npz     a tabular MDP file (docs/design.md, section 2) with its policy pi
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from hindsight.envs.base import Environment
from hindsight.envs.tabular import TabularEnv, key_corridor_mdp, load_tabular
from hindsight.errors import HindsightError
from hindsight.policies.base import Policy
from hindsight.policies.tabular import TabularPolicy

KNOWN_SPECS = (
  "tabular:PATH.npz",
  "key_corridor",
  "key_to_door[:p_key=P,apple_steps=N]",
  "reasoning[:decorative_rate=D,horizon=H,competence_min=C,competence_max=C,show_competence=1]",
  "team[:agents=N,rounds=R,p_error=E]",
)


def _options(spec: str, arg: str, allowed: dict[str, float]) -> dict[str, float]:
  """Parses `name=value,name=value` into floats, refusing unknown names and bad numbers."""
  out = dict(allowed)
  for item in filter(None, arg.split(",")):
    name, sep, value = item.partition("=")
    if not sep or name not in allowed:
      raise HindsightError(f"--env {spec}: unknown option '{item}' (known: {', '.join(allowed)})")
    try:
      out[name] = float(value)
    except ValueError:
      raise HindsightError(f"--env {spec}: {name} must be a number, got '{value}'") from None
  return out


def takes_policy_options(spec: str) -> bool:
  """Whether the spec names an environment of someone else's (gymnax, Gymnasium, dm_env),
  whose policy, horizon and return range come from `--policy`, `--horizon`,
  `--return-range`."""
  return spec.split(":", 1)[0] in ("gymnax", "gymnasium", "dm_env")


def make_labeled(metadata: Mapping, spec: str | None = None) -> tuple[Environment, Policy]:
  """(environment, policy) a label dataset was labeled on: its --env spec with the --policy,
  horizon and --return-range of its job (a gymnax job's horizon as it labeled, from the
  metadata). `spec`: evaluate another environment instead (`make(spec)`), unless it is the
  dataset's own. Every job after labeling (eval, audit) builds the environment here, so
  none of them drops the options the labels were made with."""
  labeled = str(metadata.get("env", ""))
  spec = spec or labeled
  if spec != labeled or not takes_policy_options(spec):
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
  """Builds the environment and its behaviour policy named by an `--env` spec (policy,
  horizon and return_range: gymnax only, see `takes_policy_options`)."""
  kind, sep, arg = spec.partition(":")
  if kind == "tabular":
    if not sep or not arg:
      raise HindsightError("--env tabular needs a file: tabular:PATH.npz")
    mdp = load_tabular(arg)
    return TabularEnv(mdp), TabularPolicy(mdp.pi)
  if kind == "key_corridor" and not sep:  # the bundled MDP, from code (no data file needed)
    mdp = key_corridor_mdp()
    return TabularEnv(mdp), TabularPolicy(mdp.pi)
  if kind == "key_to_door":
    from hindsight.envs.key_to_door import KeyToDoor, KeyToDoorPolicy

    opts = _options(spec, arg, {"p_key": 0.5, "apple_steps": 90})
    if not 0.0 <= opts["p_key"] <= 1.0:
      raise HindsightError(f"--env {spec}: p_key must be in [0, 1]")
    apple_steps = int(opts["apple_steps"])
    if apple_steps != opts["apple_steps"] or apple_steps < 10:
      raise HindsightError(f"--env {spec}: apple_steps must be an integer >= 10 (10 apples)")
    env = KeyToDoor(apple_steps=apple_steps)
    return env, KeyToDoorPolicy(env, p_key=opts["p_key"])
  if kind == "reasoning":
    from hindsight.envs.reasoning import Reasoning, ReasoningPolicy

    opts = _options(
      spec,
      arg,
      {
        "decorative_rate": 1.0,
        "horizon": 20,
        "competence_min": 0.0,
        "competence_max": 1.0,
        "show_competence": 0.0,
      },
    )
    if opts["decorative_rate"] < 0:
      raise HindsightError(f"--env {spec}: decorative_rate must be >= 0")
    horizon = int(opts["horizon"])
    if horizon != opts["horizon"] or horizon < 2:
      raise HindsightError(f"--env {spec}: horizon must be an integer >= 2")
    competence = (opts["competence_min"], opts["competence_max"])
    if not 0.0 <= competence[0] <= competence[1] <= 1.0:
      raise HindsightError(f"--env {spec}: need 0 <= competence_min <= competence_max <= 1")
    if opts["show_competence"] not in (0.0, 1.0):
      raise HindsightError(f"--env {spec}: show_competence must be 0 or 1")
    env = Reasoning(
      horizon=horizon, competence=competence, show_competence=bool(opts["show_competence"])
    )
    return env, ReasoningPolicy(opts["decorative_rate"])
  if kind == "team":
    from hindsight.envs.team import Team, TeamPolicy

    opts = _options(spec, arg, {"agents": 4, "rounds": 3, "p_error": 0.5})
    agents, rounds = int(opts["agents"]), int(opts["rounds"])
    if agents != opts["agents"] or agents < 4 or rounds != opts["rounds"] or rounds < 1:
      raise HindsightError(f"--env {spec}: agents must be an integer >= 4 and rounds >= 1")
    if not 0.0 <= opts["p_error"] <= 1.0:
      raise HindsightError(f"--env {spec}: p_error must be in [0, 1]")
    return Team(agents, rounds, p_error=opts["p_error"]), TeamPolicy()
  if kind == "gymnax":
    from hindsight.envs.gymnax_env import make_gymnax

    return make_gymnax(spec, policy, horizon, return_range)
  known = ", ".join([*KNOWN_SPECS, "gymnax:ID", "gymnasium:ENV_ID", "dm_env:MODULE:FACTORY"])
  raise HindsightError(f"unknown environment '{spec}' (known: {known})")
