"""Every credit source on one environment (`hindsight rl --sources a,b,c`): does
credit-shaped training shorten traces?

Trains each source (`rl.trainer`, seeds vmapped) into OUT/SOURCE, then writes
  OUT/results.json   per source and seed: final success rate, mean trace length, reference
                     class shares, tag shares, env steps for the policy and for credit, and
                     the run's wall time; per source the curves over evaluation points
  OUT/table.md       per source: the seeds' means with 95% t-intervals
  OUT/curves.png     success, trace length and decorative share against env steps
                     (policy + credit), mean and 95% band over seeds
  OUT/budget.png     success against total env steps per run (policy + credit, labels and
                     audits included), every source on one axis
Each run resumes where it stopped (a rerun of a finished experiment only re-reads it).
"""

from __future__ import annotations

import os

import numpy as np
from scipy import stats

# The reference's undetermined share above which its class shares say nothing (no table
# presents a tie as a finding): the trainer warns at the same level (rl.measure).
from hindsight.rl.measure import UNDETERMINED_WARNING, decorative_tags_of

# The range of every measure bounded by its definition (a rate, a share, a count): its
# interval is cut to it (a t-interval over a few seeds can reach past it: 0.81 [-0.78, 2.40]).
RANGES = {"success": (0.0, 1.0), "decorative": (0.0, 1.0), "klass_decorative": (0.0, 1.0),
          "undetermined": (0.0, 1.0), "tokens": (0.0, np.inf), "length": (0.0, np.inf),
          "recovered": (0.0, np.inf)}  # fmt: skip


def mean_ci(values, within: tuple[float, float] = (-np.inf, np.inf)):
  """(mean, lo, hi): the 95% t-interval of the mean over seeds (lo = hi = mean for one), cut
  to the range `within` the quantity cannot leave (`RANGES`); None when no seed has a value
  (a metric that was undefined everywhere)."""
  x = np.asarray([v for v in values if v is not None], np.float64)
  x = x[np.isfinite(x)]
  if x.size == 0:
    return None
  m = float(x.mean())
  if x.size < 2:
    return m, m, m
  half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
  return m, max(m - half, within[0]), min(m + half, within[1])


def decorative_share(seed: dict, decorative_tags) -> float:
  """The share of a seed's valid steps whose tag is a planted decorative one (reasoning),
  else the reference labels' decorative class share."""
  if decorative_tags and "tag_share" in seed:
    return float(sum(seed["tag_share"].get(t, 0.0) for t in decorative_tags))
  return float(seed["klass_share"]["decorative"])


# A collapse: final success more than this below the start's. The warning's lead is
# measured to the first evaluation point below the start by as much, not to a dip that the
# evaluation's own binomial noise (about 0.04 at 128 episodes) explains.
COLLAPSE_DROP = 0.1


def warning_lead(
  result: dict, kind: str = "credit_drift", fall: float = COLLAPSE_DROP
) -> list[dict]:
  """Per seed of one run: the first update whose evaluation point raised `kind` and the
  first whose success is more than `fall` below the start's (None: never), and the lead
  (fell - warned, in updates; None unless both happened)."""
  curve = result["curve"]
  out = []
  for i, first in enumerate(curve[0]["seeds"]):
    warned = next((p["update"] for p in curve if kind in p["seeds"][i].get("warnings", {})), None)
    fell = next(
      (p["update"] for p in curve if p["seeds"][i]["success"] < first["success"] - fall), None
    )
    lead = fell - warned if warned is not None and fell is not None else None
    out.append({"warned": warned, "fell": fell, "lead": lead})
  return out


def collapsed(result: dict, drop: float = COLLAPSE_DROP) -> int:
  """Seeds whose final success is more than `drop` below their start."""
  first, last = result["curve"][0]["seeds"], result["seeds"]
  return int(sum(b["success"] < a["success"] - drop for a, b in zip(first, last, strict=True)))


def _total_steps(curve, amortised_over: int = 1) -> np.ndarray:
  """Mean env steps per run at each evaluation point: policy + credit, with the setup (the
  model's labels of the initial policy, in every point's credit steps) divided between
  `amortised_over` runs that share it."""
  setup = np.mean(curve[0]["credit_steps"])
  total = np.array([np.mean(np.add(p["policy_steps"], p["credit_steps"])) for p in curve])
  return total - setup + setup / amortised_over


def success_at_budget(result: dict, budget: float) -> float:
  """Mean success over seeds at the last evaluation point whose total env steps per run
  (policy + credit) are within `budget`; the start's when none is."""
  curve = result["curve"]
  best = curve[0]
  for p, total in zip(curve, _total_steps(curve), strict=True):
    if total <= budget:
      best = p
  return float(np.mean([s["success"] for s in best["seeds"]]))


def budget_margins(result: dict, other: dict, from_share: float = 0.25) -> list[float]:
  """success(result) - success(other) at each of `result`'s evaluation points whose total
  env steps are at least `from_share` of its final total (its curve against the other's
  on the budget plot, from that share of the run on)."""
  totals = _total_steps(result["curve"])
  return [
    success_at_budget(result, b) - success_at_budget(other, b)
    for b in totals
    if b >= from_share * totals[-1]
  ]


def summarize(results: dict, decorative_tags) -> dict:
  """Per source: the seeds' means with 95% t-intervals and what the run spent. The
  source's model (labels of the initial policy) is in every seed's credit env steps; the
  seeds share it, so `amortised_credit_env_steps` charges it once between them."""
  rows = {}
  for name, r in results.items():
    seeds = r["seeds"]
    drift = "drift" in seeds[0]
    setup = float(np.mean(r["curve"][0]["credit_steps"]))
    credit = float(np.mean([s["credit_env_steps"] for s in seeds]))
    rows[name] = {
      "success": mean_ci([s["success"] for s in seeds], RANGES["success"]),
      "length": mean_ci([s["length"] for s in seeds], RANGES["length"]),
      "decorative": mean_ci(
        [decorative_share(s, decorative_tags) for s in seeds], RANGES["decorative"]
      ),
      "klass_decorative": mean_ci(
        [s["klass_share"]["decorative"] for s in seeds], RANGES["klass_decorative"]
      ),
      "undetermined": mean_ci(
        [s["klass_share"]["undetermined"] for s in seeds], RANGES["undetermined"]
      ),
      "policy_env_steps": float(np.mean([s["policy_env_steps"] for s in seeds])),
      "credit_env_steps": credit,
      "setup_env_steps": setup,
      "amortised_credit_env_steps": credit - setup + setup / len(seeds),
      "collapsed": collapsed(r),
      "wall_seconds": float(r["wall_seconds"] + r["setup_seconds"]),
      # the policy's env steps per second of training (every seed; setup and the
      # evaluation points' reference labels left out, compiles included)
      "policy_steps_per_second": float(
        sum(s["policy_env_steps"] for s in seeds) / max(r["wall_seconds"], 1e-9)
      ),
      "drift": mean_ci([s["drift"]["mean_gap"] for s in seeds]) if drift else None,
      "spearman": mean_ci([s["drift"]["spearman"] for s in seeds]) if drift else None,
      # kind -> message at the last update, as the run's results.json says them
      "warnings": r.get("warnings", {}),
      "lead": warning_lead(r) if drift else None,
      **chunk_means(r),
    }
  return rows


# What a source that learns from its own labels records per chunk (pp_credit), averaged
# over a seed's chunks, then over seeds.
CHUNK_FIELDS = ("label_share", "explained_variance", "rectifier_share", "noise_share", "lam")


def chunk_means(result: dict) -> dict:
  """field -> (mean, lo, hi) over seeds of each seed's mean over the run's chunks, for the
  CHUNK_FIELDS the source's between-chunk records carry; {} for the other sources."""
  chunks = result.get("refreshes") or []
  out = {}
  for field in CHUNK_FIELDS:
    per_seed = []
    for i in range(len(result["seeds"])):
      values = [c["seeds"][i].get(field) for c in chunks if c["seeds"][i]]
      values = [v for v in values if v is not None]
      per_seed.append(float(np.mean(values)) if values else None)
    if any(v is not None for v in per_seed):
      out[field] = mean_ci(per_seed)
  return out


def ci_text(v, fmt=".3f") -> str:
  """(mean, lo, hi) as "m [lo, hi]" in `fmt`; "n/a" for None."""
  if v is None:
    return "n/a"
  m, lo, hi = v
  return f"{m:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def markdown(
  env: str,
  rows: dict,
  start: dict,
  seeds: int,
  command: str,
  planted: bool,
  results: dict | None = None,
) -> str:
  """OUT/table.md. planted: the decorative share counts planted tags (reasoning), not the
  reference's classes, so an undetermined reference does not void it. results (the runs'
  results.json): adds the budget comparison of every source with a model."""
  lines = [
    f"# Credit sources on {env}",
    "",
    f"`{command}`: {seeds} seeds each; means with 95% t-intervals over seeds, at the last",
    "update, measured on fresh episodes by the reference labeler. Env steps per seed; wall",
    "time for all seeds together (they train vmapped), setup (models of the initial policy)",
    "included.",
    "",
    f"Initial policy: success {start['success']:.3f}, length {start['length']:.2f}, "
    f"decorative share {start['decorative']:.3f}.",
    "",
    "| source | success | length | decorative share | collapsed | policy env steps "
    "| credit env steps | amortised | wall s | policy steps/s | credit-model gap "
    "| Spearman vs reference |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  voided, notes = [], []
  for name, r in rows.items():
    undetermined = r["undetermined"][0] if r["undetermined"] else 0.0
    decorative = ci_text(r["decorative"])
    if not planted and undetermined > UNDETERMINED_WARNING:
      decorative = f"n/a (undetermined {undetermined:.2f})"
      voided.append(name)
    drift = ci_text(r["drift"], "+.3f") if r["drift"] else ""
    rho = ""
    if r["drift"]:
      # undefined in every seed: results.json's spearman_note says why
      rho = ci_text(r["spearman"]) if r["spearman"] else "n/a (undefined: see spearman_note)"
    lines.append(
      f"| {name} | {ci_text(r['success'])} | {ci_text(r['length'], '.2f')} | {decorative} "
      f"| {r['collapsed']}/{seeds} | {r['policy_env_steps']:.3g} | {r['credit_env_steps']:.3g} "
      f"| {r['amortised_credit_env_steps']:.3g} | {r['wall_seconds']:.0f} "
      f"| {r['policy_steps_per_second']:.3g} | {drift} | {rho} |"
    )
    notes += [f"- {name}: {m}" for m in r["warnings"].values()]
  leads = {n: r["lead"] for n, r in rows.items() if r["lead"]}
  if leads:
    lines += ["", "First update of the credit_drift warning / first update whose success is "
              f"more than {COLLAPSE_DROP:g} below its start, per seed:", ""]  # fmt: skip
    for n, per_seed in leads.items():
      cells = ", ".join(f"{d['warned']}/{d['fell']}" for d in per_seed)
      lines.append(f"- {n}: {cells}")
  rivals = [n for n in ("outcome", "mc_credit") if n in rows]
  modelled = [n for n, r in rows.items() if r["lead"] is not None]
  if results and rivals and modelled:
    lines += ["", "On the budget plot, from 25% of each run on (success minus the rival's "
              "at the same total env steps, at each evaluation point; min over points):",
              ""]  # fmt: skip
    for n in modelled:
      cells = []
      for rival in rivals:
        m = budget_margins(results[n], results[rival])
        cells.append(f"vs {rival} {min(m):+.3f} ({sum(x >= 0 for x in m)}/{len(m)} at or above)")
      lines.append(f"- {n}: " + ", ".join(cells))
  lines += ["", f"collapsed: seeds whose final success is more than {COLLAPSE_DROP:g} below "
            "their start. amortised: credit env steps per run when the seeds share one model "
            "(its labels charged once between them)."]  # fmt: skip
  if voided:
    lines += [
      "",
      f"Decorative share n/a ({', '.join(voided)}): more than {UNDETERMINED_WARNING:.0%} of "
      "the reference's steps are undetermined (their interval holds both 0 and the tolerance), "
      "so its class shares measure nothing. A return range (--config.return_range=LO:HI) "
      "bounds tied steps; more eval.rollouts narrow the rest.",
    ]
  lines += own_label_lines(rows, "chunk of updates")
  if notes:
    lines += ["", "Warnings:", *notes]
  return "\n".join(lines) + "\n"


def own_label_lines(rows: dict, per: str) -> list[str]:
  """The table block of the sources that label a share of their own steps (rows carrying
  `chunk_means`' fields), one record per `per`; [] when no source does."""
  own = {n: r for n, r in rows.items() if r.get("label_share")}
  if not own:
    return []
  lines = ["", f"Sources that label a share of their own steps (pp_credit), per {per}, mean "
           f"over those and seeds: the share of valid steps labelled, the model's explained "
           "variance on those fresh labels (against noisy labels: a lower bound), the weight "
           "lam on the model, the rectifier's share of the signal's variance (the rest is "
           "the model's), and the labels' Monte Carlo noise's share of the rectifier's (what "
           "no model can remove; the rest is the allocation's and the model's error):", "",
           "| source | labelled share | explained variance | lam | rectifier share "
           "| label-noise share |", "|---|---|---|---|---|---|"]  # fmt: skip
  for n, r in own.items():
    lines.append(f"| {n} | {ci_text(r['label_share'])} | {ci_text(r.get('explained_variance'))} "
                 f"| {ci_text(r.get('lam'))} | {ci_text(r.get('rectifier_share'))} "
                 f"| {ci_text(r.get('noise_share'))} |")  # fmt: skip
  return lines


def _styles(names) -> dict:
  """name -> {"color": ...}: a colour of tab20 each, the dark shades first, so up to twenty
  curves stay apart."""
  import matplotlib

  colours = matplotlib.colormaps["tab20"].colors
  return {n: {"color": colours[(2 * i) % 20 + (2 * i) // 20]} for i, n in enumerate(names)}


def curves(ax, results: dict, get, amortised_over: int = 1, by_update: bool = False) -> None:
  """Each source's mean and 95% band of `get(seed point)` against env steps per run on a
  log axis (or, by_update, against policy updates), sources with a model dashed; the
  initial policy's value (every source's point at update 0) is the dotted line, since a
  source that spends nothing before its first update has it at 0 env steps."""
  styles = _styles(list(results))
  for name, r in results.items():
    curve = r["curve"]
    updates = np.array([p["update"] for p in curve])
    x = updates if by_update else _total_steps(curve, amortised_over)
    cis = np.array([mean_ci([get(s) for s in p["seeds"]]) for p in curve])
    on = x >= 0 if by_update else x > 0
    dashed = "--" if r.get("learned") else "-"
    ax.plot(x[on], cis[on, 0], dashed, marker=".", ms=4, label=name, **styles[name])
    ax.fill_between(x[on], cis[on, 1], cis[on, 2], alpha=0.12, **styles[name])
  start = np.mean([get(s) for s in next(iter(results.values()))["curve"][0]["seeds"]])
  ax.axhline(start, color="0.5", ls=":", lw=1, label="initial policy")
  if not by_update:
    ax.set_xscale("log")


def plot(path: str, results: dict, decorative_tags) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  panels = (
    ("success", lambda s: s["success"]),
    ("mean trace length", lambda s: s["length"]),
    ("decorative share", lambda s: decorative_share(s, decorative_tags)),
  )
  for ax, (title, get) in zip(axes, panels, strict=True):
    curves(ax, results, get)
    ax.set_xlabel("env steps per seed (policy + credit)")
    ax.set_title(title)
  axes[0].legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_budget(path: str, results: dict) -> None:
  """Success against total env steps per run (policy + credit, labels and audits
  included), every source on one axis: as each run pays (left), with each source's model
  of the initial policy shared by the experiment's seeds, charged once between them
  (middle), and against policy updates, equal policy samples (right)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  seeds = len(next(iter(results.values()))["seeds"])
  fig, axes = plt.subplots(1, 3, figsize=(19, 4.8), sharey=True)
  for ax, share in zip(axes[:2], (1, seeds), strict=True):
    curves(ax, results, lambda s: s["success"], share)
    ax.set_xlabel(
      "total env steps per run (policy + credit, labels and audits included)"
      if share == 1
      else f"the same, the model of the initial policy shared by {share} runs"
    )
  # Against policy updates (equal policy samples): how a user whose policy's samples are
  # the expensive part (a language model) reads it.
  curves(axes[2], results, lambda s: s["success"], by_update=True)
  axes[2].set_xlabel("policy updates (equal policy samples)")
  axes[0].set_ylabel("success (reference, fresh episodes)")
  axes[0].legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def default_out(config) -> str:
  """runs/rl/ENV_NAME (':' as '_'): where an experiment goes without --workdir."""
  from hindsight.rl.task import make_task

  return os.path.join("runs", "rl", make_task(config).env.name.replace(":", "_"))


def check_sources(sources, source_class) -> None:
  """A one-line HindsightError when `sources` (NAME or NAME@FIELD=VALUE...) is empty or
  names a source `source_class` does not know."""
  from hindsight.errors import HindsightError

  if not sources:
    raise HindsightError("sources: name at least one credit source")
  for entry in sources:
    source_class(entry.split("@")[0])  # a one-line error naming the registered ones


def run_experiment(spec: str, overrides, sources, out: str, command: str) -> str:
  """Trains every source of `sources` on config `spec` (+ overrides) into OUT/SOURCE and
  writes the files of the module docstring; returns table.md's text."""
  from hindsight.config_io import load_config
  from hindsight.files import atomic_write_text, write_json
  from hindsight.rl.sources import source_class
  from hindsight.rl.task import make_task
  from hindsight.rl.trainer import train_and_evaluate

  check_sources(sources, source_class)
  base = load_config(spec, overrides)
  results = {}
  for entry in sources:
    # NAME or NAME@FIELD=VALUE[@...]: a source at settings of its own (a row of its own)
    name, *settings = entry.split("@")
    config = load_config(spec, [*overrides, *settings, f"source={name}"])
    results[entry] = train_and_evaluate(config, os.path.join(out, entry.replace("/", "_")))
  env = make_task(base).env
  tags = decorative_tags_of(env)
  rows = summarize(results, tags)
  first = next(iter(results.values()))["curve"][0]["seeds"]
  start = {
    "success": float(np.mean([s["success"] for s in first])),
    "length": float(np.mean([s["length"] for s in first])),
    "decorative": float(np.mean([decorative_share(s, tags) for s in first])),
  }
  write_json(os.path.join(out, "results.json"),
             {"env": base.env, "sources": results, "summary": rows})  # fmt: skip
  table = markdown(
    base.env, rows, start, int(base.num_seeds), command, planted=bool(tags), results=results
  )
  atomic_write_text(os.path.join(out, "table.md"), table)
  plot(os.path.join(out, "curves.png"), results, tags)
  plot_budget(os.path.join(out, "budget.png"), results)
  return table
