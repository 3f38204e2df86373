"""Every credit source on one environment: does credit-shaped training shorten traces?

  python eval/rl_experiment.py --config configs/rl_reasoning.py [--sources outcome,mc_credit]
      [--out runs/rl/reasoning] [--config.FIELD=VALUE ...]

Trains each source (`train.rl`'s trainer, seeds vmapped) into OUT/SOURCE, then writes
  OUT/results.json   per source and seed: final success rate, mean trace length, reference
                     class shares, tag shares, env steps for the policy and for credit, and
                     the run's wall time; per source the curves over evaluation points
  OUT/table.md       per source: the seeds' means with 95% t-intervals
  OUT/curves.png     success, trace length and decorative share against env steps
                     (policy + credit), mean and 95% band over seeds
Each run resumes where it stopped (a rerun of a finished experiment only re-reads it).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from scipy import stats

from hindsight.devices import use_all_cpu_cores


def mean_ci(values) -> tuple[float, float, float]:
  """(mean, lo, hi): the 95% t-interval of the mean over seeds (lo = hi = mean for one)."""
  x = np.asarray(values, np.float64)
  m = float(x.mean())
  if x.size < 2:
    return m, m, m
  half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
  return m, m - half, m + half


def decorative_share(seed: dict, decorative_tags) -> float:
  """The share of a seed's valid steps whose tag is a planted decorative one (reasoning),
  else the reference labels' decorative class share."""
  if decorative_tags and "tag_share" in seed:
    return float(sum(seed["tag_share"].get(t, 0.0) for t in decorative_tags))
  return float(seed["klass_share"]["decorative"])


def summarize(results: dict, decorative_tags) -> dict:
  rows = {}
  for name, r in results.items():
    seeds = r["seeds"]
    rows[name] = {
      "success": mean_ci([s["success"] for s in seeds]),
      "length": mean_ci([s["length"] for s in seeds]),
      "decorative": mean_ci([decorative_share(s, decorative_tags) for s in seeds]),
      "klass_decorative": mean_ci([s["klass_share"]["decorative"] for s in seeds]),
      "policy_env_steps": float(np.mean([s["policy_env_steps"] for s in seeds])),
      "credit_env_steps": float(np.mean([s["credit_env_steps"] for s in seeds])),
      "wall_seconds": float(r["wall_seconds"] + r["setup_seconds"]),
      # the policy's env steps per second of training (every seed; setup and the
      # evaluation points' reference labels left out, compiles included)
      "policy_steps_per_second": float(
        sum(s["policy_env_steps"] for s in seeds) / max(r["wall_seconds"], 1e-9)
      ),
      "drift": (mean_ci([s["drift"]["mean_gap"] for s in seeds]) if "drift" in seeds[0] else None),
      "spearman": (
        mean_ci([s["drift"]["spearman"] for s in seeds]) if "drift" in seeds[0] else None
      ),
    }
  return rows


def _ci(v, fmt=".3f") -> str:
  m, lo, hi = v
  return f"{m:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def markdown(env: str, rows: dict, start: dict, seeds: int, command: str) -> str:
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
    "| source | success | length | decorative share | policy env steps | credit env steps "
    "| wall s | policy steps/s | credit-model gap | Spearman vs reference |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in rows.items():
    drift = _ci(r["drift"], "+.3f") if r["drift"] else ""
    rho = _ci(r["spearman"]) if r["spearman"] else ""
    lines.append(
      f"| {name} | {_ci(r['success'])} | {_ci(r['length'], '.2f')} | {_ci(r['decorative'])} "
      f"| {r['policy_env_steps']:.3g} | {r['credit_env_steps']:.3g} | {r['wall_seconds']:.0f} "
      f"| {r['policy_steps_per_second']:.3g} | {drift} | {rho} |"
    )
  return "\n".join(lines) + "\n"


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
    for name, r in results.items():
      curve = r["curve"]
      x = [np.mean(np.add(p["policy_steps"], p["credit_steps"])) for p in curve]
      ys = np.array([[get(s) for s in p["seeds"]] for p in curve])  # [points, seeds]
      cis = np.array([mean_ci(y) for y in ys])
      ax.plot(x, cis[:, 0], label=name)
      ax.fill_between(x, cis[:, 1], cis[:, 2], alpha=0.2)
    ax.set_xscale("symlog", linthresh=1e4)
    ax.set_xlabel("env steps per seed (policy + credit)")
    ax.set_title(title)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  use_all_cpu_cores()  # before JAX starts (the registry of sources imports it)
  from hindsight.rl.sources import registered_sources

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True, help="configs/rl_NAME.py[:smoke]")
  parser.add_argument("--sources", default=",".join(registered_sources()), help="comma-separated")
  parser.add_argument("--out", default="", help="default runs/rl/ENV_NAME (':' as '_')")
  args, rest = parser.parse_known_args(argv)
  from hindsight.cli_options import config_overrides

  overrides = config_overrides(rest, "rl_experiment")
  if overrides is None:
    return 2
  from hindsight.compile_cache import enable_compilation_cache
  from hindsight.config_io import load_config
  from hindsight.envs import make
  from hindsight.errors import HindsightError
  from hindsight.files import atomic_write_text, write_json
  from hindsight.rl.trainer import train_and_evaluate

  enable_compilation_cache()
  sources = [s for s in args.sources.split(",") if s]
  unknown = [s for s in sources if s not in registered_sources()]
  if unknown:
    print(
      f"rl_experiment: unknown source {unknown[0]} (known: {', '.join(registered_sources())})",
      file=sys.stderr,
    )
    return 2
  try:
    base = load_config(args.config, overrides)
    env_name = make(base.env, horizon=int(base.horizon) or None)[0].name
    out = args.out or os.path.join("runs", "rl", env_name.replace(":", "_"))
    results = {}
    for name in sources:
      config = load_config(args.config, [*overrides, f"source={name}"])
      results[name] = train_and_evaluate(config, os.path.join(out, name))
  except HindsightError as e:
    print(f"rl_experiment: {e}", file=sys.stderr)
    return 2
  env, _ = make(base.env, horizon=int(base.horizon) or None)
  decorative_tags = [t for t in ("restate", "verify", "search_unused") if t in env.tag_names]
  rows = summarize(results, decorative_tags)
  first = next(iter(results.values()))["curve"][0]["seeds"]
  start = {
    "success": float(np.mean([s["success"] for s in first])),
    "length": float(np.mean([s["length"] for s in first])),
    "decorative": float(np.mean([decorative_share(s, decorative_tags) for s in first])),
  }
  command = " ".join(
    ["python eval/rl_experiment.py", *(argv if argv is not None else sys.argv[1:])]
  )
  write_json(
    os.path.join(out, "results.json"), {"env": base.env, "sources": results, "summary": rows}
  )
  table = markdown(base.env, rows, start, int(base.num_seeds), command)
  atomic_write_text(os.path.join(out, "table.md"), table)
  plot(os.path.join(out, "curves.png"), results, decorative_tags)
  print(table)
  return 0


if __name__ == "__main__":
  sys.exit(main())
