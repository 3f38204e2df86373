"""User code named on the command line as MODULE:FN (a policy, a verifier, an embedding)."""

from __future__ import annotations

import importlib

from hindsight.errors import HindsightError


def import_function(spec: str, flag: str):
  """(module, FN) of `flag MODULE:FN`; a one-line error if either cannot be had."""
  module_name, _, name = spec.partition(":")
  if not module_name or not name:
    raise HindsightError(f"{flag} {spec}: expected MODULE:FN")
  try:
    module = importlib.import_module(module_name)
    fn = getattr(module, name)
  except (ImportError, AttributeError, ValueError) as e:
    raise HindsightError(f"{flag} {spec}: cannot load it ({e})") from None
  if not callable(fn):
    raise HindsightError(f"{flag} {spec}: not callable")
  return module, fn
