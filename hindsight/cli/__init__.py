"""The `hindsight` command: one module per command in this package, each declaring its flags
from the library's own dataclasses (`add_parser`) and running them (`run`).

  hindsight label   --env SPEC --episodes N --rollouts K --replacement Q --seed S --out DIR
                    (text traces: --env text:FILE.jsonl --endpoint URL --model NAME ...)
  hindsight train   --labels DIR --workdir WORKDIR [--config NAME|FILE.py[:VARIANT]]
                    [--config.FIELD=VALUE ...]   (the credit model; resumable)
  hindsight rl      --workdir WORKDIR [--config NAME|FILE.py[:VARIANT]] [--sources a,b,c]
                    [--config.FIELD=VALUE ...]   (policies trained on credit; resumable)
  hindsight export  DIR --format jsonl
  hindsight summary DIR
  hindsight coalition --values FILE.npy   (Shapley values, interactions, dividends)
  hindsight eval    --run WORKDIR [--env SPEC] [--episodes N] [--out DIR]   (the drift report)
  hindsight score   --run WORKDIR --input FILE.jsonl|DATASET --out FILE.jsonl
  hindsight serve   --run WORKDIR [--host H] [--port P]   (POST /v1/credit)
  hindsight audit   --run WORKDIR (--env SPEC | --trajectories FILE|DATASET) --budget N
                    [--gap-tolerance EPS] [--alpha A] --out DIR
  hindsight import  thought-anchors DIR --out OUT   (their resamples as a label dataset)
  hindsight text-world serve|prompts|exact   (a local model whose credit is exact)
  hindsight lm train --workdir W [--lm PATH] | serve (--workdir W | --lm PATH)
                    | export RUN --out DIR   (a Qwen2 / Llama 3 language model: the llm extra)

--run names a training run's directory (--checkpoint, its older name, works the same).
Bad input exits with code 2 and one line on stderr: `hindsight: error: <what is wrong>`.
Building the parser starts no JAX: every command imports what it runs when it runs.
"""

from __future__ import annotations

import argparse
import sys

from hindsight.cli import (
  audit,
  coalition,
  evaluate,
  export,
  imports,
  label,
  lm,
  rl,
  score,
  serve,
  summary,
  text_world,
  train,
)
from hindsight.cli.options import in_flag_terms, split_overrides
from hindsight.cli.parser import Parser

# The commands in --help's order; a new one is a module with NAME, HELP, add_parser and run.
COMMANDS = (label, train, rl, export, summary, coalition, evaluate, score, serve, audit,
            imports, text_world, lm)  # fmt: skip


def build_parser() -> Parser:
  """The whole `hindsight` parser (JAX-free)."""
  p = Parser(prog="hindsight", description="Interventional credit for every step.")
  sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
  for command in COMMANDS:
    command.add_parser(sub)
  return p


_parser = build_parser  # the name tests and older scripts use


def _did_you_mean(parser: Parser, args, rest: list[str]) -> str:
  """ " (did you mean --FLAG?)" for the first unknown flag close to one of the command's."""
  import difflib

  sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
  flags = list(sub.choices[args.command]._option_string_actions)
  for word in rest:
    if word.startswith("--"):
      close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1)
      if close:
        return f" (did you mean {close[0]}?)"
  return ""


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args, rest = parser.parse_known_args(argv)
  args.argv = list(sys.argv[1:] if argv is None else argv)[1:]
  command = next(c for c in COMMANDS if args.command == c.NAME)
  # `hindsight train` and `hindsight rl` take --config.FIELD=VALUE overrides (or
  # --config.FIELD VALUE); nothing else may be unknown.
  args.config_overrides, bare = [], ""
  if getattr(command, "TAKES_CONFIG_OVERRIDES", False):
    args.config_overrides, rest, bare = split_overrides(rest)
  if rest:
    parser.error(f"unrecognized arguments: {' '.join(rest)}{_did_you_mean(parser, args, rest)}")
  if bare:
    parser.error(f"{bare} needs a value: {bare}=VALUE")
  from hindsight.devices import use_all_cpu_cores

  use_all_cpu_cores()
  from hindsight import interrupts
  from hindsight.compile_cache import enable_compilation_cache
  from hindsight.errors import report_errors

  interrupts.install()
  enable_compilation_cache()
  try:
    return report_errors("hindsight", command.run, args, words=in_flag_terms)
  except KeyboardInterrupt:
    # A server stops; a job resumes when rerun (a command module's `interrupted` says which).
    said = getattr(command, "interrupted", None)
    message = said(args) if said else "interrupted (rerun the same command to resume)"
    print(f"hindsight: {message}", file=sys.stderr)
    return 130
  except BrokenPipeError:
    # `hindsight export DIR | head`: the reader left; that is not an error.
    sys.stderr.close()
    return 0


__all__ = ["COMMANDS", "build_parser", "main"]
