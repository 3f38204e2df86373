"""Trains and evaluates the credit model.

  python -m train.main --config configs/reasoning.py[:smoke] --workdir runs/reasoning \
      [--config.train.steps=500 ...]

Bad input exits 2 with one line on stderr; SIGTERM saves a checkpoint and exits 143.
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="train.main", description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True, help="configs/NAME.py[:ARG]")
  parser.add_argument("--workdir", required=True, help="checkpoints, logs and the report")
  args, rest = parser.parse_known_args(argv)
  overrides = []
  for item in rest:
    if not item.startswith("--config."):
      print(f"train: error: unknown argument {item}", file=sys.stderr)
      return 2
    overrides.append(item[len("--config.") :])
  logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
  from hindsight.cli import use_all_cpu_cores

  use_all_cpu_cores()  # before JAX starts: labeling and data parallelism use every core

  from hindsight.errors import HindsightError

  try:
    from train.config_io import load_config
    from train.train import train_and_evaluate

    report = train_and_evaluate(load_config(args.config, overrides), args.workdir)
  except HindsightError as e:
    print(f"train: error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  if report.get("preempted"):
    print(f"preempted: checkpoint saved at step {report['step']}", file=sys.stderr)
    return 143
  print(report["summary"])
  return 0


if __name__ == "__main__":
  sys.exit(main())
