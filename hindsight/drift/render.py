"""The drift report rendered: report.json, report.md and the plots (PNG), from the numbers
`drift.report.build_report` computed (nothing here computes a statistic)."""

from __future__ import annotations

import os

import numpy as np

from hindsight.files import write_json


def headline_text(report: dict) -> str:
  """A few console lines: the headline Spearman of each signal, and the reference check."""
  lines = [f"drift report on {report['env']} ({report['steps']} steps, Spearman vs reference):"]
  for name in report.get("signal_order", report["headline"]):
    lines.append(f"  {name:<36} {estimate_text(report['headline'][name]['spearman'], 3)}")
  ceiling = report["reference"].get("check", {}).get("spearman_ceiling")
  if ceiling is not None:
    lines.append(f"  the reference's noise ceiling for Spearman: {ceiling:.3f}")
  tied = tied_reference_note(report["reference"])
  if tied:
    lines.append(f"  ({tied})")
  if "equivalent_rollouts" in report:
    e = report["equivalent_rollouts"]
    k = e["k"]
    if e.get("undefined"):
      lines.append(f"  equivalent rollouts: K undefined ({e['undefined']})")
    else:
      lines.append(f"  equivalent rollouts: K = {estimate_text(k, 1)}")
  total = report.get("seconds", {}).get("total")
  if total is not None:
    lines.append(f"  wall time of the drift report: {total:.1f} s (a rerun reads its cache)")
  return "\n".join(lines)


def estimate_text(e: dict, digits: int) -> str:
  """`value [lo, hi]` of an Estimate's dict; n/a for a value or bound that is undefined
  (NaN, stored as null)."""
  text = lambda x: "n/a" if x is None or x != x else f"{x:.{digits}f}"  # noqa: E731
  if text(e["value"]) == "n/a":
    return "n/a"
  return f"{text(e['value'])} [{text(e['lo'])}, {text(e['hi'])}]"


def _fmt(e: dict, spec: str = ".3f") -> str:
  if e is None or e.get("value") is None or not np.isfinite(e["value"]):
    return "n/a"
  return f"{e['value']:{spec}} [{e['lo']:{spec}}, {e['hi']:{spec}}]"


def markdown(report: dict) -> str:
  r = report
  ref = r["reference"]
  lines = [
    f"# Drift report: {r['env']}",
    "",
    f"Model: `{r['checkpoint']}` step {r['model']['step']} (digest {r['model']['digest']}); "
    f"{r['episodes']} episodes, {r['steps']} steps, `{r['replacement']}` credit.",
    f"Reference: {ref['kind']}"
    + (f" at K={ref['rollouts']}" if ref["kind"] != "exact DP" else "")
    + _noise_line(ref)
    + _check_line(ref.get("check")),
    "",
    "## Headline: every signal against the reference (95% bootstrap CIs over episodes)",
    "",
    *([tied_reference_note(ref), ""] if tied_reference_note(ref) else []),
    "| signal | Spearman | Pearson | Kendall | MAE | mean gap | within-episode Spearman | "
    "pairwise acc. |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for name, m in r["headline"].items():
    lines.append(
      f"| {name} | {_fmt(m['spearman'])} | {_fmt(m['pearson'])} | {_fmt(m['kendall'])} | "
      f"{_fmt(m['mae'], '.4f')} | {_fmt(m['mean_gap'], '+.4f')} | {_fmt(m['within_spearman'])} | "
      f"{_fmt(m['pairwise_accuracy'])} |"
    )
  if "equivalent_rollouts" in r:
    e = r["equivalent_rollouts"]
    flops = e["model_flops_per_step"]
    cost = f"the model {e['model_seconds_per_step'] * 1e6:.3g} us per step" + (
      f" and {flops:.3g} FLOPs per step." if flops else "."
    )
    unit = r.get("cost_unit", "env steps")
    if e.get("undefined"):
      text = f"K is undefined: {e['undefined']}. For comparison, {cost}"
    else:
      text = (
        f"The model's error against the reference equals that of a Monte Carlo label with "
        f"**K = {_fmt(e['k'], '.1f')}** branches (training labels: K = {e['label_rollouts']}). "
        f"Such a label costs {e['env_steps_per_step']:.3g} {_unit_words(unit)} per step "
        f"({e['env_steps_per_step_per_rollout']:.3g} per branch"
        + (", three arms); " if unit == "env steps" else "); ")
        + cost
      )
    lines += ["", "## Equivalent rollouts", "", text]
  if "k_star" in r:
    lines += ["", "Every signal's equivalent rollouts (K*, the same measure):", ""]
    lines += [f"- {name}: {_fmt(k, '.1f')}" for name, k in r["k_star"].items()]
    if "k_star_share_of_observer" in r:
      lines.append(f"- the model reaches {r['k_star_share_of_observer']:.0%} of the observer's K*")
  if "top_recall" in r:
    k = r["top_recall"]["k"]
    lines += ["", f"Top-{k} recall over episodes of more than {k} steps (the {k} steps of "
              "largest |credit| found again):", ""]  # fmt: skip
    lines += [f"- {name}: {v:.3f}" for name, v in r["top_recall"].items() if name != "k"]
  c = r["calibration"]
  lines += [
    "",
    "## Calibration (the model's predictive mixture, reference noise added)",
    "",
    "| interval | coverage |",
    "|---|---|",
  ]
  lines += [f"| {k} | {_fmt(v)} |" for k, v in c["coverage"].items()]
  lines += ["", "Reliability diagram: `reliability.png`.", "", "## Classes (rows: reference)", ""]
  names = r["classes"]["names"]
  for key, title in (("model_vs_reference", "model"), ("labels_vs_reference", "training labels")):
    if key in r["classes"]:
      lines += [f"{title} (columns: {title} class)", "", "| | " + " | ".join(names) + " |"]
      lines.append("|---" * (len(names) + 1) + "|")
      for name, row in zip(names, r["classes"][key], strict=True):
        lines.append(f"| {name} | " + " | ".join(str(x) for x in row) + " |")
      lines.append("")
  lines += [
    "## Drift slices (model; change from the whole set, CI)",
    "",
    "| slice | steps | Spearman | change | MAE | change |",
    "|---|---|---|---|---|---|",
  ]
  for s in r["slices"]:
    lines.append(
      f"| {s['slice']} | {s['steps']} | {_fmt(s['spearman'])} | {_fmt(s['spearman_change'])} | "
      f"{_fmt(s['mae'], '.4f')} | {_fmt(s['mae_change'], '.4f')} |"
    )
  pt = r["per_tag"]
  lines += [
    "",
    "## Per tag: mean of each signal, centred, in its own standard deviations (z)",
    "",
    "| signal | "
    + " | ".join(pt["tags"])
    + (" | verify/restate - fact |" if pt["contrast"] else " |"),
    "|---" * (len(pt["tags"]) + 1 + bool(pt["contrast"])) + "|",
  ]
  for name, by_tag in pt["signals"].items():
    cells = [_fmt(by_tag[t], ".2f") for t in pt["tags"]]
    if pt["contrast"]:
      cells.append(_fmt(pt["contrast"][name], ".2f"))
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  if r.get("tag_means"):
    tm = r["tag_means"]
    names = [k for k in next(iter(tm.values())) if k not in ("steps", "reference")]
    lines += [
      "",
      "## Per tag: mean credit, and each signal's gap to the reference (credit units)",
      "",
      "| tag | steps | reference | "
      + " | ".join(f"{n}: mean | gap (relative)" for n in names)
      + " |",
      "|---" * (3 + 2 * len(names)) + "|",
    ]
    for tag, row in tm.items():
      cells = [f"{row[n]['mean']['value']:+.4f} | {_fmt(row[n]['gap'], '+.4f')} "
               f"({_percent(row[n]['relative'])})" for n in names]  # fmt: skip
      lines.append(
        f"| {tag} | {row['steps']} | {_fmt(row['reference'], '+.4f')} | " + " | ".join(cells) + " |"
      )
  if "gradient" in r:
    g = r["gradient"]
    lines += [
      "",
      f"## Policy gradient on `{g['env']}` ({g['episodes']} episodes, MC K={g['rollouts']})",
      "",
      "bias dB = 20 log10(|g* - E g| / |g*|) (floor: what sampling alone gives), variance / "
      "mean(g*^2), SNR dB = 10 log10(|g*|^2 / mean |g_i - g*|^2).",
      "",
      "| credit source | bias dB | floor dB | variance | SNR dB |",
      "|---|---|---|---|---|",
    ]
    for name, s in g["rows"].items():
      lines.append(
        f"| {name} | {s['bias_db']:.1f} | {s['bias_floor_db']:.1f} | {s['variance']:.3g} | "
        f"{s['snr_db']:.1f} |"
      )
  plots = ["scatter.png", "reliability.png", "tags.png", "slices.png"]
  plots += ["gradient.png"] if "gradient" in r else []
  lines += ["", f"Total {r['seconds']['total']} s. Plots: {', '.join(plots)}.", ""]
  return "\n".join(lines)


def _percent(x) -> str:
  return "n/a" if x is None else f"{x:.1%}"


def tied_reference_note(ref: dict) -> str:
  """A warning when most reference credits are exactly 0 (Spearman then ranks ties), or ""."""
  share = ref.get("exact_zero_share", 0.0)
  if share <= 0.5:
    return ""
  return (
    f"The reference credit is exactly 0 on {share:.0%} of the steps: Spearman and Kendall "
    "mostly rank ties there; MAE and the mean gap read the fit."
  )


def _noise_line(ref: dict) -> str:
  share = f"{ref['tie_bounded_share']:.1%} of steps tie in every branch and carry a tie bound"
  if ref["kind"] == "exact DP":
    return ". "
  if ref["tie_bounded_share"] >= 1.0:
    return f"; its RMS stderr / credit spread is undefined (no sample stderr: {share}). "
  ratio = ref["stderr_over_spread"]
  return f"; its RMS stderr / credit spread = {ratio:.3f} (sample stderrs; {share}). "


def _unit_words(unit: str) -> str:
  return "environment steps" if unit == "env steps" else unit


def _check_line(check: dict | None) -> str:
  if check is None:
    return ""
  if check.get("steps", 1) == 0:
    return (
      f"Check ({check['kind']}): undefined (no step of the check pass has a sample stderr to "
      "compare: every one is exact or tie-bounded)."
    )
  if "variance_ratio" in check:
    line = (
      f"Check ({check['kind']}, {check['steps']} steps): between-pass variance / reported "
      f"stderr^2 = {check['variance_ratio']:.3f} (1 = honest)."
    )
    if "spearman_ceiling" in check:
      line += (
        f" The two passes rank the steps alike at Spearman "
        f"{check['spearman_between_passes']:.3f}: no predictor, the true credit included, "
        f"scores much above **{check['spearman_ceiling']:.3f}** against this reference (its "
        "noise ceiling)."
      )
    return line
  return (
    f"Check ({check['kind']}, {check['steps']} steps): z RMS {check['z_rms']:.3f} (1 = honest)."
  )


def write_report(out: str, report: dict, main, shift_sets) -> None:
  """report.json and report.md (atomic), then the plots."""
  from hindsight.files import atomic_write_text

  write_json(os.path.join(out, "report.json"), report)
  atomic_write_text(os.path.join(out, "report.md"), markdown(report))
  _plots(out, report, main)


def _plots(out: str, report: dict, main) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = main.cols
  ok = np.isfinite(cols["ref_credit"])
  panels = [("model_credit", "model (one forward pass)")]
  if "label_credit" in cols:
    panels.append(("label_credit", f"training labels (K={report['label_rollouts']})"))
  fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 5), squeeze=False)
  x = cols["ref_credit"][ok]
  for ax, (col, title) in zip(axes[0], panels, strict=True):
    y = np.asarray(cols[col], float)[ok]
    good = np.isfinite(y)
    ax.scatter(x[good], y[good], s=4, alpha=0.3)
    lo, hi = float(min(x.min(), y[good].min())), float(max(x.max(), y[good].max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xlabel("reference credit")
    ax.set_ylabel(title)
  fig.suptitle(f"{report['env']}: predicted and labeled credit against the reference")
  fig.tight_layout()
  fig.savefig(os.path.join(out, "scatter.png"), dpi=100)
  plt.close(fig)

  rel = report["calibration"]["reliability"]
  fig, ax = plt.subplots(figsize=(4.5, 4.5))
  ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="calibrated")
  ax.plot(rel["levels"], rel["observed"], "o-", label="model")
  ax.set_xlabel("nominal central-interval level")
  ax.set_ylabel("share of reference credits inside")
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out, "reliability.png"), dpi=100)
  plt.close(fig)

  pt = report["per_tag"]
  names, tags = list(pt["signals"]), pt["tags"]
  fig, ax = plt.subplots(figsize=(max(8.0, 1.4 * len(tags)), 5))
  width = 0.8 / len(names)
  for i, name in enumerate(names):
    est = [pt["signals"][name][t] for t in tags]
    v = np.array([e["value"] if e["value"] is not None else np.nan for e in est], float)
    lo = np.array([e["lo"] if e["lo"] is not None else np.nan for e in est], float)
    hi = np.array([e["hi"] if e["hi"] is not None else np.nan for e in est], float)
    ax.bar(np.arange(len(tags)) + i * width, v, width, yerr=_yerr(v, lo, hi), label=name, capsize=1)
  ax.set_xticks(np.arange(len(tags)) + 0.4 - width / 2, tags, rotation=30, ha="right")
  ax.axhline(0, color="k", lw=0.5)
  ax.set_ylabel("mean per step (z: units of the signal's std)")
  ax.legend(fontsize=7, ncol=2, loc="lower left")
  fig.tight_layout()
  fig.savefig(os.path.join(out, "tags.png"), dpi=100)
  plt.close(fig)

  if "gradient" in report:
    _gradient_plot(plt, os.path.join(out, "gradient.png"), report["gradient"])

  rows = report["slices"]
  fig, ax = plt.subplots(figsize=(6, 0.3 * len(rows) + 1.5))
  v = np.array([r["spearman"]["value"] or np.nan for r in rows], float)
  lo = np.array([r["spearman"]["lo"] or np.nan for r in rows], float)
  hi = np.array([r["spearman"]["hi"] or np.nan for r in rows], float)
  y = np.arange(len(rows))[::-1]
  ax.errorbar(v, y, xerr=_yerr(v, lo, hi), fmt="o", capsize=2)
  whole = report["headline"]["model (point)"]["spearman"]["value"]
  if whole is not None:
    ax.axvline(whole, color="k", lw=0.8, ls="--")
  ax.set_yticks(y, [r["slice"] for r in rows])
  ax.set_xlabel("model Spearman against the reference")
  fig.tight_layout()
  fig.savefig(os.path.join(out, "slices.png"), dpi=100)
  plt.close(fig)


def _gradient_plot(plt, path: str, g: dict) -> None:
  """Bias (with its sampling floor) and SNR of every credit source's policy gradient."""
  names = list(g["rows"])
  rows = [g["rows"][n] for n in names]
  y = np.arange(len(names))[::-1]
  fig, (a, b) = plt.subplots(1, 2, figsize=(10, 0.3 * len(names) + 1.5), sharey=True)
  a.barh(y, [r["bias_db"] for r in rows], color="tab:red", alpha=0.7, label="bias")
  a.plot([r["bias_floor_db"] for r in rows], y, "k|", ms=12, label="sampling floor")
  a.set_xlabel("bias dB (above the floor: real bias)")
  a.legend(fontsize=7)
  b.barh(y, [r["snr_db"] for r in rows], color="tab:blue", alpha=0.7)
  b.set_xlabel("SNR dB (higher is better)")
  a.set_yticks(y, names)
  fig.suptitle(f"policy gradient on {os.path.basename(g['env'])}, {g['episodes']} episodes")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _yerr(v, lo, hi) -> np.ndarray:
  """Error-bar lengths; a percentile interval of a few resamples can miss its own point
  estimate, and matplotlib refuses negative lengths."""
  return np.nan_to_num(np.maximum(np.stack([v - lo, hi - v]), 0.0))
