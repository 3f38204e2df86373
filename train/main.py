"""Trains and evaluates the credit model.

  python -m train.main --config configs/reasoning.py[:smoke] --workdir runs/reasoning \
      [--config.train.steps=500 ...]

Bad input exits 2 with one line on stderr; SIGTERM saves a checkpoint and exits 143.
"""

from __future__ import annotations

import argparse
import logging
import sys

EPILOG = """\
configs: reasoning (make demo), key_to_door, tabular, team, generic, by name (--config
  reasoning) or as files (--config configs/reasoning.py); generic needs
  --config.data.labels_dir=DIR, the --out of `hindsight label`. The same from an installed
  package: hindsight train --config NAME.
variants: NAME is the experiment as documented in its docstring; NAME:smoke is a tiny
  version (few episodes, a small model, 40 steps) for tests.
overrides: --config.FIELD=VALUE sets any field, e.g. --config.train.steps=500
  --config.model.width=128 --config.data.labels_dir=runs/demo/labels; every field and its
  meaning is listed, commented, in hindsight/default_config.py. A workdir refuses a
  different config.
"""


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="train.main",
    description=__doc__.splitlines()[0],
    epilog=EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    "--config", required=True, help="NAME or configs/NAME.py, with :VARIANT (see below)"
  )
  parser.add_argument("--workdir", required=True, help="checkpoints, logs and the report")
  args, rest = parser.parse_known_args(argv)
  from hindsight.cli.options import config_overrides

  overrides = config_overrides(rest, "train")
  if overrides is None:
    return 2
  logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
  from hindsight.devices import use_all_cpu_cores

  use_all_cpu_cores()  # before JAX starts: labeling and data parallelism use every core

  from hindsight.compile_cache import enable_compilation_cache
  from hindsight.errors import report_errors

  enable_compilation_cache()

  def run() -> int:
    from hindsight.config_io import load_config
    from hindsight.training import run_training

    return run_training(load_config(args.config, overrides), args.workdir)

  return report_errors("train", run)


if __name__ == "__main__":
  sys.exit(main())
