"""Why the credit model misses the reference: one change at a time, each scored by the harness.

  python -m eval.ablations --config configs/reasoning.py --labels runs/demo/labels \
      --reuse baseline=runs/demo [--only beta0,beta1] [--set train.steps=3000] [--out runs/ablate]

Every variant trains the config with one change (a hypothesis about what limits the model:
capacity, the loss's beta-NLL weight, its label-noise term and exact-zero mixture, the
training length, the checkpoint selection) on the same labels, the same split and the same
seed, and is scored by the drift harness on the same held-out test episodes against one
reference (K_ref, independent keys; one cache for all: computed once). Variants with their
own labels (`labels=`, e.g. the oracle that sees the latent competence) are scored on their
own test split. WORKDIRs are OUT/CONFIG/NAME, resumable; `--reuse NAME=WORKDIR` takes a
finished run as is. Prints one row per variant (Spearman, MAE, RMSE, mean gap, equivalent
rollouts K*, 95% coverage, the worst per-tag gap) and writes OUT/CONFIG.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from hindsight.devices import use_all_cpu_cores

use_all_cpu_cores()

from hindsight.config_io import load_config  # noqa: E402
from hindsight.drift import DriftConfig, run_drift  # noqa: E402
from hindsight.files import write_json  # noqa: E402
from hindsight.training import train_and_evaluate  # noqa: E402

# name: (hypothesis, config overrides; "step=" picks the scored checkpoint, "labels=" a label
# job of its own: an env spec labeled like the config's).
VARIANTS = {
  "reasoning": {
    "baseline": ("the config as is", []),
    "last": ("checkpoint selection: the last checkpoint, not the best", ["step=last"]),
    "beta0": ("loss: plain NLL (beta 0)", ["loss.beta=0.0"]),
    "beta1": ("loss: beta 1 (mean fitted like an MSE)", ["loss.beta=1.0"]),
    "no_noise": ("loss: no label-noise term", ["loss.no_label_noise=True"]),
    "no_zero": ("loss: no exact-zero head", ["loss.zero_weight=0.0"]),
    "zero_ties": ("loss: exact-zero head also on tied labels", ["loss.zero_ties=True"]),
    "wide": ("capacity: width 128, depth 4", ["model.width=128", "model.depth=4"]),
    "long": ("training length: 9000 steps", ["train.steps=9000"]),
    "longer": ("training length: 18000 steps", ["train.steps=18000"]),
    "short": ("training length: 1000 steps", ["train.steps=1000"]),
    "lr3e-4": ("optimizer: learning rate 3e-4", ["optim.learning_rate=3e-4"]),
    "dropout": ("regularisation: dropout 0.1", ["model.dropout=0.1"]),
    "ensemble2": ("ensembles: the baseline and one more member", ["members=2"]),
    "ensemble4": ("ensembles: the baseline and three more members", ["members=4"]),
    "oracle_c": (
      "inputs: the latent competence shown (an oracle; its own labels)",
      ["labels=reasoning:show_competence=1"],
    ),
  },
  "key_to_door": {
    "baseline": ("the config as is", []),
    "zero_exact_only": (
      "loss: exact-zero head only on stderr-0 labels (not on tied branches)",
      ["loss.zero_ties=False"],
    ),
    "beta0": ("loss: plain NLL (beta 0)", ["loss.beta=0.0"]),
    "beta1": ("loss: beta 1", ["loss.beta=1.0"]),
    "last": ("checkpoint selection: the last checkpoint", ["step=last"]),
  },
}
METRICS = ("spearman", "mae", "rmse", "mean_gap")


def summarize(report: dict) -> dict:
  """The numbers one row prints, from a drift report."""
  h = report["headline"]["model (point)"]
  row = {m: h[m] for m in METRICS}
  row["k_star"] = report.get("equivalent_rollouts", {}).get("k")
  row["coverage_95"] = report["calibration"]["coverage"]["95%"]
  tags = report.get("tag_means", {})
  rel = lambda kv: kv[1]["model (point)"]["relative"] or 0.0  # noqa: E731
  worst = max(tags.items(), key=rel, default=None)
  if worst:
    row["worst_tag"] = {"tag": worst[0], **worst[1]["model (point)"]}
  return row


def row_text(name: str, row: dict) -> str:
  f = lambda e, s=".4f": f"{e['value']:{s}} [{e['lo']:{s}}, {e['hi']:{s}}]"  # noqa: E731
  k = row["k_star"]
  worst = row.get("worst_tag")
  w = f"{worst['tag']} {worst['gap']['value']:+.4f} ({worst['relative'] or 0:.0%})" if worst else ""
  return (
    f"{name:<16} Spearman {f(row['spearman'], '.3f')}  MAE {row['mae']['value']:.4f}  "
    f"RMSE {row['rmse']['value']:.4f}  gap {row['mean_gap']['value']:+.4f}  "
    f"K* {k['value']:.0f} [{k['lo']:.0f}, {k['hi']:.0f}]  cov95 "
    f"{row['coverage_95']['value']:.3f}  worst tag {w}  ({row['seconds']:.0f} s)"
  )


def markdown_table(rows: dict) -> str:
  """The results page's table of a study: one line per variant, 95% CIs where the harness gives
  them."""
  f = lambda e, s=".3f": f"{e['value']:{s}} [{e['lo']:{s}}, {e['hi']:{s}}]"  # noqa: E731
  lines = [
    "| variant | hypothesis | Spearman | MAE | K* | 95% cov. | worst tag gap | train s |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for name, r in rows.items():
    k, w = r["k_star"], r.get("worst_tag")
    worst = f"{w['tag']} {w['gap']['value']:+.4f}" if w else "n/a"
    kstar = f"{k['value']:.0f} [{k['lo']:.0f}, {k['hi']:.0f}]" if k else "n/a"
    lines.append(
      f"| {name} | {r['hypothesis']} | {f(r['spearman'])} | {r['mae']['value']:.4f} | {kstar} "
      f"| {r['coverage_95']['value']:.3f} | {worst} | {r['seconds']:.0f} |"
    )
  return "\n".join(lines)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default="configs/reasoning.py")
  p.add_argument("--labels", required=True, help="the label dataset every variant trains on")
  p.add_argument("--only", default="", help="comma-separated variant names (default: all)")
  p.add_argument(
    "--set",
    action="append",
    default=[],
    help="a.b=value applied to every "
    "variant before its own change (e.g. the study's training length)",
  )
  p.add_argument("--reuse", action="append", default=[], help="NAME=WORKDIR of a finished run")
  p.add_argument("--reference-rollouts", type=int, default=1024)
  p.add_argument("--out", default="runs/ablate")
  p.add_argument("--name", default="", help="the study's name (default: the config's)")
  p.add_argument(
    "--env",
    default="",
    help="score on fresh episodes of this spec, not the "
    "test split (variants on other labels are then comparable)",
  )
  p.add_argument(
    "--episodes",
    type=int,
    default=0,
    help="scored episodes (0: the whole test split; 256 with --env)",
  )
  p.add_argument(
    "--table",
    action="store_true",
    help="print the study's markdown table from OUT/NAME.json and exit",
  )
  args = p.parse_args(argv)

  name = os.path.splitext(os.path.basename(args.config))[0]
  variants = VARIANTS.get(name)
  if variants is None:
    p.error(f"no variants for config {name!r} (known: {', '.join(VARIANTS)})")
  only = [v for v in args.only.split(",") if v]
  unknown = [v for v in only if v not in variants]
  if unknown:
    p.error(f"unknown variant(s) {', '.join(unknown)} (known: {', '.join(variants)})")
  path = os.path.join(args.out, f"{args.name or name}.json")
  kept = {}
  if os.path.isfile(path):
    with open(path) as f:
      kept = json.load(f).get("variants", {})
  if args.table:
    print(markdown_table({k: kept[k] for k in variants if k in kept}))
    return kept
  reuse = dict(r.split("=", 1) for r in args.reuse)
  root = os.path.join(args.out, args.name or name)
  cache = os.path.join(root, "reference_cache")
  baseline = reuse.get("baseline", os.path.join(root, "baseline"))

  def train(workdir, labels, overrides):
    data = [f"data.label.env={labels}", "data.labels_dir="] if labels else []
    data = data or [f"data.labels_dir={args.labels}"]
    config = load_config(args.config, [*data, *args.set, *overrides, "train.progress=False"])
    train_and_evaluate(config, workdir)

  rows = {}
  for vname in only or list(variants):
    hypothesis, overrides = variants[vname]
    directive = lambda k, default, ov=overrides: next(  # noqa: E731
      (o.split("=", 1)[1] for o in ov if o.startswith(k + "=")), default
    )
    # The studies' baseline scores the best checkpoint by validation loss (their published
    # tables do); the "last" variant scores what a training run scores by default.
    step, labels = directive("step", "best"), directive("labels", "")
    members = int(directive("members", "1"))
    config_overrides = [o for o in overrides if not o.startswith(("step=", "labels=", "members="))]
    tic = time.perf_counter()
    if vname in reuse:
      workdirs = [reuse[vname]]
    elif config_overrides or labels or vname == "baseline":
      workdirs = [os.path.join(root, vname)]
      train(workdirs[0], labels, config_overrides)
    else:  # the scored step or the ensemble: around the baseline's run
      workdirs = [baseline]
    for m in range(1, members):  # ensemble members 1..N-1 beside the run (member 0)
      workdirs.append(os.path.join(root, f"member{m}"))
      train(workdirs[-1], labels, [*config_overrides, f"member={m}"])
    seconds = time.perf_counter() - tic
    report = run_drift(
      DriftConfig(
        checkpoint=",".join(workdirs),
        step=step,
        env=args.env or None,
        episodes=args.episodes,
        reference_rollouts=args.reference_rollouts,
        shifts=(),
        baseline_steps=0,
        gradient_env="",
        out=os.path.join(root, f"{vname}_drift"),
        # Variants on their own labels have their own test split and reference.
        cache=os.path.join(root, f"{vname}_cache") if labels and not args.env else cache,
        progress=False,
      )
    )
    row = {"hypothesis": hypothesis, "overrides": overrides, "workdirs": workdirs}
    row.update(summarize(report))
    row["seconds"] = round(seconds, 1)
    rows[vname] = row
    print(row_text(vname, row), flush=True)
  # Rows of earlier invocations (other --only sets) are kept beside this one's.
  write_json(path, {"labels": args.labels, "variants": {**kept, **rows}})
  return rows


if __name__ == "__main__":
  main()
