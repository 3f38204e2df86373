"""`hindsight eval`: the drift report of a training run (or an ensemble): the model, its
training labels and every baseline against the reference credit (`hindsight.drift`)."""

from __future__ import annotations

import os

from hindsight.cli.options import build, option
from hindsight.cli.parser import RUN_FLAG, RUN_HELP, STEP_HELP, no_progress

NAME = "eval"
HELP = "drift report: a trained model and every baseline against the reference"


def add_parser(sub):
  from hindsight.drift.config import REFERENCES, DriftConfig

  ev = sub.add_parser(NAME, help=HELP)
  option(ev, DriftConfig, "checkpoint", RUN_HELP, required=True, **RUN_FLAG)
  option(ev, DriftConfig, "step", STEP_HELP)
  option(ev, DriftConfig, "env", "evaluate fresh episodes of this env spec (default: test split)")
  option(ev, DriftConfig, "episodes", "episodes (0: the whole test split)")
  option(ev, DriftConfig, "reference", "the reference credit: exact (a tabular MDP's or the "
         "text world's dynamic programme), resample, or auto (exact where it exists)",
         choices=REFERENCES)  # fmt: skip
  option(ev, DriftConfig, "reference_rollouts",
         "K of the reference relabel (0: RMS stderr about --reference-fraction of the "
         "spread; 256 for text)")  # fmt: skip
  option(ev, DriftConfig, "reference_fraction", "see above")
  option(
    ev,
    DriftConfig,
    "endpoint",
    "runs labeled through a completions endpoint (text): where the reference resamples",
  )
  option(ev, DriftConfig, "check_episodes", "episodes of the check pass")
  ev.add_argument(
    "--shift",
    action="append",
    help="OOD env spec to slice by (repeatable; default per environment, 'none' for none)",
  )
  option(ev, DriftConfig, "shift_episodes",
         "episodes per shifted set (0: as many as evaluated, within 32-128)")  # fmt: skip
  option(ev, DriftConfig, "baseline_steps",
         "steps per learned baseline (-1: 20 passes over the training split, within "
         "100-1000; 0: no learned baselines)")  # fmt: skip
  option(ev, DriftConfig, "gradient_env",
         "tabular env spec of the policy-gradient table (auto: the run's own environment "
         "when it is a tabular MDP; 'none' for none)")  # fmt: skip
  option(ev, DriftConfig, "gradient_episodes", "episodes of that table")
  option(ev, DriftConfig, "bootstrap", "bootstrap resamples per CI")
  option(ev, DriftConfig, "seed", "seed of fresh episode sets (--env, shifts), the bootstrap and "
         "baselines")  # fmt: skip
  option(ev, DriftConfig, "versus", "another run scored on the same episodes and reference "
         "(its own row: 'other model (point)')")  # fmt: skip
  option(ev, DriftConfig, "out", "report directory (default: CHECKPOINT/drift)")
  option(ev, DriftConfig, "cache",
         "directory of cached episodes and references (default: OUT/cache); share one "
         "between models evaluated on the same episodes")  # fmt: skip
  no_progress(ev, "no progress bars")
  return ev


def run(args) -> int:
  from hindsight.drift import run_drift
  from hindsight.drift.config import DriftConfig
  from hindsight.drift.render import headline_text

  shifts = None if not args.shift else tuple(s for s in args.shift if s != "none")
  gradient_env = "" if args.gradient_env == "none" else args.gradient_env
  cfg = build(DriftConfig, args, shifts=shifts, gradient_env=gradient_env,
              progress=not args.no_progress)  # fmt: skip
  report = run_drift(cfg)
  print(headline_text(report))
  print(f"report: {os.path.join(report['out'], 'report.md')}")
  return 0
