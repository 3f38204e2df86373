"""`hindsight score`: batch-score a JSON-lines file (the export format, or text traces) or a
label dataset with a trained model; the output is written atomically."""

from __future__ import annotations

from hindsight.cli.options import build, option
from hindsight.cli.parser import RUN_FLAG, RUN_HELP, STEP_HELP, no_progress

NAME = "score"
HELP = "batch-score a JSONL file or a label dataset"


def add_parser(sub):
  from hindsight.serving.config import ScoreConfig

  sc = sub.add_parser(NAME, help=HELP)
  option(sc, ScoreConfig, "checkpoint", RUN_HELP, required=True, **RUN_FLAG)
  option(sc, ScoreConfig, "step", STEP_HELP)
  option(sc, ScoreConfig, "input", "JSONL (export format) or a dataset dir", required=True)
  option(sc, ScoreConfig, "out", "output JSONL (written atomically)", required=True)
  option(sc, ScoreConfig, "allow_longer",
         "score episodes longer than the model was trained on too (their positions past it "
         "reuse the last one it knows)")  # fmt: skip
  no_progress(sc)
  return sc


def run(args) -> int:
  from hindsight.serving.batch import score_run
  from hindsight.serving.config import ScoreConfig

  cfg = build(ScoreConfig, args, progress=not args.no_progress)
  print(f"scored {score_run(cfg)} episodes: {cfg.out}")
  return 0
