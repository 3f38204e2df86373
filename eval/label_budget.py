"""The label budget on a language model's traces: at a fixed number of completions, more
traces at a lower K or fewer at a higher one?

For each split (N traces, K completions per prefix) of --splits, the bundled LM (served from a
thread, `hindsight lm serve`) samples N traces of the text world's problems and labels them at
K (`hindsight label`, through its endpoint); the LM-backbone credit model (configs/text_lm.py,
its decoder from the policy's weights) trains on them for --steps. Every model is scored on
the same --heldout traces (problems of another seed), against one reference: those traces
relabeled at --reference-rollouts. The first N prompts of every split are the same problems.

Each model's worth is its equivalent completions per step, with sigma_t^2 = K_ref se_t^2
the variance of one completion's credit at step t (the reference's own), so a K-label's
squared error is sigma_t^2 / K:

  K* = mean(sigma_t^2) / (mean((model_t - ref_t)^2) - mean(se_t^2))

(`metrics.drift.equivalent_rollouts` with the labels' error replaced by its expectation; a
95% percentile interval from resampling held-out traces). Prints one row per split (traces,
K, completions, label and training seconds, K* and its interval, K* / K) and writes
WORKDIR/budget.json, budget.md and budget.png (K* against traces, one line per budget).
Every stage resumes (label datasets, checkpoints, the reference).

  python eval/label_budget.py --lm runs/text-demo/lm --workdir runs/budget
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--lm", default="runs/text-demo/lm", help="a `hindsight lm train` workdir")
  p.add_argument("--workdir", default="runs/budget")
  p.add_argument("--splits", default="200x8,400x4,800x2,400x8,800x4,1600x2",
                 help="TRACESxK,... (K >= 2: the replace arm needs two draws)")  # fmt: skip
  p.add_argument("--heldout", type=int, default=48, help="held-out traces scored")
  p.add_argument("--reference-rollouts", type=int, default=64, help="K of the reference")
  p.add_argument("--steps", type=int, default=300, help="credit model steps")
  p.add_argument("--max-tokens", type=int, default=320, help="longest continuation")
  p.add_argument("--bootstrap", type=int, default=400)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  try:
    splits = [tuple(int(x) for x in s.split("x")) for s in args.splits.split(",")]
  except ValueError:
    raise SystemExit(f"label_budget: --splits {args.splits!r}: expected TRACESxK,...") from None
  if any(n < 8 or k < 2 for n, k in splits):
    raise SystemExit("label_budget: each split needs >= 8 traces and K >= 2")

  from hindsight.devices import use_all_cpu_cores
  from hindsight.errors import report_errors

  use_all_cpu_cores()
  return report_errors("label_budget", run, args, splits)


def run(args, splits) -> int:
  from hindsight.data import open_labels
  from hindsight.data.episode import Episode
  from hindsight.lm.server import running_lm
  from hindsight.lm.train import load_lm
  from hindsight.model.predictor import Predictor

  W = args.workdir
  os.makedirs(W, exist_ok=True)
  counts = load_lm(args.lm).record.get("counts")
  counts = tuple(counts) if counts else None
  rows = []
  with running_lm(args.lm) as (url, model):
    label = _labeler(url, model, args.max_tokens, counts)
    print(f"== reference: {args.heldout} held-out traces at K = {args.reference_rollouts}")
    ref_dir, _, _ = label(os.path.join(W, "reference"), args.seed + 1, args.heldout,
                          args.reference_rollouts)  # fmt: skip
    reference = list(open_labels(ref_dir))
    episodes = [Episode.from_example(ex) for ex in reference]
    for n, k in splits:
      name = f"{n}x{k}"
      print(f"== {name}: {n} traces at K = {k}")
      labels, completions, label_seconds = label(os.path.join(W, name, "labels"), args.seed, n, k)
      workdir = os.path.join(W, name, "model")
      train_seconds = _train(labels, args.lm, workdir, args.steps)
      # A held-out trace longer than every training trace is scored past the positions the
      # model trained on (as `hindsight score --allow-longer` does).
      scores = Predictor.load(workdir).score(episodes, allow_longer=True)
      k_star = _k_star(scores, reference, args.reference_rollouts, args.bootstrap, args.seed)
      rows.append({"split": name, "traces": n, "k": k, "completions": completions,
                   "label_seconds": label_seconds, "train_seconds": train_seconds,
                   "k_star": k_star})  # fmt: skip
      print(_row(rows[-1]), flush=True)
  _write(W, args, rows)
  return 0


def _labeler(url: str, model: str, max_tokens: int, counts):
  """label(out, seed, traces, K) -> (labels dir, completions drawn, seconds): the text
  world's first `traces` problems of `seed`, sampled and labeled through the endpoint."""
  from hindsight.data import open_labels
  from hindsight.labeling.config import LabelConfig
  from hindsight.labeling.job import LabelJob, run_label_job
  from hindsight.text.options import TextOptions
  from hindsight.text.trace import write_traces
  from hindsight.worlds import world

  def label(out: str, seed: int, traces: int, k: int):
    os.makedirs(out, exist_ok=True)
    prompts = os.path.join(out, "prompts.jsonl")
    problems = world.prompt_traces(seed, traces, *([counts] if counts else []))
    write_traces(prompts, problems)
    options = TextOptions(endpoint=url, model=model, max_tokens=max_tokens)
    job = LabelJob(f"text:{prompts}", traces, LabelConfig(num_rollouts=k), seed=seed,
                   options=options)  # fmt: skip
    labels, seconds = _timed(out, lambda: run_label_job(job, os.path.join(out, "dataset")))
    return labels, int(open_labels(labels).metadata.completions or 0), seconds

  return label


def _train(labels: str, lm: str, workdir: str, steps: int) -> float:
  """Trains (or resumes) the LM-backbone credit model; its training seconds."""
  from hindsight.config_io import load_config
  from hindsight.training import train_and_evaluate

  config = load_config("text_lm")
  config.data.labels_dir = labels
  config.data.lm = lm
  config.train.steps = steps
  config.train.eval_every = min(100, steps)
  return _timed(workdir, lambda: train_and_evaluate(config, workdir))[1]


def _timed(out: str, fn):
  """(fn(), its seconds): a finished stage's are those of the run that finished it
  (OUT/seconds.json; a resumed stage counts only the run that finished it)."""
  tic = time.perf_counter()
  result = fn()
  timing = os.path.join(out, "seconds.json")
  if not os.path.isfile(timing):
    with open(timing, "w") as f:
      json.dump({"seconds": time.perf_counter() - tic}, f)
  with open(timing) as f:
    return result, float(json.load(f)["seconds"])


def _k_star(scores, reference, k_ref: int, n_boot: int, seed: int) -> dict:
  """K* of the model's point credit on the held-out traces (module docstring), with its
  95% interval over resampled traces."""
  from hindsight.metrics import drift as dm

  model = np.concatenate([s["credit"] for s in scores])
  ref = np.concatenate([np.asarray(ex["credit"], float) for ex in reference])
  se = np.concatenate([np.asarray(ex["credit_stderr"], float) for ex in reference])
  ok = np.isfinite(ref) & np.isfinite(se) & np.isfinite(model)
  episode = np.concatenate([np.full(len(s["credit"]), i) for i, s in enumerate(scores)])[ok]
  model_e2, ref_var = np.square(model[ok] - ref[ok]), np.square(se[ok])
  # A K-label's expected squared error against the reference: sigma^2 / K + se^2, with
  # sigma^2 = K_ref se^2; at K = 1 that is (K_ref + 1) se^2.
  label_e2 = (k_ref + 1) * ref_var
  steps = dm.EpisodeSteps(episode)

  def stat(idx):
    sel = steps.gather(idx)
    return [dm.equivalent_rollouts(model_e2[sel], label_e2[sel], ref_var[sel], 1)]

  v, lo, hi, _ = dm.bootstrap(steps.num_episodes, stat, n_boot, seed)
  return {"value": float(v[0]), "lo": float(lo[0]), "hi": float(hi[0])}


def _row(r: dict) -> str:
  k = r["k_star"]
  interval = f"{k['value']:.1f} [{k['lo']:.1f}, {k['hi']:.1f}]"
  return (f"{r['split']:>10}{r['traces']:>8}{r['k']:>4}{r['completions']:>13,}"
          f"{r['label_seconds']:>10.0f}{r['train_seconds']:>10.0f}{interval:>22}"
          f"{k['value'] / r['k']:>8.1f}")  # fmt: skip


HEADER = (f"{'split':>10}{'traces':>8}{'K':>4}{'completions':>13}{'label s':>10}{'train s':>10}"
          f"{'K* [95% CI]':>22}{'K*/K':>8}")  # fmt: skip


def _write(W: str, args, rows: list[dict]) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  command = "python eval/label_budget.py " + " ".join(sys.argv[1:])
  with open(os.path.join(W, "budget.json"), "w") as f:
    json.dump({"command": command, "args": vars(args), "rows": rows}, f, indent=1)
  table = [HEADER, *(_row(r) for r in rows)]
  with open(os.path.join(W, "budget.md"), "w") as f:
    f.write(f"`{command}`\n\n```\n" + "\n".join(table) + "\n```\n")
  print("\n".join(table))
  fig, ax = plt.subplots(figsize=(6, 4))
  budgets = sorted({r["traces"] * r["k"] for r in rows})
  for b in budgets:
    pts = sorted((r for r in rows if r["traces"] * r["k"] == b), key=lambda r: r["traces"])
    x = [r["traces"] for r in pts]
    y = [r["k_star"]["value"] for r in pts]
    err = [[r["k_star"]["value"] - r["k_star"]["lo"] for r in pts],
           [r["k_star"]["hi"] - r["k_star"]["value"] for r in pts]]  # fmt: skip
    ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=f"traces x K = {b:,}")
    for r in pts:
      ax.annotate(f"K={r['k']}", (r["traces"], r["k_star"]["value"]), textcoords="offset points",
                  xytext=(4, 4), fontsize=8)  # fmt: skip
  ax.set_xscale("log")
  ax.set_xlabel("training traces")
  ax.set_ylabel("K* (completions per step)")
  ax.set_title("LM-backbone credit model on the bundled LM's traces")
  ax.legend(fontsize=8)
  fig.text(0.01, 0.01, command, fontsize=6)
  fig.tight_layout()
  fig.savefig(os.path.join(W, "budget.png"), dpi=120)


if __name__ == "__main__":
  sys.exit(main())
