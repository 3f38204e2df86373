"""`hindsight train`: the credit model on a label dataset (resumable); any config field is
set with --config.FIELD=VALUE."""

from __future__ import annotations

NAME = "train"
HELP = "train the credit model on a label dataset"
TAKES_CONFIG_OVERRIDES = True


def add_parser(sub):
  from hindsight.config_io import shipped_configs

  shipped = ", ".join(n for n in shipped_configs() if not n.startswith("rl_") and n != "generic")
  trn = sub.add_parser(
    NAME,
    help=HELP,
    description="Trains the credit model (checkpoints, logs and report.json in --workdir; "
    "rerun to resume). Any config field is set with --config.FIELD=VALUE, e.g. "
    "--config.train.steps=500 (every field: hindsight/default_config.py).",
  )
  trn.add_argument("--labels", default="", help="label dataset (--out of `hindsight label`)")
  trn.add_argument("--workdir", required=True, help="checkpoints, logs and the report")
  trn.add_argument(
    "--config",
    default="",
    help=f"a shipped config ({shipped}; NAME:smoke for a tiny one) or FILE.py[:VARIANT] "
    "(default: the generic config, on --labels)",
  )
  return trn


def run(args) -> int:
  import logging

  from hindsight.config_io import apply_overrides, load_config
  from hindsight.default_config import generic_config
  from hindsight.errors import HindsightError
  from hindsight.training import run_training

  logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
  overrides = args.config_overrides
  if args.config:
    config = load_config(args.config, overrides)
  else:
    config = apply_overrides(generic_config(), overrides)
  if args.labels:
    config.data.labels_dir = args.labels
  if not config.data.labels_dir and not config.data.label.env:
    raise HindsightError("--labels DIR is required (the --out of `hindsight label`)")
  return run_training(config, args.workdir)
