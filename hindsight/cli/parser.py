"""The `hindsight` command's argparse parser: usage mistakes are one line (exit 2) like every
other bad input, --help shows every default, and the flag types several commands share."""

from __future__ import annotations

import argparse
import difflib
import sys


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """Shows `(default: X)` where there is a default worth showing (not for required flags,
  switches that default to off, or flags without one)."""

  def _get_help_string(self, action):
    if action.required or action.default in (None, False, []) or action.help is None:
      return action.help
    return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
  """argparse, but usage mistakes are one line (and exit 2) like every other bad input, and
  --help shows every default."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("formatter_class", DefaultsFormatter)
    kwargs.setdefault("allow_abbrev", False)  # --rollout is not --rollouts
    super().__init__(*args, **kwargs)
    self._given: list[str] = []

  def parse_known_args(self, args=None, namespace=None):
    self._given = list(sys.argv[1:] if args is None else args)
    return super().parse_known_args(args, namespace)

  def error(self, message):
    # argparse checks required flags before it reports unknown ones: a typo (--episods)
    # read as "--episodes is required". Name the unknown flag first.
    unknown = [
      a.split("=", 1)[0]
      for a in self._given
      if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions
    ]
    if unknown and "required" in message:
      close = difflib.get_close_matches(unknown[0], list(self._option_string_actions), n=1)
      message = f"unknown flag {unknown[0]}" + (f" (did you mean {close[0]}?)" if close else "")
    elif message.endswith("expected one argument"):
      message += " (a value that starts with '-' goes after '=': --return-range=-1:1)"
    self.exit(2, f"hindsight: error: {message} (see `{self.prog} --help`)\n")


def return_range(text: str) -> tuple[float, float]:
  """LO:HI -> (lo, hi) for --return-range."""
  lo, sep, hi = text.partition(":")
  try:
    if not sep:
      raise ValueError
    return float(lo), float(hi)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected LO:HI, got '{text}'") from None


# A training run's directory: --run, with --checkpoint (its name before) as an alias.
RUN_FLAG = {"flag": "--run", "aliases": ("--checkpoint",), "metavar": "RUN"}
RUN_HELP = "a training run's --workdir (alias: --checkpoint; A,B,C for an ensemble in eval)"
STEP_HELP = "checkpoint step: run (the step the training run scored), best, last or a number"


def no_progress(parser, what: str = "no progress bar") -> None:
  parser.add_argument("--no-progress", action="store_true", help=what)
