"""Plug-ins: what adds itself to hindsight's registries, and user code named on the command line.

A plug-in is a module that registers things when it is imported: an environment family and
its label source, an episode format, an audit or eval backend (the text package is one:
`hindsight.text.plugin`). The registries load one by name when asked for a name they do not
know (`load`), so the core never imports a plug-in itself:

  - built-in plug-ins are declared by the package root (`hindsight/__init__.py`,
    `declare`), the one place that names them;
  - an installed package declares its own as an entry point in the group
    `hindsight.plugins` (`name = "mypackage.module"`).

`import_function` loads user code named as MODULE:FN (a policy, a verifier, an embedding).
JAX-free: `hindsight --help` loads the plug-ins that add flags.
"""

from __future__ import annotations

import importlib
import importlib.metadata

from hindsight.errors import HindsightError

ENTRY_POINT_GROUP = "hindsight.plugins"
_DECLARED: dict[str, str] = {}  # plug-in name -> module that registers it
_ON_DEMAND: set[str] = set()  # plug-ins `load_all` leaves alone
_LOADED: set[str] = set()


def declare(name: str, module: str, on_demand: bool = False) -> None:
  """Declares the module that registers plug-in `name` (imported on first `load(name)`).
  `on_demand`: only a registry's lookup of `name` loads it, never `load_all` (a plug-in that
  adds nothing the command line lists and imports JAX: the `lm_backbone` step encoder)."""
  _DECLARED[name] = module
  if on_demand:
    _ON_DEMAND.add(name)


def declared() -> tuple[str, ...]:
  """The names of the declared and installed plug-ins."""
  points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
  return tuple(dict.fromkeys([*_DECLARED, *(p.name for p in points)]))


def load(name: str) -> bool:
  """Imports plug-in `name` (its declared module, or the entry point of that name); whether
  there is one. A plug-in that fails to import is a one-line error naming it."""
  if name in _LOADED:
    return True
  module = _DECLARED.get(name)
  if module is None:
    found = [p for p in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if p.name == name]
    if not found:
      return False
    module = found[0].value
  try:
    importlib.import_module(module)
  except Exception as e:  # a plug-in's own failure, said in one line
    raise HindsightError(f"plug-in '{name}' ({module}) failed to load ({e})") from None
  _LOADED.add(name)
  return True


def load_all() -> None:
  """Imports every declared and installed plug-in (what lists every registered name)."""
  for name in declared():
    if name not in _ON_DEMAND:
      load(name)


class Registry(dict):
  """A registry a plug-in may add to: name -> what was registered, in registration order.
  `lookup` of a name it does not hold loads the plug-in of that name first (`load`)."""

  def lookup(self, name: str, default=None):
    """The value registered as `name` (after loading its plug-in), else `default`."""
    if name and name not in self:
      load(name)
    return self.get(name, default)


def import_function(spec: str, flag: str):
  """(module, FN) of `flag MODULE:FN`; a one-line error if either cannot be had. MODULE is
  imported from the Python path with the working directory first on it (as `python -m`
  does): a `myverify.py` beside the command is found without PYTHONPATH."""
  import os
  import sys

  module_name, _, name = spec.partition(":")
  if not module_name or not name:
    raise HindsightError(f"{flag} {spec}: expected MODULE:FN")
  here = os.getcwd()
  if here not in sys.path and "" not in sys.path:
    sys.path.insert(0, here)
  try:
    module = importlib.import_module(module_name)
    fn = getattr(module, name)
  except (ImportError, AttributeError, ValueError) as e:
    where = f"; MODULE is looked up in {here} and on PYTHONPATH" * isinstance(e, ImportError)
    raise HindsightError(f"{flag} {spec}: cannot load it ({e}{where})") from None
  if not callable(fn):
    raise HindsightError(f"{flag} {spec}: not callable")
  return module, fn
