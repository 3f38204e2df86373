"""The audit's report: verdict, cost, the gap per slice with CIs, and the alarm's path.

Slice estimates are ratio estimators over the draws in the slice, sum(w g) / sum(w) (the
importance weights make them estimates for the slice's steps of the pool, not for the draws
the design favoured), with percentile bootstrap CIs over draws (draws are i.i.d.).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
from scipy import stats

from hindsight.files import atomic_write_text, write_json

POSITIONS = ("first third", "middle third", "last third")


def weighted_mean_ci(values, weights, n_resamples: int, seed: int, confidence: float = 0.95):
  """(sum w v / sum w, lo, hi) with a percentile bootstrap over the (v, w) pairs."""
  values, weights = np.asarray(values, float), np.asarray(weights, float)
  value = float(np.sum(weights * values) / np.sum(weights))
  if values.size < 2 or np.all(values == values[0]):
    return value, value, value
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    res = stats.bootstrap(
      (values, weights),
      lambda v, w, axis=-1: np.sum(w * v, axis=axis) / np.sum(w, axis=axis),
      paired=True,
      vectorized=True,
      n_resamples=n_resamples,
      method="percentile",
      confidence_level=confidence,
      rng=np.random.default_rng(seed),
    )
  return value, float(res.confidence_interval.low), float(res.confidence_interval.high)


def _slices(steps: dict, s: np.ndarray) -> dict[str, np.ndarray]:
  """Boolean masks over the draws for every slice: tag, position, outcome."""
  tags = steps["tag"][s]
  third = np.minimum(3 * steps["t"][s] // np.maximum(steps["length"][s], 1), 2)
  out = {f"tag {t}": tags == t for t in sorted(set(tags.tolist()))}
  out.update({f"position: {p}": third == i for i, p in enumerate(POSITIONS)})
  out["outcome: success"] = steps["success"][s]
  out["outcome: failure"] = ~steps["success"][s]
  return out


def build_report(cfg, predictor, label_cfg, spec, pool, res, tolerance) -> dict:
  """The report of one audit (`runner.AuditResult` res) as plain JSON types."""
  steps, design, draws, trace = res.steps, res.design, res.draws, res.trace
  gap_terms, cover_terms, gap_range, cover_range, *_ = res.terms
  s = draws.step
  w = design.weights[s]
  gap = steps["model_mean"][s] - draws.label["credit"]
  covered = cover_terms > 0  # terms are w 1[covered], w > 0
  cost = np.cumsum(draws.label["rollout_steps"])
  n = draws.size
  fired = trace.first
  verdict = {
    "alarm": fired is not None,
    "reason": trace.reason,
    "fired_after_draws": None if fired is None else fired + 1,
    "fired_after_env_steps": None if fired is None else int(cost[fired]),
    # When each of the alarm's tests alone would have fired (env steps; None: never).
    "env_steps_by_test": {
      name: int(cost[np.argmax(f)]) if f is not None and f.any() else None
      for name, f in (
        ("gap", trace.gap_fired),
        ("coverage", trace.coverage_fired),
        ("slices", trace.slice_fired),
      )
    },
  }
  slices = []
  for name, sel in _slices(steps, s).items():
    if sel.sum() == 0:
      continue
    g = weighted_mean_ci(gap[sel], w[sel], cfg.bootstrap, cfg.seed)
    c = weighted_mean_ci(covered[sel].astype(float), w[sel], cfg.bootstrap, cfg.seed)
    slices.append(
      {
        "slice": name,
        "draws": int(sel.sum()),
        "gap": dict(zip(("value", "lo", "hi"), g, strict=True)),
        "coverage": dict(zip(("value", "lo", "hi"), c, strict=True)),
      }
    )
  return {
    "checkpoint": os.path.abspath(cfg.checkpoint),
    "model": predictor.describe(),
    "env": spec,
    "pool": {**pool.source, "steps": int(steps["t"].size)},
    "replacement": label_cfg.replacement,
    "rollouts": label_cfg.num_rollouts,
    "budget": cfg.budget,
    "spent_env_steps": int(cost[-1]) if n else 0,
    "draws": n,
    "distinct_steps": int(np.unique(s).size),
    "design": {"shares": list(design.shares), "max_weight": design.max_weight},
    "alarm": {
      "tolerance": tolerance,
      "alpha": cfg.alpha,
      "coverage_level": cfg.coverage_level,
      "coverage_tolerance": cfg.coverage_tolerance,
      "gap_range": list(gap_range),
      "coverage_range": list(cover_range),
    },
    "verdict": verdict,
    "gap": {
      "mean": float(np.mean(gap_terms)) if n else float("nan"),
      "stderr": float(np.std(gap_terms, ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
      "confidence_sequence": [float(trace.gap_lower[-1]), float(trace.gap_upper[-1])]
      if n
      else None,
    },
    "coverage": {
      "mean": float(np.mean(cover_terms)) if n else float("nan"),
      "upper_confidence_bound": float(trace.coverage_upper[-1]) if n else None,
    },
    "slices": slices,
    # The alarm's per-tag confidence sequences (alpha / (3 m) each), at the last draw.
    "slice_alarm": [
      {"slice": name, "confidence_sequence": list(bounds)}
      for name, bounds in trace.final_slice_bounds().items()
    ],
  }


def markdown(report: dict) -> str:
  v, a, g, c = report["verdict"], report["alarm"], report["gap"], report["coverage"]
  m = report["model"]
  unit = report.get("budget_unit", "env steps")  # text audits: completions
  lines = [
    f"# Audit: {report['env']}",
    "",
    f"Model: `{report['checkpoint']}` step {m['step']} (digest {m['digest']}); "
    f"`{report['replacement']}` credit, K = {report['rollouts']} rollouts per arm.",
    f"Pool: {report['pool']['episodes']} episodes, {report['pool']['steps']} steps "
    f"({report['pool']['kind']}). Budget {report['budget']:.3g} {unit}, spent "
    f"{report['spent_env_steps']:.3g} on {report['draws']} draws "
    f"({report['distinct_steps']} distinct steps).",
    "",
    "## Verdict",
    "",
  ]
  band = f"[-{a['tolerance']:.4g}, +{a['tolerance']:.4g}]"
  floor = a["coverage_level"] - a["coverage_tolerance"]
  if v["alarm"]:
    lines.append(
      f"**DRIFT ALARM** ({v['reason']}) after {v['fired_after_draws']} audited steps, "
      f"{v['fired_after_env_steps']:.3g} {unit} of rollouts."
    )
  else:
    lines.append(f"**No alarm** after {report['draws']} audited steps.")
  cs = g["confidence_sequence"]
  lines += [
    "",
    f"Fires when the mean gap's confidence sequence leaves {band}, or the "
    f"{int(100 * a['coverage_level'])}% intervals' coverage is surely below {floor:.2f}, or "
    f"some tag's own mean gap leaves {band} (alpha split over the three, and over the tags); "
    f"false-alarm rate <= {a['alpha']} however long the audit runs.",
    "",
    "| | estimate | anytime-valid bound |",
    "|---|---|---|",
    f"| mean gap (prediction - rollouts) | {g['mean']:+.4f} +- {g['stderr']:.4f} | "
    + (f"[{cs[0]:+.4f}, {cs[1]:+.4f}] |" if cs else "n/a |"),
    f"| coverage of the {int(100 * a['coverage_level'])}% intervals | {c['mean']:.3f} | "
    + (
      f"<= {c['upper_confidence_bound']:.3f} |"
      if c["upper_confidence_bound"] is not None
      else "n/a |"
    ),
    "",
    *(
      [
        "",
        "| tag (the alarm's slices) | anytime-valid bound on its mean gap |",
        "|---|---|",
        *(
          f"| {sl['slice']} | [{sl['confidence_sequence'][0]:+.4f}, "
          f"{sl['confidence_sequence'][1]:+.4f}] |"
          for sl in report["slice_alarm"]
        ),
      ]
      if report["slice_alarm"]
      else []
    ),
    "",
    "## Gap per slice (weighted means over draws, 95% bootstrap CIs)",
    "",
    "| slice | draws | mean gap | coverage |",
    "|---|---|---|---|",
  ]
  for sl in report["slices"]:
    gg, cc = sl["gap"], sl["coverage"]
    lines.append(
      f"| {sl['slice']} | {sl['draws']} | {gg['value']:+.4f} [{gg['lo']:+.4f}, {gg['hi']:+.4f}] "
      f"| {cc['value']:.3f} [{cc['lo']:.3f}, {cc['hi']:.3f}] |"
    )
  lab = report.get("labels")
  lines += [
    "",
    f"Audited steps as a label dataset: `{lab}` (fine-tune: docs/audit.md).",
    f"Total {report['seconds']} s. Plot: alarm.png.",
    "",
  ]
  return "\n".join(lines)


def plot_alarm(path: str, report: dict, trace, draws) -> None:
  """The confidence sequences against the cumulative rollout cost, with the bands."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  a = report["alarm"]
  cost = np.cumsum(draws.label["rollout_steps"])
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
  ax1.fill_between(cost, trace.gap_lower, trace.gap_upper, alpha=0.35, label="confidence sequence")
  ax1.axhspan(-a["tolerance"], a["tolerance"], color="green", alpha=0.15, label="tolerance")
  ax1.set(xscale="log", xlabel="env steps of rollouts", ylabel="mean gap", title="mean gap")
  span = max(8 * a["tolerance"], float(np.nanmax(np.abs(trace.gap_lower[-1:]))) * 2, 1e-6)
  ax1.set_ylim(-span, span)
  ax2.plot(cost, trace.coverage_upper, label="upper confidence bound")
  ax2.axhline(a["coverage_level"], color="k", lw=0.8, label="nominal")
  ax2.axhline(a["coverage_level"] - a["coverage_tolerance"], color="red", lw=0.8, label="floor")
  ax2.set(xscale="log", xlabel="env steps of rollouts", ylabel="coverage", title="coverage")
  ax2.set_ylim(0, 1.05)
  v = report["verdict"]
  for ax in (ax1, ax2):
    if v["alarm"]:
      ax.axvline(v["fired_after_env_steps"], color="red", ls="--", lw=1, label="alarm")
    ax.legend(fontsize=7, loc="lower right")
  fig.tight_layout()
  fig.savefig(path + ".tmp.png", dpi=110)
  plt.close(fig)
  os.replace(path + ".tmp.png", path)


def write_report(out: str, report: dict, trace, draws) -> None:
  """OUT/alarm.png, OUT/report.md and, last (it marks a finished audit), OUT/report.json."""
  if draws.size:
    plot_alarm(os.path.join(out, "alarm.png"), report, trace, draws)
  atomic_write_text(os.path.join(out, "report.md"), markdown(report))
  write_json(os.path.join(out, "report.json"), report)


def verdict_text(report: dict) -> str:
  """The audit's verdict in two console lines (`hindsight audit`)."""
  v, g = report["verdict"], report["gap"]
  cs = g["confidence_sequence"]
  unit = report.get("budget_unit", "env steps")
  head = (
    f"DRIFT ALARM ({v['reason']}) after {v['fired_after_draws']} audited steps, "
    f"{v['fired_after_env_steps']:.3g} {unit}"
    if v["alarm"]
    else f"no alarm after {report['draws']} audited steps"
  )
  gap = f"mean gap {g['mean']:+.4f}" + (
    f", confidence sequence [{cs[0]:+.4f}, {cs[1]:+.4f}]" if cs else ""
  )
  return (
    f"audit of {report['env']}: {head} ({report['spent_env_steps']:.3g} of "
    f"{report['budget']:.3g} {unit} spent)\n  {gap}; coverage {report['coverage']['mean']:.3f}"
  )
