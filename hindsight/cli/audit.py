"""`hindsight audit`: spot-check a model against rollouts under a budget: the drift alarm, the
gap per slice, and the audited steps as labels to fine-tune on (docs/audit.md)."""

from __future__ import annotations

import argparse
import os

from hindsight.cli.options import build, option
from hindsight.cli.parser import RUN_FLAG, RUN_HELP, STEP_HELP, no_progress

NAME = "audit"
HELP = "spot-check a model against rollouts: drift alarm and labels to fine-tune on"


def shares(text: str) -> tuple[float, float, float]:
  """U:S:D -> three floats for --shares."""
  try:
    parts = tuple(float(x) for x in text.split(":"))
    if len(parts) != 3:
      raise ValueError
    return parts
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected U:S:D (three numbers), got '{text}'") from None


def add_parser(sub):
  from hindsight.audit.config import AuditConfig

  au = sub.add_parser(NAME, help=HELP)
  option(au, AuditConfig, "checkpoint", RUN_HELP, required=True, **RUN_FLAG)
  option(au, AuditConfig, "step", STEP_HELP)
  where = au.add_mutually_exclusive_group(required=True)
  option(where, AuditConfig, "env", "audit fresh episodes of this env spec (its policy)")
  option(where, AuditConfig, "trajectories",
         "a label dataset dir, or JSONL with seed and episode per line "
         "(docs/audit.md)")  # fmt: skip
  option(au, AuditConfig, "budget", "env steps the rollouts may spend (text: completions)",
         required=True, type=int)  # fmt: skip
  option(au, AuditConfig, "gap_tolerance",
         "|mean gap| allowed, in credit units (0: a tenth of the model's credit "
         "scale)")  # fmt: skip
  option(au, AuditConfig, "alpha", "false-alarm rate, any duration")
  option(au, AuditConfig, "coverage_level", "interval level checked")
  option(au, AuditConfig, "coverage_tolerance", "coverage allowed below the level")
  option(au, AuditConfig, "episodes", "pool size (--env) or most read")
  option(au, AuditConfig, "rollouts", "K branches per arm and step")
  option(au, AuditConfig, "shares", "draw shares: uniform, most uncertain, most disagreeing "
         "with the outcome", type=shares, metavar="U:S:D")  # fmt: skip
  option(au, AuditConfig, "stop_at_alarm", "stop spending once it fires")
  option(au, AuditConfig, "seed", "root of the pool, draws and rollouts")
  option(au, AuditConfig, "out", "report directory", required=True)
  option(au, AuditConfig, "endpoint", "text models: the completions endpoint to resample through")
  no_progress(au)
  return au


def run(args) -> int:
  from hindsight.audit import run_audit
  from hindsight.audit.config import AuditConfig
  from hindsight.audit.report import verdict_text

  report = run_audit(build(AuditConfig, args, progress=not args.no_progress))
  print(verdict_text(report))
  print(f"report: {os.path.join(report['out'], 'report.md')}")
  return 0
