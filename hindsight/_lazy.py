"""Lazy package attributes (PEP 562): a package's public names load their module on first
use, so importing one light module of a package (its config) does not import the rest."""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, homes: dict[str, str]):
  """(__getattr__, __dir__) for a package whose names live in `homes` {name: module}; a
  name whose home is the submodule `package.name` is that module itself."""

  def __getattr__(name: str):
    home = homes.get(name)
    if home is None:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = importlib.import_module(home)
    value = module if home == f"{package}.{name}" else getattr(module, name)
    vars(sys.modules[package])[name] = value  # later lookups skip this function
    return value

  def __dir__():
    return sorted(set(vars(sys.modules[package])) | set(homes))

  return __getattr__, __dir__
