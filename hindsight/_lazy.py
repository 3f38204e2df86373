"""Lazy package attributes (PEP 562): a package's public names load their module on first
use, so importing one light module of a package (its config) does not import the rest."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, homes: dict[str, str]):
  """(__getattr__, __dir__) for a package whose names live in `homes` {name: module}."""

  def __getattr__(name: str):
    home = homes.get(name)
    if home is None:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals_of(package)[name] = value  # later lookups skip this function
    return value

  def __dir__():
    return sorted(set(globals_of(package)) | set(homes))

  return __getattr__, __dir__


def globals_of(package: str) -> dict:
  import sys

  return vars(sys.modules[package])
