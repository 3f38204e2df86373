"""The `label_fit` evaluator: a split's predictions against its own training labels.

This is the training run's report.json. The labels are Monte Carlo estimates with noise, so
these numbers mix the model's error with the labels'; `hindsight eval` (the drift harness)
scores the same model against a reference credit instead.
"""

from __future__ import annotations

import os

import numpy as np
from scipy import stats

from hindsight.credit.names import KLASS_NAMES
from hindsight.evaluators.split_pass import predict_split
from hindsight.files import write_json
from hindsight.metrics.credit_fit import correlation, per_tag, prediction_metrics
from hindsight.model.calibration import fit_sigma_scale, moment_sigma_scale


def loss_noise(programs, steps: dict) -> np.ndarray:
  """Each step's label noise as the loss took it out (`loss.sample_noise`): its sample stderr
  (the `noise` column) or its stderr."""
  return steps["noise"] if programs.loss.sample_noise else steps["stderr"]


class SigmaScaleEvaluator:
  """run(state) -> (sigma scale, steps it was fitted on): `model.calibration` on one split
  (the validation split: the test split stays untouched for the report)."""

  def __init__(self, programs, plan, reader, spec, mesh, rows):
    self.programs = programs
    self.args = (plan, reader, spec, mesh, rows)

  def run(self, state) -> tuple[float, int]:
    _, steps = predict_split(self.programs, state, *self.args)
    # The label noise the loss took out is the one calibration takes out: the sample stderr
    # (a noisy noise level on every step: matched in the mean; a label without one, whose
    # noise fell back to its tie bound, left out) or the stderr (a bound on tied steps, left
    # out).
    mu, sigma, label = steps["pred_mu"], np.sqrt(steps["pred_var"]), steps["label"]
    noise = loss_noise(self.programs, steps)
    if self.programs.loss.sample_noise:
      use = steps["sampled"] | ~steps["bounded"]
      scale = moment_sigma_scale(mu[use], sigma[use], label[use], noise[use])
    else:
      scale = fit_sigma_scale(mu, sigma, label, noise, bounded=steps["bounded"])
    return scale, int(steps["label"].size)


class LabelFitEvaluator:
  """run(state) -> (report dict, per-step columns) for one split (usually test)."""

  def __init__(self, programs, plan, reader, spec, mesh, rows):
    self.programs = programs
    self.args = (plan, reader, spec, mesh, rows)

  def run(self, state, sigma_scale: float = 1.0) -> tuple[dict, dict]:
    """sigma_scale: the fitted calibration of the predicted spread (`model.calibration`),
    applied as the Predictor applies it."""
    losses, steps = predict_split(self.programs, state, *self.args)
    steps["pred_var"] = steps["pred_var"] * sigma_scale**2
    out = prediction_metrics(
      steps["pred"],
      steps["pred_mu"],
      steps["pred_var"],
      steps["label"],
      loss_noise(self.programs, steps),  # the reliability and z-scores are about noise
      steps["progress"],
    )
    out["test_loss"] = losses
    out["class_accuracy"] = float(np.mean(steps["pred_klass"] == steps["klass"]))
    out["per_tag"] = per_tag(steps["tags"], steps["pred"], steps["label"])
    if "agent_pred" in steps:
      pred, label = steps["agent_pred"], steps["agent_label"]
      out["agent"] = {
        "pairs": int(label.size),  # (episode, agent) pairs of the split
        "spearman": correlation(stats.spearmanr, pred, label),
        "pearson": correlation(stats.pearsonr, pred, label),
        "mae": float(np.mean(np.abs(pred - label))),
        "constant_mae": float(np.mean(np.abs(label - np.median(label)))),
      }
    return out, steps


# Above this share of exactly-0 labels a Spearman over the steps mostly ranks ties.
TIED_LABELS = 0.5


def _tied(r: dict) -> bool:
  """Most labels are exactly 0 and the model was not trained to predict ties."""
  return r["exact_zero_share"] > TIED_LABELS and not r.get("train", {}).get("zero_ties")


def _spearman_text(r: dict) -> str:
  if _tied(r):
    return "undefined (tied labels)"
  return f"{r['spearman']:.3f}"


def _reliability_text(r: dict) -> str:
  """What the labels' reliability is (1 - mean stderr^2 / variance), and what below 0 means."""
  what = "the share of the labels' variance that is credit, not sampling noise"
  if r["label_reliability"] < 0:
    what += "; below 0: more noise than credit, label with more --rollouts"
  return what


def summary_text(r: dict) -> str:
  """The report's few lines for a console (report["summary"])."""
  lines = [
    f"credit model on {r['env']} ({r['replacement']} labels), "
    f"{r['episodes']['test']} held-out episodes, {r['steps']} steps, against its own "
    "training labels (Monte Carlo, noisy; `hindsight eval` scores it against the reference):",
    f"  Spearman {_spearman_text(r)}  Pearson {r['pearson']:.3f}  MAE {r['mae']:.4g} "
    f"(best constant: {r['constant_mae']:.4g})"
    + ("" if _tied(r) else f"  (of the continuous part's mu: Spearman {r['spearman_mu']:.3f})"),
    f"  labels: reliability {r['label_reliability']:.3f} ({_reliability_text(r)}), exactly 0 "
    f"{r['exact_zero_share']:.1%}; "
    f"progress scores P(success | history) reach Spearman {r['progress_spearman']:.3f}",
    f"  calibration: z_rms {r['z_rms']:.2f}, 95% coverage {r['coverage_95']:.2f}; "
    f"class accuracy {r['class_accuracy']:.3f} over {', '.join(KLASS_NAMES)}",
  ]
  if _tied(r):
    lines.append(
      f"  ({r['exact_zero_share']:.0%} of the labels are exactly 0, so Spearman ranks ties and "
      "is undefined here; Pearson and MAE read the fit. --config.loss.zero_ties=True trains "
      "the model to predict those exact zeros)"
    )
  elif np.isnan(r["spearman"]):
    lines.append(
      "  (Spearman nan: the predictions are constant, so they rank nothing; a model trained "
      "for very few steps, like a :smoke config, can end there)"
    )
  if "agent" in r:
    a = r["agent"]
    lines.append(
      f"  agent-level Shapley values ({a['pairs']} episode x agent pairs): Spearman "
      f"{a['spearman']:.3f}  Pearson {a['pearson']:.3f}  MAE {a['mae']:.4g}"
    )
  stopped = r.get("train", {}).get("stopped_early_at")
  if stopped is not None:
    lines.append(
      f"  stopped early at step {stopped} of {r['train']['steps']}: no better validation loss "
      f"in {r['train']['patience']} steps (scored: step {r['evaluated_checkpoint']})"
    )
  lines.append("  per tag (labeled -> predicted mean credit):")
  for tag, row in r["per_tag"].items():
    lines.append(
      f"    {tag:<18} {row['steps']:>6} steps  {row['label']:+.3f} -> {row['predicted']:+.3f}"
    )
  if r.get("stages"):
    lines.append(
      "  wall time of this launch: " + ", ".join(f"{k} {v:.1f} s" for k, v in r["stages"].items())
    )
  return "\n".join(lines)


def write_label_fit(workdir: str, report: dict, steps: dict) -> None:
  """WORKDIR/report.json (atomic, strict JSON) and WORKDIR/test_scatter.png."""
  write_json(os.path.join(workdir, "report.json"), report)
  _scatter(os.path.join(workdir, "test_scatter.png"), steps, report)


def _scatter(path: str, steps: dict, report: dict) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5, 5))
  ax.scatter(steps["label"], steps["pred"], s=4, alpha=0.3)
  lo = float(min(steps["label"].min(), steps["pred"].min()))
  hi = float(max(steps["label"].max(), steps["pred"].max()))
  ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
  ax.set_xlabel("labeled credit (rollouts)")
  ax.set_ylabel("predicted credit (one forward pass)")
  ax.set_title(f"{report['env']}: Spearman {report['spearman']:.3f}, MAE {report['mae']:.3g}")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
