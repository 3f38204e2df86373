"""Does reading text cost the credit model anything? The text world's labels, and their
symbolic twin: the same traces, labels and split with each step's text replaced by the world
action it renders ("a3 "), trained with the same config; both scored against the exact credit.

  python eval/text_twin.py --labels runs/text/labels --run runs/text/model --out runs/text/twin

--run is a text run trained on --labels (`hindsight train --config text`); the twin is trained
with the same steps into OUT/model. Prints Spearman and K* (equivalent completions per step)
of each, with bootstrap CIs over traces.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np

from hindsight.config_io import load_config
from hindsight.data import labels as label_io
from hindsight.data import open_labels
from hindsight.data.episode import Episode
from hindsight.metrics.drift import EpisodeSteps, bootstrap, equivalent_rollouts, point_metrics
from hindsight.model.predictor import Predictor, training_run
from hindsight.training import run_training
from hindsight.worlds import world
from hindsight.worlds.exact import exact_labels


def write_twin(src, out_dir: str) -> str:
  """The symbolic twin of a text-world label dataset (module docstring)."""
  features = label_io.build_features((1,), np.float32, False, texts=True)

  def rows():
    for ex in src:
      prompt = label_io.as_text(ex["prompt"])
      problem = world.parse_problem(prompt)
      f = {k: ex[k] for k in features if k in ex}
      f["tags"] = [label_io.as_text(t) for t in ex["tags"]]
      f["step_text"] = [
        f"a{world.parse_action(problem, label_io.as_text(s))} " for s in ex["step_text"]
      ]
      f["prompt"], f["trace_id"] = prompt, label_io.as_text(ex["trace_id"])
      yield label_io.make_example(f)

  shutil.rmtree(out_dir, ignore_errors=True)
  os.makedirs(out_dir)
  return label_io.write_dataset(out_dir, features, src.metadata, rows())


def scores(run: str, labels, truth, label_credit, K: int, resamples: int) -> dict:
  """Spearman and K* of the run's credit on its test split against the exact credit."""
  ids = training_run(run)["test"]
  pred = Predictor.load(run).score([Episode.from_example(labels[i]) for i in ids])
  pred = np.concatenate([p["credit"] for p in pred]).astype(np.float64)
  episode = np.concatenate([np.full(len(labels[i]["actions"]), j) for j, i in enumerate(ids)])
  steps = EpisodeSteps(episode)

  def stat(idx):
    sel = steps.gather(idx)
    rho = point_metrics(pred[sel], truth[sel])[0]
    err2 = (pred[sel] - truth[sel]) ** 2
    lab2 = (label_credit[sel] - truth[sel]) ** 2
    return [rho, equivalent_rollouts(err2, lab2, np.zeros(sel.size), K)]

  value, lo, hi, _ = bootstrap(steps.num_episodes, stat, resamples)
  return {name: {"value": float(value[i]), "lo": float(lo[i]), "hi": float(hi[i])}
          for i, name in enumerate(("spearman", "k_star"))}  # fmt: skip


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--labels", required=True, help="a text-world label dataset")
  p.add_argument("--run", required=True, help="a text run trained on --labels")
  p.add_argument("--out", required=True)
  p.add_argument("--bootstrap", type=int, default=400)
  args = p.parse_args(argv)
  src = open_labels(args.labels)
  with open(os.path.join(args.run, "config.json")) as f:
    steps = int(json.load(f)["train.steps"])  # the run's config, flattened
  twin_run = os.path.join(args.out, "model")
  if not os.path.isdir(os.path.join(twin_run, "checkpoints")):
    config = load_config("text")
    config.data.labels_dir = write_twin(src, os.path.join(args.out, "labels"))
    config.train.steps = steps
    config.train.progress = False
    run_training(config, twin_run)
  twin = open_labels(os.path.join(args.out, "labels"))
  ids = training_run(args.run)["test"]
  if ids != training_run(twin_run)["test"]:
    raise SystemExit("text_twin: the runs split the traces differently (another seed?)")
  replacement = src.metadata.replacement
  truth = np.concatenate([exact_labels(src[i], replacement)["credit"] for i in ids])
  label_credit = np.concatenate([np.asarray(src[i]["credit"], np.float64) for i in ids])
  K = src.metadata.rollouts
  rows = {
    "text": scores(args.run, src, truth, label_credit, K, args.bootstrap),
    "symbols (twin)": scores(twin_run, twin, truth, label_credit, K, args.bootstrap),
  }
  print(f"{len(ids)} held-out traces, {truth.size} steps, against the exact credit ({steps} "
        "steps of training each):")  # fmt: skip
  for name, r in rows.items():
    s, k = r["spearman"], r["k_star"]
    print(f"  {name:<16} Spearman {s['value']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]   "
          f"K* {k['value']:.1f} [{k['lo']:.1f}, {k['hi']:.1f}]")  # fmt: skip
  with open(os.path.join(args.out, "twin.json"), "w") as f:
    json.dump(rows, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
