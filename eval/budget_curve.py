"""How to spend a labeling budget: episodes x K at a fixed number of branch rollouts.

  python -m eval.budget_curve --config configs/reasoning.py --env reasoning \
      --points 1024x1024,2048x512,4096x256,8192x128,16384x64

For each point E x K (the same E K branch rollouts per step, so about the same env steps)
it labels E episodes at K rollouts and trains the config's model on them (WORKDIR
runs/budget/NAME_ExK, resumable like any run; an existing `--reuse ExK=WORKDIR` is taken as
is), then scores every model with the drift harness on the same fresh episodes of `--env`
against the same reference (K_ref, independent keys; one cache shared by all points).
Prints Spearman, MAE, RMSE and the mean gap with their 95% bootstrap CIs and writes
runs/budget/NAME.json.
"""

from __future__ import annotations

import argparse
import os
import time

from hindsight.devices import use_all_cpu_cores

use_all_cpu_cores()

from hindsight.config_io import load_config  # noqa: E402
from hindsight.drift import DriftConfig, run_drift  # noqa: E402
from hindsight.files import write_json  # noqa: E402
from hindsight.training import train_and_evaluate  # noqa: E402

METRICS = ("spearman", "mae", "rmse", "mean_gap", "pairwise_accuracy")


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default="configs/reasoning.py")
  p.add_argument("--env", default="reasoning", help="the fresh evaluation episodes' env")
  p.add_argument("--points", default="1024x1024,2048x512,4096x256,8192x128,16384x64")
  p.add_argument("--reuse", action="append", default=[], help="ExK=WORKDIR of a finished run")
  p.add_argument("--set", action="append", default=[], help="a.b=value for every point's run")
  p.add_argument("--episodes", type=int, default=256, help="evaluation episodes")
  p.add_argument("--reference-rollouts", type=int, default=1024)
  p.add_argument("--check-episodes", type=int, default=64,
                 help="episodes of the reference's independent check pass")  # fmt: skip
  p.add_argument("--out", default="runs/budget")
  args = p.parse_args(argv)

  name = os.path.splitext(os.path.basename(args.config))[0]
  reuse = dict(r.split("=", 1) for r in args.reuse)
  cache = os.path.join(args.out, f"{name}_cache")
  os.makedirs(cache, exist_ok=True)
  rows = []
  for point in args.points.split(","):
    episodes, rollouts = (int(x) for x in point.split("x"))
    workdir = reuse.get(point) or os.path.join(args.out, f"{name}_{point}")
    tic = time.perf_counter()
    if point not in reuse:
      config = load_config(
        args.config,
        [*args.set, f"data.label.episodes={episodes}", f"data.label.num_rollouts={rollouts}",
         "train.progress=False"],
      )  # fmt: skip
      train_and_evaluate(config, workdir)
    report = run_drift(
      DriftConfig(
        checkpoint=workdir,
        env=args.env,
        episodes=args.episodes,
        reference_rollouts=args.reference_rollouts,
        check_episodes=args.check_episodes,
        shifts=(),
        baseline_steps=0,
        gradient_env="",
        out=os.path.join(args.out, f"{name}_{point}_drift"),
        cache=cache,  # one reference for every point: the same fresh episodes
        progress=False,
      )
    )
    h = report["headline"]["model (point)"]
    row = {"episodes": episodes, "rollouts": rollouts, "workdir": workdir,
           "seconds": round(time.perf_counter() - tic, 1),
           **{m: h[m] for m in METRICS},
           "k_star": report.get("equivalent_rollouts", {}).get("k"),
           "coverage_95": report["calibration"]["coverage"]["95%"]}  # fmt: skip
    rows.append(row)
    f = lambda e: f"{e['value']:.4f} [{e['lo']:.4f}, {e['hi']:.4f}]"  # noqa: E731
    print(
      f"{episodes:>6} x {rollouts:<5} Spearman {f(row['spearman'])}  MAE {f(row['mae'])}  "
      f"mean gap {f(row['mean_gap'])}  95% cov {row['coverage_95']['value']:.3f}",
      flush=True,
    )
  write_json(os.path.join(args.out, f"{name}.json"), {"env": args.env, "points": rows})
  return {"points": rows}


if __name__ == "__main__":
  main()
