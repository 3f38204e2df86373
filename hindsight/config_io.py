"""Loads `configs/NAME.py[:ARG]` and applies `--config.a.b=VALUE` overrides (flax style,
without absl: every mistake is one line)."""

from __future__ import annotations

import ast
import importlib.util
import os

from ml_collections import ConfigDict

from hindsight.errors import HindsightError


def load_config(spec: str, overrides: list[str] = ()) -> ConfigDict:
  """`spec` is PATH or PATH:ARG; get_config(ARG) (or get_config()) builds the ConfigDict.

  overrides: ["a.b=value", ...]; the value is parsed as a Python literal when it is one and
  must match the type of the field it replaces.
  """
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise HindsightError(f"--config {path}: no such file")
  module_spec = importlib.util.spec_from_file_location(f"_config_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except Exception as e:
    raise HindsightError(f"--config {path}: {type(e).__name__}: {e}") from e
  if not hasattr(module, "get_config"):
    raise HindsightError(f"--config {path}: defines no get_config()")
  try:
    config = module.get_config(arg) if arg else module.get_config()
  except HindsightError:
    raise
  except Exception as e:
    raise HindsightError(f"--config {spec}: {type(e).__name__}: {e}") from e
  for item in overrides:
    name, sep, text = item.partition("=")
    if not sep:
      raise HindsightError(f"--config.{item}: expected --config.FIELD=VALUE")
    set_field(config, name, text)
  return config


def set_field(config: ConfigDict, name: str, text: str) -> None:
  *parents, leaf = name.split(".")
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
