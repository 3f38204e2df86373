"""The registry of environment families: what an `--env` spec names.

A spec is `FAMILY` or `FAMILY:ARG` (`reasoning:horizon=30`, `gymnax:Catch-bsuite`,
`tabular:PATH.npz`). Each family registers once (`register`), in the manner of gymnax's
`make` / `registered_envs`, and carries everything the rest of the package would otherwise
look up by prefix:

  make(arg, options) -> (Environment, Policy)   the functional environment (JAX families);
                        None for families labeled outside JAX (Gymnasium, dm_env, text)
  make_python(arg, horizon) -> PyEnv            a stateful Python environment (adapters)
  options               the environment options it accepts (ENV_OPTIONS: policy, horizon,
                        return_range)
  shifts                default out-of-distribution specs of the drift harness
  fit_horizon           label at the longest of the job's episodes, not the declared cap
  no_return_range       what an unset return range means for its stderrs (a note)

Who labels a family's episodes is the labeling package's business (`labeling.source`: the
JAX engine, the Python-adapter labeler, or a source a plug-in registers for its family), so
this registry knows nothing above the environments.

A user's own family registers from their module: `--env mymodule:ARG` imports `mymodule`
when no family `mymodule` is registered yet, and a module-level `register(...)` there adds it
(docs/environments.md, "Your own environment family"). Plug-ins (`hindsight.plugins`: the
text package's `text` family) and installed packages naming modules in the entry-point group
`hindsight.envs` are loaded the same way.

JAX-free: `hindsight --help` lists the registered families without starting JAX (every
factory imports its environment when called).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from collections.abc import Callable, Mapping
from typing import Any

from hindsight import plugins
from hindsight.errors import HindsightError

ENTRY_POINT_GROUP = "hindsight.envs"
# The options of someone else's environment (gymnax, Gymnasium, dm_env): a label dataset
# records them and every later job rebuilds the environment with them (`make_labeled`).
ENV_OPTIONS = ("policy", "horizon", "return_range")
EXTERNAL = frozenset(ENV_OPTIONS)


@dataclasses.dataclass(frozen=True)
class EnvOptions:
  """The job's options for families that accept them (`EnvFamily.options`): a behaviour
  policy MODULE:FN, a cap on the episode length and the (lo, hi) range of any return."""

  policy: str | None = None
  horizon: int | None = None
  return_range: tuple[float, float] | None = None


@dataclasses.dataclass(frozen=True)
class EnvFamily:
  """One family of `--env` specs (module docstring).

  name: the spec's prefix (`name` or `name:ARG`).
  usage: the spec's form for --help and errors, e.g. `key_to_door[:p_key=P]`.
  make: (arg, EnvOptions) -> (environment, behaviour policy); arg is the text after the
    first ':' ('' for a bare `name`). None: not a functional (JAX) environment, so it
    cannot be relabeled from a seed by the drift harness or the audit.
  options: the environment options among ENV_OPTIONS it accepts.
  shifts: the drift harness's default shifted specs when this family is evaluated.
  fit_horizon: label at the longest of the job's episodes (declared caps can be 1000 steps
    for episodes of 9).
  no_return_range: the consequence of a job without `return_range`, said once as a note
    ('' says nothing).
  make_python: (arg, horizon) -> a PyEnv, for families of stateful Python environments.
  """

  name: str
  usage: str
  make: Callable[[str, EnvOptions], tuple[Any, Any]] | None = None
  options: frozenset[str] = frozenset()
  shifts: tuple[str, ...] = ()
  fit_horizon: bool = False
  no_return_range: str = ""
  make_python: Callable[[str, int | None], Any] | None = None

  def __post_init__(self):
    if not self.name or ":" in self.name:
      raise ValueError(f"a family's name is a spec prefix without ':', got {self.name!r}")
    unknown = set(self.options) - set(ENV_OPTIONS)
    if unknown:
      raise ValueError(f"family {self.name}: unknown options {sorted(unknown)}")

  @property
  def functional(self) -> bool:
    """Whether its environments are functional JAX ones (relabelable from a seed)."""
    return self.make is not None


_FAMILIES: dict[str, EnvFamily] = {}


def register(family: EnvFamily, *, replace: bool = False) -> EnvFamily:
  """Adds a family to the registry (`replace`: allow a new definition of a name)."""
  if family.name in _FAMILIES and not replace and _FAMILIES[family.name] != family:
    raise HindsightError(f"environment family '{family.name}' is registered already")
  _FAMILIES[family.name] = family
  return family


register_family = register  # the name the flat API (`hindsight.register_family`) gives it


def registered_families() -> tuple[EnvFamily, ...]:
  """Every registered family, in registration order (every plug-in loaded first, so the
  families they add are there too)."""
  plugins.load_all()
  return tuple(_FAMILIES.values())


def known_specs(sep: str = ", ", where: Callable[[EnvFamily], bool] | None = None) -> str:
  """The registered families' usage (those `where` accepts), for errors (and --help, with
  sep " | "); every plug-in is loaded first, so the families they add are listed too."""
  return sep.join(f.usage for f in registered_families() if where is None or where(f))


def _load_plugins(name: str) -> None:
  """Imports what may register family `name`: the plug-in of that name
  (`hindsight.plugins`), an entry point of that name in the group `hindsight.envs`, else a
  module of that name."""
  if plugins.load(name):
    return
  for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
    if point.name == name:
      try:
        loaded = point.load()
      except Exception as e:  # a user's code: any failure is theirs, said in one line
        raise HindsightError(f"environment '{name}': its entry point failed ({e})") from None
      if isinstance(loaded, EnvFamily):
        register(loaded)
      return
  if not all(part.isidentifier() for part in name.split(".")):
    return  # a path or a typo, not a module name
  try:
    importlib.import_module(name)
  except ImportError as e:
    if e.name is not None and name.startswith(e.name):  # no such module: not a plug-in
      return
    raise HindsightError(f"environment '{name}': importing its module failed ({e})") from None
  except Exception as e:  # a user's module that fails as it runs
    raise HindsightError(
      f"environment '{name}': importing its module failed ({type(e).__name__}: {e})"
    ) from None


def split_spec(spec: str) -> tuple[str, str]:
  """`family:arg` -> (family, arg); a bare `family` -> (family, '')."""
  name, _, arg = spec.partition(":")
  return name, arg


def family_of(spec: str) -> EnvFamily:
  """The family a spec names (loading a user's module if needed), or a one-line error that
  lists the registered ones."""
  name, _ = split_spec(spec)
  if name and name not in _FAMILIES:
    _load_plugins(name)
  if name not in _FAMILIES:
    raise HindsightError(f"unknown environment '{spec}' (known: {known_specs()})")
  return _FAMILIES[name]


def make_py_env(spec: str, horizon: int | None = None):
  """The stateful Python environment of a `gymnasium:` / `dm_env:` spec (any family with a
  `make_python`): an `adapters.PyEnv`."""
  family = family_of(spec)
  if family.make_python is None:
    known = known_specs(where=lambda f: f.make_python is not None)
    raise HindsightError(f"env {spec}: expected a Python environment ({known})")
  return family.make_python(split_spec(spec)[1], horizon)


def check_env_options(family: EnvFamily, given: Mapping[str, bool]) -> None:
  """Refuses (one line) an environment option the family does not take; `given` says, for
  each of ENV_OPTIONS, whether the job set it."""
  for option in ENV_OPTIONS:
    if given.get(option) and option not in family.options:
      takers = [f.name for f in _FAMILIES.values() if option in f.options]
      where = ", ".join(f"{n}:" for n in takers) or "no environment"
      raise HindsightError(f"{option} is for {where} environments only, not {family.name}")


# -- the families that ship with hindsight ---------------------------------------------------


def parse_options(spec: str, arg: str, allowed: dict[str, float]) -> dict[str, float]:
  """Parses `name=value,name=value` into floats, refusing unknown names and bad numbers (the
  option syntax of the bundled families; a user's family may use it too)."""
  out = dict(allowed)
  for item in filter(None, arg.split(",")):
    name, sep, value = item.partition("=")
    if not sep or name not in allowed:
      raise HindsightError(f"env {spec}: unknown option '{item}' (known: {', '.join(allowed)})")
    try:
      out[name] = float(value)
    except ValueError:
      raise HindsightError(f"env {spec}: {name} must be a number, got '{value}'") from None
  return out


def _tabular(arg: str, options: EnvOptions):
  from hindsight.envs.tabular import TabularEnv, load_tabular
  from hindsight.policies.tabular import TabularPolicy

  del options
  if not arg:
    raise HindsightError("env tabular needs a file: tabular:PATH.npz")
  mdp = load_tabular(arg)
  return TabularEnv(mdp), TabularPolicy(mdp.pi)


def _key_corridor(arg: str, options: EnvOptions):
  from hindsight.envs.tabular import TabularEnv, key_corridor_mdp
  from hindsight.policies.tabular import TabularPolicy

  del options
  if arg:
    raise HindsightError(f"env key_corridor:{arg}: key_corridor takes no options")
  mdp = key_corridor_mdp()  # the bundled MDP, from code (no data file needed)
  return TabularEnv(mdp), TabularPolicy(mdp.pi)


def _key_to_door(arg: str, options: EnvOptions):
  from hindsight.envs.key_to_door import KeyToDoor, KeyToDoorPolicy

  del options
  spec = f"key_to_door:{arg}"
  opts = parse_options(spec, arg, {"p_key": 0.5, "apple_steps": 90})
  if not 0.0 <= opts["p_key"] <= 1.0:
    raise HindsightError(f"env {spec}: p_key must be in [0, 1]")
  apple_steps = int(opts["apple_steps"])
  if apple_steps != opts["apple_steps"] or apple_steps < 10:
    raise HindsightError(f"env {spec}: apple_steps must be an integer >= 10 (10 apples)")
  env = KeyToDoor(apple_steps=apple_steps)
  return env, KeyToDoorPolicy(env, p_key=opts["p_key"])


def _reasoning(arg: str, options: EnvOptions):
  from hindsight.envs.reasoning import Reasoning, ReasoningPolicy

  del options
  spec = f"reasoning:{arg}"
  defaults = {
    "decorative_rate": 1.0,
    "horizon": 20,
    "competence_min": 0.0,
    "competence_max": 1.0,
    "show_competence": 0.0,
  }
  opts = parse_options(spec, arg, defaults)
  if opts["decorative_rate"] < 0:
    raise HindsightError(f"env {spec}: decorative_rate must be >= 0")
  horizon = int(opts["horizon"])
  if horizon != opts["horizon"] or horizon < 2:
    raise HindsightError(f"env {spec}: horizon must be an integer >= 2")
  competence = (opts["competence_min"], opts["competence_max"])
  if not 0.0 <= competence[0] <= competence[1] <= 1.0:
    raise HindsightError(f"env {spec}: need 0 <= competence_min <= competence_max <= 1")
  if opts["show_competence"] not in (0.0, 1.0):
    raise HindsightError(f"env {spec}: show_competence must be 0 or 1")
  env = Reasoning(
    horizon=horizon, competence=competence, show_competence=bool(opts["show_competence"])
  )
  return env, ReasoningPolicy(opts["decorative_rate"])


def _team(arg: str, options: EnvOptions):
  from hindsight.envs.team import Team, TeamPolicy

  del options
  spec = f"team:{arg}"
  opts = parse_options(spec, arg, {"agents": 4, "rounds": 3, "p_error": 0.5})
  agents, rounds = int(opts["agents"]), int(opts["rounds"])
  if agents != opts["agents"] or agents < 4 or rounds != opts["rounds"] or rounds < 1:
    raise HindsightError(f"env {spec}: agents must be an integer >= 4 and rounds >= 1")
  if not 0.0 <= opts["p_error"] <= 1.0:
    raise HindsightError(f"env {spec}: p_error must be in [0, 1]")
  return Team(agents, rounds, p_error=opts["p_error"]), TeamPolicy()


def _gymnax(arg: str, options: EnvOptions):
  from hindsight.envs.gymnax_env import make_gymnax

  return make_gymnax(f"gymnax:{arg}", options.policy, options.horizon, options.return_range)


def _gymnasium(arg: str, horizon: int | None):
  from hindsight.envs.adapters import GymnasiumEnv

  if not arg:
    raise HindsightError("env gymnasium needs an environment id: gymnasium:ENV_ID")
  return GymnasiumEnv(arg, horizon)


def _dm_env(arg: str, horizon: int | None):
  from hindsight.envs.adapters import DmEnv

  module, _, factory = arg.partition(":")
  if not module or not factory:
    raise HindsightError(f"env dm_env:{arg}: expected dm_env:MODULE:FACTORY")
  return DmEnv(module, factory, horizon)


_ADAPTER_RANGE = (
  "the tie bound then uses the range of each episode's branch returns, what the data show"
)
for _family in (
  EnvFamily("tabular", "tabular:PATH.npz", _tabular),
  EnvFamily("key_corridor", "key_corridor", _key_corridor),
  EnvFamily(
    "key_to_door", "key_to_door[:p_key=P,apple_steps=N]", _key_to_door,
    shifts=("key_to_door:p_key=0.9",),
  ),
  EnvFamily(
    "reasoning",
    "reasoning[:decorative_rate=D,horizon=H,competence_min=C,competence_max=C,show_competence=1]",
    _reasoning,
    shifts=("reasoning:decorative_rate=0.25", "reasoning:horizon=30"),
  ),
  EnvFamily("team", "team[:agents=N,rounds=R,p_error=E]", _team),
  EnvFamily(
    "gymnax", "gymnax:ID", _gymnax, options=EXTERNAL, fit_horizon=True,
    no_return_range="the tie bound of a near-tied step is then infinite (stderr inf, klass "
    "undetermined)",
  ),
  EnvFamily(
    "gymnasium", "gymnasium:ENV_ID", options=EXTERNAL, no_return_range=_ADAPTER_RANGE,
    make_python=_gymnasium,
  ),
  EnvFamily(
    "dm_env", "dm_env:MODULE:FACTORY", options=EXTERNAL, no_return_range=_ADAPTER_RANGE,
    make_python=_dm_env,
  ),
):  # fmt: skip
  register(_family)
