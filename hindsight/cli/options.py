"""CLI flags made from the dataclasses the library takes: one source for each option's default.

`option(parser, Cls, "field", "help")` adds `--field` (underscores as dashes, or `flag=`)
whose default is `Cls.field`'s and whose type is the default's (help defaults to the
field's metadata["help"]); `dataclass_flags(parser, Cls)` adds one for every field that
documents itself that way; `build(Cls, args, ...)` makes the dataclass from every parsed flag
that names one of its fields. Every command declares its flags through these.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

# Field name -> the flag that sets it, for every `option` added: library errors name the
# field (`num_rollouts must be >= 2`), the CLI says the flag the user typed (`in_flag_terms`).
_FLAGS: dict[str, str] = {}


def field_default(cls, name: str) -> Any:
  """The default of dataclass `cls`'s field `name` (KeyError if it has none)."""
  field = {f.name: f for f in dataclasses.fields(cls)}[name]
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  raise KeyError(f"{cls.__name__}.{name} has no default")


def option(
  parser, cls, name: str, help: str | None = None, *, flag: str | None = None, aliases=(), **kwargs
) -> None:
  """`--name` for field `name` of `cls`, defaulting to the field's default. A bool field
  that defaults to False becomes a switch, a tuple field a repeatable flag; other types parse
  as their default's type (pass `type=` for anything else, `required=True` or `default=` for
  a field without a default). `help`: default the field's metadata["help"]. `aliases`: other flags
  that set the same field (older names kept working)."""
  flag = flag or "--" + name.replace("_", "-")
  _FLAGS.setdefault(name, flag)
  flags = (flag, *aliases)
  if help is None:
    help = {f.name: f for f in dataclasses.fields(cls)}[name].metadata.get("help")
  if kwargs.get("required"):
    parser.add_argument(*flags, dest=name, help=help, **kwargs)
    return
  default = kwargs.pop("default") if "default" in kwargs else field_default(cls, name)
  if default is False and "type" not in kwargs:
    parser.add_argument(*flags, dest=name, action="store_true", help=help, **kwargs)
    return
  if isinstance(default, tuple) and "type" not in kwargs and "action" not in kwargs:
    parser.add_argument(*flags, dest=name, action="append", default=[], help=help, **kwargs)
    return
  if default is not None and "type" not in kwargs and "action" not in kwargs:
    kwargs["type"] = type(default)
  parser.add_argument(*flags, dest=name, default=default, help=help, **kwargs)


def dataclass_flags(parser, cls, skip=()) -> None:
  """A flag (`option`) for every field of `cls` whose metadata carries its help, but `skip`."""
  for f in dataclasses.fields(cls):
    if f.name not in skip and "help" in f.metadata:
      option(parser, cls, f.name)


def build(cls, args: argparse.Namespace, **values):
  """`cls(**fields)` from the parsed flags that name its fields, then `values` on top (a
  repeatable flag's list as a tuple, as its field holds it)."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  given = {k: v for k, v in vars(args).items() if k in fields}
  for name, value in given.items():
    if isinstance(value, list) and isinstance(fields[name].default, tuple):
      given[name] = tuple(value)
  return cls(**{**given, **values})


def changed_fields(cls, args: argparse.Namespace) -> list[str]:
  """The fields of `cls` whose flags were given a value other than their default."""
  out = []
  for f in dataclasses.fields(cls):
    value = getattr(args, f.name, f.default)
    if value not in (f.default, [], ()):
      out.append(f.name)
  return out


def split_overrides(rest: list[str]) -> tuple[list[str], list[str], str]:
  """(FIELD=VALUE of every `--config.FIELD=VALUE` or `--config.FIELD VALUE`, the other
  leftovers, the first `--config.FIELD` given without a value or "")."""
  out, other, bare = [], [], ""
  items = iter(rest)
  for item in items:
    if not item.startswith("--config."):
      other.append(item)
      continue
    field = item[len("--config.") :]
    if "=" not in field:
      value = next(items, None)
      if value is None or value.startswith("--"):
        bare = bare or item
        if value is not None:
          other.append(value)
        continue
      field = f"{field}={value}"
    out.append(field)
  return out, other, bare


def config_overrides(rest: list[str], prog: str) -> list[str] | None:
  """The FIELD=VALUE of every `--config.FIELD=VALUE` (or `--config.FIELD VALUE`, as argparse
  reads any other flag) left over by parse_known_args; None (after one line on stderr naming
  it) when something else is left over. JAX-free: the training programs call it before JAX
  starts."""
  import sys

  out, other, bare = split_overrides(rest)
  if other:
    print(f"{prog}: error: unknown argument {other[0]} (config fields are set with "
          f"--config.FIELD=VALUE)", file=sys.stderr)  # fmt: skip
    return None
  if bare:
    print(f"{prog}: error: {bare} needs a value: {bare}=VALUE", file=sys.stderr)
    return None
  return out


def in_flag_terms(message: str) -> str:
  """A library error that starts with a field's name, said with the field's flag instead
  (`num_rollouts must be >= 2` -> `--rollouts must be >= 2`); any other message as it is."""
  head, sep, tail = message.partition(" ")
  flag = _FLAGS.get(head)
  return flag + sep + tail if flag else message
