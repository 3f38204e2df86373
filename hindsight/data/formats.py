"""Episode formats: how an episode given as JSON (a line of `hindsight score`'s input, an HTTP
body, a dict in Python) becomes an `Episode` for a model.

Every model reads the export format (`ARRAYS`: observations, actions, rewards, ...) by
`Episode.parse` itself. A model whose step encoder reads another format names it
(`StepEncoder.episode_format`), and the package that defines that format registers its parser
here: the text plug-in registers `text` (steps, text or step_text, with an outcome), so this
package imports nothing of it. A format not registered yet is looked up as a plug-in of the
same name (`hindsight.plugins`).

JAX-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hindsight import plugins
from hindsight.errors import HindsightError

ARRAYS = "arrays"  # the export format, parsed by `Episode.parse` itself
_PARSERS: plugins.Registry = plugins.Registry()  # name -> parse


def register_format(name: str, parse: Callable[[Any, Any, str], Any]) -> None:
  """Registers parse(episode, spec, where) -> Episode for episodes of format `name`; bad
  input raises a one-line HindsightError naming `where` and the field."""
  _PARSERS[name] = parse


def format_parser(name: str) -> Callable[[Any, Any, str], Any]:
  """The parser of format `name` (loading the plug-in of that name if needed)."""
  parse = _PARSERS.lookup(name)
  if parse is None:
    raise HindsightError(f"episodes of format '{name}': no parser is registered for it")
  return parse
