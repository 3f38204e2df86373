"""Loads a config (a shipped NAME or a file, PATH.py, with an optional :ARG) and applies
`--config.a.b=VALUE` overrides (flax style, without absl: every mistake is one line)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys

from ml_collections import ConfigDict

from hindsight.errors import HindsightError, make_dir
from hindsight.labeling.config import LabelConfig

# Config fields renamed since: configs and run directories written before keep working (the
# old name is read as the new one). LabelConfig's own names in the label nodes; GAE's
# settings in the node its credit source brings (`rl.sources.outcome`).
LEGACY_CONFIG_NAMES = {
  "data.label.rollouts": "data.label.num_rollouts",
  "credit.rollouts": "label.num_rollouts",
  "credit.replacement": "label.replacement",
  "ppo.gae_lambda": "gae.lambda_",
  "ppo.value_coef": "gae.value_coef",
  "refresh.tolerance": "eval.tolerance",
  "refresh.alpha": "eval.alpha",
}


def current_name(name: str) -> str:
  """A dotted config field's name today (a field renamed since: its new name)."""
  return LEGACY_CONFIG_NAMES.get(name, name)


def current_names(flat: dict) -> dict:
  """A flattened config (a run's config.json) under today's names. LabelConfig fields a
  `label` node gained since are added at their defaults, which is what such a run labeled
  with (its labels took LabelConfig's defaults for every field it did not name)."""
  out = {current_name(k): v for k, v in flat.items()}
  nodes = {k.rsplit(".", 1)[0] for k in out if k.endswith(".num_rollouts")}
  for node in nodes:
    for field, default in LabelConfig().as_dict().items():
      out.setdefault(f"{node}.{field}", default)
  return out


def shipped_configs(prefix: str = "") -> list[str]:
  """The experiments shipped with the package (configs/ of the checkout, installed as
  hindsight.configs), by name; `prefix="rl_"` lists the RL ones."""
  import pkgutil

  import hindsight.configs

  names = sorted(m.name for m in pkgutil.iter_modules(hindsight.configs.__path__))
  return [n for n in names if n.startswith(prefix)]


def load_config(spec: str, overrides: list[str] = ()) -> ConfigDict:
  """`spec` is NAME[:ARG] (a shipped config: `shipped_configs()`) or PATH.py[:ARG] (a file);
  get_config(ARG) (or get_config()) builds the ConfigDict.

  overrides: ["a.b=value", ...]; the value is parsed as a Python literal when it is one and
  must match the type of the field it replaces.
  """
  path, _, arg = spec.partition(":")
  module = _shipped_module(path) if _is_name(path) else _file_module(path)
  if not hasattr(module, "get_config"):
    raise HindsightError(f"--config {path}: defines no get_config()")
  try:
    config = module.get_config(arg) if arg else module.get_config()
  except HindsightError:
    raise
  except Exception as e:
    raise HindsightError(f"--config {spec}: {type(e).__name__}: {e}") from e
  return apply_overrides(config, overrides)


def _is_name(path: str) -> bool:
  """A config named (`rl_reasoning`), not a path (`configs/rl_reasoning.py`, `./mine`)."""
  return path.isidentifier()


def _shipped_module(name: str):
  import importlib

  if name not in shipped_configs():
    raise HindsightError(
      f"--config {name}: no shipped config of that name (shipped: "
      f"{', '.join(shipped_configs())}; or give a file, PATH.py)"
    )
  return importlib.import_module(f"hindsight.configs.{name}")


def _file_module(path: str):
  if not os.path.isfile(path):
    stem = os.path.splitext(os.path.basename(path))[0]
    hint = f" (the shipped config: --config {stem})" if stem in shipped_configs() else ""
    raise HindsightError(f"--config {path}: no such file{hint}")
  module_spec = importlib.util.spec_from_file_location(f"_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(module_spec)
  # A config in a package (configs/__init__.py) imports its siblings (`from configs import
  # common`): the package's parent is importable while the config runs, from any cwd.
  folder = os.path.dirname(os.path.abspath(path))
  root = os.path.dirname(folder) if os.path.isfile(os.path.join(folder, "__init__.py")) else ""
  added = bool(root) and root not in sys.path
  if added:
    sys.path.insert(0, root)
  try:
    module_spec.loader.exec_module(module)
  except Exception as e:
    raise HindsightError(f"--config {path}: {type(e).__name__}: {e}") from e
  finally:
    if added:
      sys.path.remove(root)
  return module


def apply_overrides(config: ConfigDict, overrides: list[str] = ()) -> ConfigDict:
  """Sets ["a.b=value", ...] on `config` (in place; returned), each checked by `set_field`."""
  for item in overrides:
    name, sep, text = item.partition("=")
    if not sep:
      raise HindsightError(f"--config.{item}: expected --config.FIELD=VALUE")
    set_field(config, name, text)
  return config


def set_field(config: ConfigDict, name: str, text: str) -> None:
  *parents, leaf = current_name(name).split(".")
  node = config
  for part in parents:
    if part not in node or not isinstance(node[part], ConfigDict):
      raise HindsightError(f"--config.{name}: no such config field")
    node = node[part]
  if leaf not in node:
    raise HindsightError(f"--config.{name}: no such config field")
  old = node[leaf]
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    value = text
  if isinstance(old, bool) or isinstance(value, bool):
    ok = isinstance(old, bool) and isinstance(value, bool)
  elif isinstance(old, float) and isinstance(value, int):
    value, ok = float(value), True
  elif isinstance(old, str):
    value, ok = text, True
  else:
    ok = isinstance(value, type(old))
  if not ok:
    raise HindsightError(
      f"--config.{name}={text}: expected {type(old).__name__}, like the default {old!r}"
    )
  node[leaf] = value


def _flatten(cfg: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in cfg.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def check_workdir(config: ConfigDict, workdir: str, launch_fields=()) -> None:
  """A workdir belongs to one config: WORKDIR/config.json records it on the first run,
  and a later run with a different config is refused in one line. `launch_fields`
  (dotted names) may differ between launches of one run (a coordinator address)."""
  make_dir(workdir, "--workdir")
  current = {k: v for k, v in _flatten(config.to_dict()).items() if k not in launch_fields}
  path = os.path.join(workdir, "config.json")
  if os.path.isfile(path):
    with open(path) as f:
      saved = {k: v for k, v in current_names(json.load(f)).items() if k not in launch_fields}
    current_json = json.loads(json.dumps(current))
    # A field added to the configs after the run was made (absent from its config.json)
    # changes nothing while it holds its off value ("", 0, False: every new field's default).
    added_off = {k for k, v in current_json.items() if k not in saved and v in ("", 0, False)}
    diff = sorted(
      k for k in (set(saved) | set(current_json)) - added_off if saved.get(k) != current_json.get(k)
    )
    if diff:
      raise HindsightError(
        f"--workdir {workdir} holds a run of a different config ({', '.join(diff[:3])} differ)"
      )
  elif _process_index() == 0:
    with open(path + ".tmp", "w") as f:
      json.dump(current, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def _process_index() -> int:
  import jax  # here: the CLI's parser lists the shipped configs without starting JAX

  return jax.process_index()
