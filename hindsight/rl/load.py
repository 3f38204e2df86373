"""`load_policy(dir)`: a trained RL policy, ready for the labeler or a plain rollout.

One loader for every trainer: a run of the symbolic trainer (its config.json) loads here; a
run another trainer wrote names its kind in results.json's config (`hindsight rl --config
rl_text`: kind "lm") and loads through the loader its plug-in registers
(`register_policy_loader`; the language model's is `hindsight.lm.rl.trainer.load_policy`).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from ml_collections import ConfigDict

# Imported for its absl filter: orbax warns that a read-only manager is read-only.
import hindsight.model.checkpoints  # noqa: F401
from hindsight import plugins
from hindsight.config_io import current_names
from hindsight.envs.base import Environment
from hindsight.errors import HindsightError
from hindsight.policies.neural import NeuralPolicy
from hindsight.rl.config import base_config
from hindsight.rl.task import make_task


class TrainedPolicy(NeuralPolicy):
  """A NeuralPolicy whose default_params are the trained theta of one seed."""

  name = "trained"

  def __init__(self, base: NeuralPolicy, params):
    self.__dict__.update(base.__dict__)
    self._theta0 = params


def _config(flat: dict) -> ConfigDict:
  """The run's ConfigDict from its config.json (flattened dotted names)."""
  config = base_config()
  for name, value in current_names(flat).items():
    *parents, leaf = name.split(".")
    node = config
    for part in parents:
      node = node[part]
    node[leaf] = tuple(value) if isinstance(value, list) else value
  return config


# kind -> load(workdir, seed, update) of the runs of other trainers (module docstring).
_LOADERS: plugins.Registry = plugins.Registry()


def register_policy_loader(kind: str, load) -> None:
  """Registers load(workdir, seed, update) for RL runs whose config's `kind` is `kind`."""
  _LOADERS[kind] = load


def _other_kind(workdir: str) -> str | None:
  """The `kind` of a finished run of another trainer (results.json's config), else None."""
  path = os.path.join(workdir, "results.json")
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      kind = json.load(f).get("config", {}).get("kind")
  except (OSError, ValueError, AttributeError):
    return None
  return kind if isinstance(kind, str) and kind else None


def load_policy(workdir: str, seed: int = 0, update: int | None = None):
  """The trained policy of an RL run's seed `seed` (an index into its seeds) at its last
  saved update (or `update`).

  A symbolic run: (environment, policy), `policy.default_params()` the trained parameters,
  so `Labeler(env, policy, config)` labels the trained behaviour as it is. A language model's
  run (`hindsight rl --config rl_text`): (LoadedLM, the run's config), the LM's `.model` and
  `.tokenizer` ready to sample (`hindsight lm export RUN --out DIR` writes it as a Hugging
  Face folder)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    kind = _other_kind(workdir)
    load = _LOADERS.lookup(kind) if kind else None
    if load is not None:
      return load(workdir, seed, update)
    raise HindsightError(
      f"{os.path.abspath(workdir)}: no config.json nor a finished run's results.json (not an "
      "RL run's directory)"
    )
  with open(path) as f:
    config = _config(json.load(f))
  if not 0 <= seed < int(config.num_seeds):
    raise HindsightError(f"seed {seed}: the run trained seeds 0..{int(config.num_seeds) - 1}")
  task = make_task(config)
  manager = ocp.CheckpointManager(
    os.path.join(os.path.abspath(workdir), "checkpoints"),
    options=ocp.CheckpointManagerOptions(read_only=True),
  )
  try:
    step = manager.latest_step() if update is None else int(update)
    if step is None or step not in manager.all_steps():
      raise HindsightError(f"{workdir}: no saved policy{'' if update is None else f' at {update}'}")
    template = jax.eval_shape(
      lambda: jax.tree.map(
        lambda x: jnp.stack([x] * int(config.num_seeds)), task.policy.init_params(jax.random.key(0))
      )
    )
    restored = manager.restore(
      step,
      args=ocp.args.Composite(
        policy=ocp.args.StandardRestore(
          jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), template)
        )
      ),
    )
  finally:
    manager.close()
  params = jax.tree.map(lambda x: x[seed], restored["policy"])
  env: Environment = task.env
  return env, TrainedPolicy(task.policy, params)
