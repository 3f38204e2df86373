"""How often does the audit's drift alarm fire on a good model? (Its false-alarm rate.)

  python eval/audit_false_alarm.py --checkpoint runs/demo --env reasoning \
      --audits 100 --budget 1000000 --gap-tolerance 0.005 --coverage-tolerance 0.05

Runs `--audits` independent audits of the model on its own environment (audit a uses seed
a: a fresh pool of episodes, its own draws and rollouts), each to its full budget, and counts
those whose alarm fired at any point. The alarm is built to fire in at most alpha of them
whatever the budget, *if the model is within tolerance*; so the same run also reports one
long audit (`--check-budget`) whose final confidence sequences show where the model's mean
gap and coverage lie. Prints the rate with its 95% Clopper-Pearson interval and writes
OUT/false_alarm.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

from scipy import stats
from tqdm import tqdm

from hindsight.audit import AuditConfig
from hindsight.audit import pool as pool_lib
from hindsight.audit.runner import audit_pool, prepare_audit, tolerance_of
from hindsight.files import write_json


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
  a = (1 - confidence) / 2
  lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
  hi = 1.0 if k == n else float(stats.beta.ppf(1 - a, k + 1, n - k))
  return lo, hi


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--checkpoint", default="runs/demo", help="a training run (default runs/demo)")
  p.add_argument("--env", default="reasoning", help="its own environment (default reasoning)")
  p.add_argument("--audits", type=int, default=100, help="independent audits (default 100)")
  p.add_argument("--budget", type=int, default=1_000_000, help="env steps per audit")
  p.add_argument("--check-budget", type=int, default=20_000_000, help="the long audit's budget")
  p.add_argument("--episodes", type=int, default=256, help="pool size of each audit")
  p.add_argument("--rollouts", type=int, default=32, help="K per arm")
  p.add_argument("--gap-tolerance", type=float, default=0.005, help="|mean gap| allowed")
  p.add_argument("--alpha", type=float, default=0.05, help="the alarm's stated false-alarm rate")
  p.add_argument("--coverage-tolerance", type=float, default=0.05, help="below the 90% level")
  p.add_argument("--out", default="", help="output directory (default CHECKPOINT/audit_eval)")
  args = p.parse_args(argv)

  base = AuditConfig(
    checkpoint=args.checkpoint,
    budget=args.budget,
    out="",
    env=args.env,
    episodes=args.episodes,
    rollouts=args.rollouts,
    gap_tolerance=args.gap_tolerance,
    alpha=args.alpha,
    coverage_tolerance=args.coverage_tolerance,
    progress=False,
  )
  base.check()
  predictor, _, spec, labeler, _ = prepare_audit(base)
  engine = labeler.labeler  # the functional environment's (`audit.backend.RolloutSteps`)
  tolerance = tolerance_of(base, predictor)
  tic = time.perf_counter()
  fired, firing, draws = 0, [], []
  for a in tqdm(range(args.audits), desc="audits", unit="audit"):
    cfg = dataclasses.replace(base, seed=a)
    pool = pool_lib.from_env(engine, spec, args.episodes, a)
    res = audit_pool(cfg, predictor, labeler, pool, tolerance)
    draws.append(res.draws.size)
    if res.trace.first is not None:
      fired += 1
      firing.append({"seed": a, "after_draws": res.trace.first + 1, "reason": res.trace.reason})
  seconds = time.perf_counter() - tic
  lo, hi = clopper_pearson(fired, args.audits)
  check_cfg = dataclasses.replace(base, seed=10_000, budget=args.check_budget)
  check = audit_pool(
    check_cfg, predictor, labeler, pool_lib.from_env(engine, spec, 2048, 10_000), tolerance
  )
  t = check.trace
  result = {
    "checkpoint": os.path.abspath(args.checkpoint),
    "env": spec,
    "audits": args.audits,
    "budget": args.budget,
    "tolerance": tolerance,
    "coverage_floor": 0.9 - args.coverage_tolerance,
    "alpha": args.alpha,
    "fired": fired,
    "false_alarm_rate": fired / args.audits,
    "ci95": [lo, hi],
    "firings": firing,
    "mean_draws_per_audit": sum(draws) / len(draws),
    "seconds": round(seconds, 1),
    "long_audit": {
      "budget": args.check_budget,
      "draws": check.draws.size,
      "gap_confidence_sequence": [float(t.gap_lower[-1]), float(t.gap_upper[-1])],
      "coverage_upper_bound": float(t.coverage_upper[-1]),
      "coverage_mean": float(check.terms[1].mean()),
      "slice_confidence_sequences": {k: list(v) for k, v in t.final_slice_bounds().items()},
      "alarm": t.first is not None,
      "reason": t.reason,
    },
  }
  out = args.out or os.path.join(args.checkpoint, "audit_eval")
  os.makedirs(out, exist_ok=True)
  write_json(os.path.join(out, "false_alarm.json"), result)
  lg = result["long_audit"]
  print(
    f"false alarms: {fired} of {args.audits} audits ({args.budget:.3g} env steps, "
    f"{result['mean_draws_per_audit']:.0f} draws each) = {fired / args.audits:.3f} "
    f"[95% CI {lo:.3f}, {hi:.3f}] (stated alpha {args.alpha}); {seconds:.0f} s\n"
    f"the model is within tolerance: a {args.check_budget:.3g}-step audit ({lg['draws']} draws) "
    f"ends with mean gap in [{lg['gap_confidence_sequence'][0]:+.4f}, "
    f"{lg['gap_confidence_sequence'][1]:+.4f}] (tolerance +-{tolerance:.4g}), coverage "
    f"{lg['coverage_mean']:.3f} (floor {result['coverage_floor']:.2f}); alarm: {lg['alarm']} "
    f"{lg['reason']}".rstrip()
  )
  print("  per-tag mean gap (the alarm's slices): " + ", ".join(
    f"{k} [{lo:+.4f}, {hi:+.4f}]" for k, (lo, hi) in lg["slice_confidence_sequences"].items()
  ))  # fmt: skip
  return result


if __name__ == "__main__":
  main()
