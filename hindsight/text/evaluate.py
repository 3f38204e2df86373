"""`hindsight eval` on a text run: the credit model against the reference credit of its held-out
traces, beside the training labels, the MC progress scores, a learned PRM and (text world) a
Bayes observer.

Reference (`reference`):
  exact     the text world's dynamic programme (`world.exact_credit`), stderr 0;
  resample  the same traces relabeled through the endpoint at K_ref completions per prefix
            with a seed of their own (the labels' seed + REFERENCE_SEED_OFFSET), cached in
            OUT/reference (a rerun asks for nothing it has); its cost in completions is
            reported. Its stderrs enter K* as the reference's noise.
  auto      exact when the traces are the text world's own (its model wrote them and every
            prompt is its problem), else resample.

Signals, per step: `credit model` (the Predictor's point prediction), `training labels` (the
K_L-completion labels it learned from), `progress (MC)` (the labels' progress: P(success |
x_{t+1}) - P(success | x_t), the process-reward view), `learned PRM (text)` (a process
reward model reading the text, trained on outcomes only: `learned_prm`) and, with the exact
reference, `Bayes observer of the text` (`world.observer_credit`: the best any reader of the
trace can do, as the world's competence is hidden from it); with a resampled reference of
another model's traces of the world's problems (the small LM's), the credit the scripted world
gives the same sentences (`text world's exact credit` and `text world's Bayes observer`: how
far that model's credit is from the world's). Each gets the drift metrics with
bootstrap CIs over traces (`metrics.drift.metric_table`) and

  K*           equivalent completions per step: K_L (mean e_L^2 - mean se_c^2) /
               (mean e_M^2 - mean se_c^2) (`metrics.drift.equivalent_rollouts`), with a
               bootstrap CI over traces; for the observer too (its K* is the ceiling)
  top-3 recall over traces of >= 4 steps: |top3(signal) & top3(reference)| / 3, top-3 by
               |credit| (thought-anchors' frugal variant reports 97.7% of this)
"""

from __future__ import annotations

import os

import numpy as np

from hindsight.data.labels import as_text
from hindsight.errors import HindsightError
from hindsight.files import write_json

REFERENCE_SEED_OFFSET = 0x5EED  # the reference's seed: labels' seed + this (no shared draws)
TOP_K = 3


def is_text_run(workdir: str) -> bool:
  """Whether the training run in `workdir` learned from text traces."""
  from hindsight.data import open_labels
  from hindsight.model.predictor import training_run

  try:
    labels = open_labels(training_run(workdir)["labels"])
  except HindsightError:
    return False
  return labels.metadata.env.startswith("text:")


def _is_world(examples) -> bool:
  from hindsight.text import world

  return all(world.parse_problem(as_text(e["prompt"])) is not None for e in examples)


def _world_model() -> str:
  from hindsight.text import world

  return world.MODEL_NAME


def exact_reference(examples, replacement: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """(the exact credit [T] per trace, the Bayes observer's credit [T] per trace)."""
  from hindsight.text import world
  from hindsight.text.exact import exact_labels

  truth, observer = [], []
  for e in examples:
    truth.append(exact_labels(e, replacement)["credit"])
    problem = world.parse_problem(as_text(e["prompt"]))
    actions = [world.parse_action(problem, as_text(s)) for s in e["step_text"]]
    observer.append(world.observer_credit(problem, actions, replacement))
  return truth, observer


def resampled_reference(
  examples, metadata: dict, out: str, rollouts: int, endpoint: str, progress: bool
) -> tuple[list[np.ndarray], list[np.ndarray], int]:
  """(credit [T], its stderr [T] per trace, completions drawn) of the traces relabeled at
  `rollouts` through `endpoint` with the labels' own text options and a seed of its own."""
  from hindsight.data import open_labels
  from hindsight.labeling.config import LabelConfig, TextOptions
  from hindsight.labeling.job import LabelJob, run_label_job
  from hindsight.text.trace import TextStep, TextTrace, read_traces, write_traces

  job = metadata.job_description
  source = job["env"].removeprefix("text:")
  if not os.path.isfile(source):
    raise HindsightError(
      f"{source}: the labels' trace file is gone (the verifier's references are in it)"
    )
  references = {t.id: t.reference for t in read_traces(source)}
  options = {k: v for k, v in job["text"].items()}
  options["stop"] = tuple(options.get("stop", ()))
  os.makedirs(out, exist_ok=True)
  traces_path = os.path.join(out, "traces.jsonl")
  traces = [
    TextTrace(
      prompt=as_text(e["prompt"]),
      steps=[TextStep(text=as_text(s)) for s in e["step_text"]],
      id=as_text(e["trace_id"]),
      reference=references.get(as_text(e["trace_id"])),
    )
    for e in examples
  ]
  write_traces(traces_path, traces)
  config = LabelConfig(
    num_rollouts=rollouts,
    replacement=job["replacement"],
    decorative_tolerance=job["decorative_tolerance"],
    confidence=job["confidence"],
  )
  label_job = LabelJob(
    f"text:{traces_path}",
    len(traces),
    config,
    seed=int(job["seed"]) + REFERENCE_SEED_OFFSET,
    text=TextOptions(endpoint=endpoint, **options),
  )
  path = run_label_job(label_job, os.path.join(out, "labels"), progress=progress)
  ref = open_labels(path)
  by_id = {as_text(r["trace_id"]): r for r in ref}
  credit = [np.asarray(by_id[t.id]["credit"], np.float64) for t in traces]
  stderr = [np.asarray(by_id[t.id]["credit_stderr"], np.float64) for t in traces]
  return credit, stderr, ref.metadata.completions or 0


def learned_prm(labels, run: dict, predictor, episodes, steps: int, seed: int, progress: bool):
  """The process reward model of the drift harness (`drift.baselines`, `prm`: P(success |
  the steps so far) by a causal transformer reading the steps' text, trained on the training
  split's outcomes only) and its credit p_t - p_{t-1} on `episodes` ([T] each). steps: its
  optimizer steps (-1: scaled to the split, `baselines.scaled_steps`)."""
  from hindsight.drift import baselines as bl
  from hindsight.model.batching import EpisodeReader

  train_ids = np.asarray(run["train"], np.int64)
  bcfg = bl.BaselineConfig(steps=steps if steps > 0 else bl.scaled_steps(train_ids.size),
                           seed=seed)  # fmt: skip
  split = bl.TrainingSplit.of(EpisodeReader(labels), train_ids, predictor.spec,
                              bcfg.batch_size, seed)  # fmt: skip
  graphdef, state = bl.train_history_model(
    "prm", split.batches, predictor.spec, predictor.model_config, bcfg, split.return_scale,
    progress,
  )  # fmt: skip
  prm = bl.LearnedBaseline("prm", graphdef, state, split.bases["prm"], split.return_scale)
  return prm.credit(lambda eps: predictor.batch(eps, allow_longer=True), episodes)


def top_k_recall(pred: list[np.ndarray], ref: list[np.ndarray], k: int = TOP_K) -> float:
  """Mean over traces of > k steps of |top-k(|pred|) & top-k(|ref|)| / k."""
  hits = []
  for p, r in zip(pred, ref, strict=True):
    ok = np.isfinite(r)
    p, r = np.abs(p[ok]), np.abs(r[ok])
    if r.size <= k:
      continue
    top_p = set(np.argsort(-p, kind="stable")[:k].tolist())
    top_r = set(np.argsort(-r, kind="stable")[:k].tolist())
    hits.append(len(top_p & top_r) / k)
  return float(np.mean(hits)) if hits else float("nan")


def evaluate_text_run(
  workdir: str,
  out: str = "",
  episodes: int = 0,
  reference: str = "auto",
  rollouts: int = 256,
  endpoint: str = "",
  bootstrap: int = 400,
  seed: int = 0,
  step: str = "best",
  progress: bool = True,
  baseline_steps: int = -1,
) -> dict:
  """The report (module docstring) of the run in `workdir` on its test split (the first
  `episodes` of it; 0 = all), written to OUT/report.json and OUT/report.md."""
  from hindsight.data import open_labels
  from hindsight.data.episode import Episode
  from hindsight.metrics.drift import EpisodeSteps, equivalent_rollouts, metric_table
  from hindsight.metrics.drift import bootstrap as bootstrap_ci
  from hindsight.model.predictor import Predictor, training_run

  run = training_run(workdir)
  labels = open_labels(run["labels"])
  ids = np.asarray(run["test"], np.int64)
  if episodes:
    ids = ids[:episodes]
  examples = [labels[int(i)] for i in ids]
  out = out or os.path.join(workdir, "drift")
  replacement = labels.metadata.replacement
  if reference == "auto":  # exact where the traces are the scripted world's own
    own = labels.metadata.policy == _world_model()
    reference = "exact" if own and _is_world(examples) else "resample"
  if reference not in ("exact", "resample"):
    raise HindsightError(f"reference {reference!r}: expected auto, exact or resample")
  observer = None
  cost = 0
  if reference == "exact":
    if not _is_world(examples):
      raise HindsightError("reference exact: the traces are not the text world's")
    ref, observer = exact_reference(examples, replacement)
    ref_se = [np.zeros_like(r) for r in ref]
  else:
    if not endpoint:
      raise HindsightError("reference resample needs --endpoint URL (the model's server)")
    ref, ref_se, cost = resampled_reference(
      examples, labels.metadata, os.path.join(out, "reference"), rollouts, endpoint, progress
    )
  predictor = Predictor.load(workdir, step)
  scores = predictor.score([Episode.from_example(e) for e in examples], allow_longer=True)
  signals = {
    "credit model": [s["credit"] for s in scores],
    "training labels": [np.asarray(e["credit"], np.float64) for e in examples],
    "progress (MC)": [np.asarray(e["progress"], np.float64) for e in examples],
  }
  if baseline_steps != 0:
    signals["learned PRM (text)"] = learned_prm(
      labels, run, predictor, [Episode.from_example(e) for e in examples], baseline_steps,
      seed, progress,
    )  # fmt: skip
  if observer is not None:
    signals["Bayes observer of the text"] = observer
  elif _is_world(examples):
    # Another model's traces of the world's problems: how far its credit is from the credit
    # the scripted world would give the same sentences.
    world_exact, world_observer = exact_reference(examples, replacement)
    signals["text world's exact credit"] = world_exact
    signals["text world's Bayes observer"] = world_observer
  # Steps where every signal and the reference are defined.
  flat_ref = np.concatenate(ref)
  flat_se = np.concatenate(ref_se)
  episode = np.concatenate([np.full(r.size, j) for j, r in enumerate(ref)])
  flat = {k: np.concatenate(v).astype(np.float64) for k, v in signals.items()}
  ok = np.isfinite(flat_ref) & np.all([np.isfinite(v) for v in flat.values()], 0)
  table = metric_table(
    {k: v[ok] for k, v in flat.items()}, flat_ref[ok], episode[ok], bootstrap, seed
  )
  K_L = labels.metadata.rollouts
  ref_var = np.where(np.isfinite(flat_se), flat_se, 0.0) ** 2
  steps = EpisodeSteps(episode[ok])
  label_err2 = (flat["training labels"] - flat_ref)[ok] ** 2

  def k_star(name):
    err2 = (flat[name] - flat_ref)[ok] ** 2
    var = ref_var[ok]

    def stat(idx):
      sel = steps.gather(idx)
      return [equivalent_rollouts(err2[sel], label_err2[sel], var[sel], K_L)]

    value, lo, hi, _ = bootstrap_ci(steps.num_episodes, stat, bootstrap, seed)
    return {"value": float(value[0]), "lo": float(lo[0]), "hi": float(hi[0])}

  report = {
    "run": os.path.abspath(workdir),
    "labels": run["labels"],
    "traces": int(ids.size),
    "steps": int(ok.sum()),
    "replacement": replacement,
    "label_completions_per_step": K_L,
    "reference": {
      "kind": reference,
      "rollouts": rollouts if reference == "resample" else None,
      "completions": cost,
    },
    "metrics": {n: {m: e.as_dict() for m, e in t.items()} for n, t in table.items()},
    # K* of every signal that is not the labels themselves (theirs is K_L by definition).
    "k_star": {n: k_star(n) for n in signals if n not in ("training labels", "progress (MC)")},
    "top3_recall": {n: top_k_recall(v, ref) for n, v in signals.items()},
    "checkpoint_step": predictor.step,
  }
  if observer is not None:
    m, b = report["k_star"]["credit model"]["value"], report["k_star"]["Bayes observer of the text"]
    report["k_star_share_of_observer"] = m / b["value"] if b["value"] > 0 else float("nan")
  os.makedirs(out, exist_ok=True)
  report["out"] = os.path.abspath(out)
  write_json(os.path.join(out, "report.json"), report)
  with open(os.path.join(out, "report.md"), "w") as f:
    f.write(render_text_report(report))
  return report


def render_text_report(report: dict) -> str:
  """report.md: one table of the signals against the reference, K* and top-3 recall."""
  ref = report["reference"]
  what = (
    "the text world's exact credit (dynamic programming)"
    if ref["kind"] == "exact"
    else f"a resample at K = {ref['rollouts']} with its own seed ({ref['completions']:,} "
    "completions)"
  )
  lines = [
    f"# Text credit against {what}",
    "",
    f"{report['traces']} held-out traces, {report['steps']} steps; training labels at "
    f"K = {report['label_completions_per_step']} completions per step "
    f"(`{report['replacement']}`). 95% bootstrap intervals over traces.",
    "",
    "| signal | Spearman | Pearson | MAE | top-3 recall |",
    "|---|---|---|---|---|",
  ]
  for name, m in report["metrics"].items():

    def ci(e):
      return f"{e['value']:.3f} [{e['lo']:.3f}, {e['hi']:.3f}]"

    lines.append(
      f"| {name} | {ci(m['spearman'])} | {ci(m['pearson'])} | {m['mae']['value']:.4f} | "
      f"{report['top3_recall'][name]:.3f} |"
    )
  lines += ["", "Equivalent completions per step (K*):", ""]
  for name, k in report["k_star"].items():
    lines.append(f"- {name}: {k['value']:.1f} [{k['lo']:.1f}, {k['hi']:.1f}]")
  if "k_star_share_of_observer" in report:
    lines.append(
      f"- the credit model reaches {report['k_star_share_of_observer']:.0%} of the observer's K*"
    )
  return "\n".join(lines) + "\n"
