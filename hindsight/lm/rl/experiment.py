"""Every text credit source on one language model (`hindsight rl --config rl_text --sources
a,b,c`): does credit-shaped training shorten an LM's traces without costing accuracy?

The policy LM is trained once (OUT/lm, unless the config names one) and the learned models
fitted once (OUT/setup); each source then trains from them into OUT/SOURCE. Seed i of every
source draws the same prompts (keys of the seed, not of the source), so sources compare
paired by seed. Writes
  OUT/results.json   per source its run's results.json, and the summary
  OUT/table.md       per source: the seeds' means with 95% t-intervals at the last update;
                     mc_credit against outcome, paired by seed; the learned sources' gaps to
                     the reference per sentence class and their warnings
  OUT/curves.png     success, tokens, steps and decorative share against completions spent
  OUT/budget.png     success and tokens per trace against completions spent per run (policy
                     + credit, the learned models' data included), and against updates
"""

from __future__ import annotations

import os

import numpy as np

from hindsight.rl.experiment import (
  COLLAPSE_DROP,
  RANGES,
  check_sources,
  chunk_means,
  ci_text,
  collapsed,
  curves,
  mean_ci,
  own_label_lines,
  warning_lead,
)
from hindsight.worlds.world import SENTENCE_TAGS

MEASURES = ("success", "tokens", "length", "decorative", "recovered")


def summarize(results: dict) -> dict:
  """Per source: the seeds' means with 95% t-intervals of MEASURES at the last point, what
  the run spent (completions and tokens per seed, the models' data amortised over seeds),
  its drift against the reference and its warnings' leads."""
  rows = {}
  for name, r in results.items():
    seeds = r["seeds"]
    setup = r["setup"]["completions"]
    credit = float(np.mean([s["credit_env_steps"] for s in seeds]))
    row = {m: mean_ci([s[m] for s in seeds], RANGES[m]) for m in MEASURES}
    drift = "drift" in seeds[0]
    row.update(
      policy_completions=float(np.mean([s["policy_env_steps"] for s in seeds])),
      credit_completions=credit,
      credit_tokens=float(np.mean([s["credit_tokens"] for s in seeds])),
      amortised_completions=credit - setup + setup / len(seeds),
      collapsed=collapsed(r),
      wall_seconds=float(r["wall_seconds"] + r["setup_seconds"]),
      gap=mean_ci([s["drift"]["mean_gap"] for s in seeds]) if drift else None,
      spearman=mean_ci([s["drift"]["spearman"] for s in seeds]) if drift else None,
      lead=warning_lead(r) if drift else None,
      warnings=r.get("warnings", {}),
      class_gap=class_gaps(r) if drift else None,
      alarm=alarm_lead(r) if r.get("learned") else None,
      **chunk_means(r),
    )
    rows[name] = row
  return rows


def alarm_lead(result: dict) -> list[dict]:
  """Per seed: the training alarm's first firing (`rl.alarm`: an update, from the last
  point's alarm_update; None: never), the first evaluation point whose success is more than
  COLLAPSE_DROP below the start's, and the lead (fell - warned, in updates)."""
  out = []
  for d, seed in zip(warning_lead(result, "training_alarm"), result["seeds"], strict=True):
    warned = seed.get("alarm_update")
    lead = d["fell"] - warned if warned is not None and d["fell"] is not None else None
    out.append({"warned": warned, "fell": d["fell"], "lead": lead})
  return out


def class_gaps(result: dict) -> dict:
  """sentence class -> mean over seeds of the last point's mean gap (prediction - reference)
  on that class's steps, and their count."""
  out = {}
  for tag in SENTENCE_TAGS:
    gaps, count = [], 0
    for s in result["seeds"]:
      tags = s["drift"].get("tags", {})  # {tag: [mean, lower, upper, count]}
      if tag in tags:
        gaps.append(tags[tag][0])
        count += int(tags[tag][3])
    if gaps:
      out[tag] = {"gap": float(np.mean(gaps)), "steps": count}
  return out


def paired(results: dict, a: str, b: str, measure: str):
  """(mean, lo, hi) over seeds of a's measure minus b's at the last point (seed i of both
  drew the same prompts)."""
  x = [sa[measure] - sb[measure]
       for sa, sb in zip(results[a]["seeds"], results[b]["seeds"], strict=True)]  # fmt: skip
  return mean_ci(x)


def answer(results: dict, rows: dict) -> list[str]:
  """The question's answer in lines: mc_credit against outcome, paired by seed, and how each
  learned source stands against mc_credit's length and cost."""
  lines = []
  if "mc_credit" in rows and "outcome" in rows:
    lines += ["", "mc_credit minus outcome, paired by seed (95% t-interval of the differences):",
              ""]  # fmt: skip
    for m, fmt in (("tokens", ".1f"), ("length", ".2f"), ("decorative", ".3f"),
                   ("success", ".3f")):  # fmt: skip
      lines.append(f"- {m}: {ci_text(paired(results, 'mc_credit', 'outcome', m), fmt)}")
    lo, hi = rows["outcome"]["success"][1:]
    inside = lo <= rows["mc_credit"]["success"][0] <= hi
    where = "inside" if inside else "outside"
    lines.append(f"- mc_credit's success {rows['mc_credit']['success'][0]:.3f} is {where} "
                 f"outcome's interval [{lo:.3f}, {hi:.3f}]")  # fmt: skip
  if "mc_credit" in rows:
    mc = rows["mc_credit"]
    learned = [n for n, r in rows.items() if r["gap"] is not None]
    if learned:
      lines += ["", "Learned sources against mc_credit (tokens per trace within its interval; "
                "credit completions per run, the models' data amortised over seeds, as a "
                "share of its):", ""]  # fmt: skip
      for n in learned:
        r = rows[n]
        inside = mc["tokens"][1] <= r["tokens"][0] <= mc["tokens"][2]
        share = r["amortised_completions"] / max(mc["credit_completions"], 1.0)
        where = "inside" if inside else "outside"
        lines.append(f"- {n}: collapsed {r['collapsed']}, tokens {r['tokens'][0]:.1f} ({where} "
                     f"[{mc['tokens'][1]:.1f}, {mc['tokens'][2]:.1f}]), completions "
                     f"{share:.1%} of mc_credit's")  # fmt: skip
  return lines


def markdown(rows: dict, results: dict, start: dict, seeds: int, command: str) -> str:
  lines = [
    "# Credit sources on a language model",
    "",
    f"`{command}`: {seeds} seeds each; means with 95% t-intervals over seeds at the last",
    "update, on fresh prompts (one completion each). Completions and tokens per seed; the",
    "learned models' data is in every seed's credit completions (amortised: charged once",
    "between the seeds). Wall time for all seeds, setup included.",
    "",
    f"Initial policy: success {start['success']:.3f}, {start['tokens']:.1f} tokens and "
    f"{start['length']:.2f} steps per trace, decorative share {start['decorative']:.3f}.",
    "",
    "| source | success | tokens | steps | decorative share | recovered / trace | collapsed "
    "| policy completions | credit completions | amortised | credit tokens | wall s "
    "| gap to reference | Spearman |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  notes = []
  for n, r in rows.items():
    lines.append(
      f"| {n} | {ci_text(r['success'])} | {ci_text(r['tokens'], '.1f')} "
      f"| {ci_text(r['length'], '.2f')} "
      f"| {ci_text(r['decorative'])} | {ci_text(r['recovered'], '.2f')} | {r['collapsed']}/{seeds} "
      f"| {r['policy_completions']:.0f} | {r['credit_completions']:.0f} "
      f"| {r['amortised_completions']:.0f} | {r['credit_tokens']:.3g} | {r['wall_seconds']:.0f} "
      f"| {ci_text(r['gap'], '+.3f') if r['gap'] else ''} "
      f"| {ci_text(r['spearman']) if r['spearman'] else ''} |"
    )
    notes += [f"- {n}: {m}" for m in r["warnings"].values()]
  lines += answer(results, rows)
  gapped = {n: r["class_gap"] for n, r in rows.items() if r["class_gap"]}
  if gapped:
    tags = [t for t in SENTENCE_TAGS if any(t in g for g in gapped.values())]
    lines += ["", "Mean gap to the reference (predicted - resampled credit) per sentence class "
              "at the last point, mean over seeds (steps):", "",
              "| source | " + " | ".join(tags) + " |", "|---|" + "---|" * len(tags)]  # fmt: skip
    for n, g in gapped.items():
      cells = [f"{g[t]['gap']:+.3f} ({g[t]['steps']})" if t in g else "" for t in tags]
      lines.append(f"| {n} | " + " | ".join(cells) + " |")
  leads = {n: r["lead"] for n, r in rows.items() if r["lead"]}
  if leads:
    lines += ["", "First update of the credit_drift warning / first update whose success is "
              f"more than {COLLAPSE_DROP:g} below its start, per seed:", ""]  # fmt: skip
    lines += [f"- {n}: " + ", ".join(f"{d['warned']}/{d['fell']}" for d in per)
              for n, per in leads.items()]  # fmt: skip
  alarms = {n: r["alarm"] for n, r in rows.items() if r["alarm"]}
  if alarms:
    lines += ["", "First update of the training alarm / first update whose success is more "
              f"than {COLLAPSE_DROP:g} below its start, per seed (- : never):", ""]  # fmt: skip
    dash = lambda v: "-" if v is None else str(v)  # noqa: E731
    lines += [f"- {n}: " + ", ".join(f"{dash(d['warned'])}/{dash(d['fell'])}" for d in per)
              for n, per in alarms.items()]  # fmt: skip
  lines += own_label_lines(rows, "update")
  if notes:
    lines += ["", "Warnings (the last of each kind):", *notes]
  return "\n".join(lines) + "\n"


def plot(path: str, results: dict) -> None:
  """curves.png: success, tokens, steps and decorative share against completions per run."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 4, figsize=(20, 4))
  for ax, m in zip(axes, ("success", "tokens", "length", "decorative"), strict=True):
    curves(ax, results, lambda s, m=m: s[m])
    ax.set_xlabel("completions per run (policy + credit)")
    ax.set_title({"length": "steps per trace", "tokens": "tokens per trace",
                  "decorative": "decorative share"}.get(m, m))  # fmt: skip
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_budget(path: str, results: dict) -> None:
  """budget.png: success and tokens per trace against completions spent per run (the
  models' data charged to each run), and success against policy updates."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
  curves(axes[0], results, lambda s: s["success"])
  curves(axes[1], results, lambda s: s["tokens"])
  curves(axes[2], results, lambda s: s["success"], by_update=True)
  for ax in axes[:2]:
    ax.set_xlabel("completions per run (policy + credit, the models' data included)")
  axes[2].set_xlabel("policy updates (equal policy samples)")
  axes[0].set_ylabel("success (fresh prompts)")
  axes[1].set_ylabel("tokens per trace")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def default_out(config) -> str:
  """runs/rl/text: where an experiment goes without --workdir."""
  del config
  return os.path.join("runs", "rl", "text")


def run_experiment(spec: str, overrides, sources, out: str, command: str) -> str:
  """Trains every source of `sources` on config `spec` (+ overrides) into OUT/SOURCE and
  writes the files of the module docstring; returns table.md's text."""
  from hindsight.config_io import load_config
  from hindsight.lm.rl.config import check_config
  from hindsight.lm.rl.sources import source_class
  from hindsight.lm.rl.trainer import policy_lm, train_and_evaluate

  check_sources(sources, source_class)
  base = load_config(spec, overrides)
  check_config(base)
  os.makedirs(out, exist_ok=True)
  shared = [f"lm={policy_lm(base, out)}"]
  if not base.setup_dir:
    shared.append(f"setup_dir={os.path.join(out, 'setup')}")
  results = {}
  for entry in sources:
    name, *settings = entry.split("@")
    config = load_config(spec, [*overrides, *settings, *shared, f"source={name}"])
    results[entry] = train_and_evaluate(config, os.path.join(out, entry.replace("/", "_")))
  return write_report(out, results, command)


def write_report(out: str, results: dict, command: str) -> str:
  """OUT/results.json, table.md, curves.png and budget.png of finished runs (`results`:
  source -> its results.json); returns table.md's text."""
  from hindsight.files import atomic_write_text, write_json

  rows = summarize(results)
  first = next(iter(results.values()))["curve"][0]["seeds"]
  start = {m: float(np.mean([s[m] for s in first])) for m in MEASURES}
  write_json(os.path.join(out, "results.json"), {"env": "text", "sources": results,
                                                 "summary": rows})  # fmt: skip
  table = markdown(rows, results, start, len(first), command)
  atomic_write_text(os.path.join(out, "table.md"), table)
  plot(os.path.join(out, "curves.png"), results)
  plot_budget(os.path.join(out, "budget.png"), results)
  return table
