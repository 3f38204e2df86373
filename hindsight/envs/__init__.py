"""Functional environments (gymnax style), the registry of environment families and the
`--env` spec parser. Names load on first use, so the JAX-free registry
(`hindsight.envs.families`) can be read without starting JAX."""

from hindsight._lazy import lazy_exports

_HOMES = {
  "Environment": "hindsight.envs.base",
  "EnvFamily": "hindsight.envs.families",
  "EnvOptions": "hindsight.envs.families",
  "family_of": "hindsight.envs.families",
  "register": "hindsight.envs.families",
  "registered_families": "hindsight.envs.families",
  "TabularEnv": "hindsight.envs.tabular",
  "TabularMDP": "hindsight.envs.tabular",
  "TabularParams": "hindsight.envs.tabular",
  "TabularState": "hindsight.envs.tabular",
  "key_corridor_mdp": "hindsight.envs.tabular",
  "load_tabular": "hindsight.envs.tabular",
  "peaked_mdp": "hindsight.envs.tabular",
  "random_mdp": "hindsight.envs.tabular",
  "rare_success_mdp": "hindsight.envs.tabular",
  "make": "hindsight.envs.registry",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = sorted(_HOMES)
