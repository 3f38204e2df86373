"""`hindsight rl`: policies trained with PPO on a credit source, seeds vmapped (resumable), or
every source of --sources side by side (docs/rl.md)."""

from __future__ import annotations

import os

NAME = "rl"
HELP = "train policies on a credit source (PPO), or every source of --sources side by side"
TAKES_CONFIG_OVERRIDES = True


def add_parser(sub):
  from hindsight.config_io import shipped_configs

  shipped = ", ".join(shipped_configs("rl_"))
  rl = sub.add_parser(
    NAME,
    help=HELP,
    description="Trains policies with PPO on a credit source, seeds vmapped (checkpoints, "
    "TensorBoard and results.json in --workdir; rerun to resume). With --sources, each source "
    "trains into WORKDIR/SOURCE and WORKDIR/table.md compares them (docs/rl.md). Any config "
    "field is set with --config.FIELD=VALUE, e.g. --config.env=gymnax:Catch-bsuite "
    "(every field: hindsight/rl/config.py). --config rl_text trains a language model with GRPO "
    "on per-step credit instead (docs/rl.md, 'RL on a language model'; its fields: "
    "hindsight/lm/rl/config.py).",
  )
  rl.add_argument("--config", default="rl_reasoning",
                  help=f"a shipped RL config ({shipped}; rl_text trains a language model; "
                  "NAME:smoke for a tiny one) or FILE.py[:VARIANT]")  # fmt: skip
  rl.add_argument("--workdir", default="",
                  help="checkpoints, TensorBoard, results.json (required without --sources; "
                  "with them default runs/rl/ENV)")  # fmt: skip
  rl.add_argument("--sources", default="",
                  help="comma-separated credit sources to train and compare, or 'all'; "
                  "NAME@FIELD=VALUE[@...] runs a source at settings of its own (e.g. "
                  "pp_credit@pp.rho=0.05) as a row of its own (default: the config's source "
                  "alone)")  # fmt: skip
  return rl


def run(args) -> int:
  from hindsight.config_io import load_config
  from hindsight.errors import HindsightError

  overrides = args.config_overrides
  config = load_config(args.config, overrides)
  if config.get("kind") == "lm":  # a language model (rl_text: hindsight.lm.rl)
    from hindsight.lm.backbone import require_llm

    require_llm()
    from hindsight.lm.rl import experiment, trainer
    from hindsight.lm.rl.sources import text_sources as registered_sources
  else:
    from hindsight.rl import experiment, trainer
    from hindsight.rl.sources import registered_sources
  if args.sources:
    sources = registered_sources() if args.sources == "all" else args.sources.split(",")
    out = args.workdir or experiment.default_out(config)
    command = " ".join(["hindsight rl", *args.argv])
    print(experiment.run_experiment(args.config, overrides, [s for s in sources if s], out,
                                    command))  # fmt: skip
    print(f"table: {os.path.join(out, 'table.md')}")
    return 0
  if not args.workdir:
    raise HindsightError("--workdir is required (or --sources a,b,c to compare sources)")
  results = trainer.train_and_evaluate(config, args.workdir)
  print(trainer.results_text(results, os.path.join(args.workdir, "results.json")))
  return 0
