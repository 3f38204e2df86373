"""The credit of an agent's steps, tool calls against thoughts (docs/agents-text.md).

  python eval/agent_credit.py --traces 4000 [--labels DIR ...] [--out FILE.json] [--plot FILE.png]

On the tool world's scripted agent, exactly (`tool_world.exact_credit`, no sampling): for
`--traces` traces of the agent and its environment,
  - the decorative share (|credit| <= --tolerance) among tool calls and among thoughts, under
    the `policy` replacement (the step redrawn) and `null` (the step replaced by a restatement:
    for a call, the call not made), each with a 95% bootstrap interval over traces;
  - per kind of step (lookup, sum, write, the corrupting write, submit, ...): its count, mean
    credit under both replacements, decorative and harmful shares;
  - the irreversible submit: its credit under both replacements, by whether the ledger held
    the total;
  - how a progress reward model at its best ranks steps: the Bayes observer's
    P(success | the steps so far) (`tool_world.observer`, the competence unknown to it), its
    increment at each step against the interventional credit (Spearman), on calls and on
    thoughts.
With `--labels DIR` (an agent-trace label dataset: the tool world's, or a language model's
acting in it), the same shares from the labels: a step is decorative when its estimate is
within the tolerance (point) and when its class is `decorative` (its interval inside the
tolerance), with bootstrap intervals over traces.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import numpy as np
from scipy import stats

from hindsight.credit.names import KLASS_NAMES
from hindsight.data import open_labels
from hindsight.data.labels import as_text
from hindsight.metrics.drift import bootstrap
from hindsight.text.agent_trace import agent_view
from hindsight.worlds import tool_world as tw

CALL_TAGS = ("search", "read", "lookup", "write", "write_double", "submit")
RESAMPLES = 2000  # of the traces, for every interval


def bootstrap_share(flags: list[np.ndarray], seed: int) -> tuple[float, float, float]:
  """(share, 2.5%, 97.5%) of True among all steps, the traces resampled
  (`metrics.drift.bootstrap`; `flags`: one bool array per trace)."""
  hits = np.array([f.sum() for f in flags], np.float64)
  sizes = np.array([f.size for f in flags], np.float64)
  if sizes.sum() == 0:
    return float("nan"), float("nan"), float("nan")
  value, lo, hi, _ = bootstrap(len(flags), lambda i: hits[i].sum() / max(sizes[i].sum(), 1),
                               RESAMPLES, seed)  # fmt: skip
  return float(value), float(lo), float(hi)


def bootstrap_spearman(x: list[np.ndarray], y: list[np.ndarray], seed: int):
  """(Spearman rho of the pooled steps, 2.5%, 97.5%), the traces resampled."""
  keep = [i for i, v in enumerate(x) if v.size]
  x, y = [x[i] for i in keep], [y[i] for i in keep]

  def rho(picked):
    return stats.spearmanr(np.concatenate([x[i] for i in picked]),
                           np.concatenate([y[i] for i in picked])).statistic  # fmt: skip

  value, lo, hi, _ = bootstrap(len(x), rho, RESAMPLES // 4, seed)
  return float(value), float(lo), float(hi)


def _kind_stats(credits: dict, tolerance: float) -> dict:
  """Count, mean credit, decorative and harmful shares of one kind of step, per replacement."""
  out = {"steps": len(credits["policy"])}
  for q in ("policy", "null"):
    c = np.asarray(credits[q])
    out[f"mean_{q}"] = float(c.mean())
    out[f"decorative_{q}"] = float(np.mean(np.abs(c) <= tolerance))
    out[f"harmful_{q}"] = float(np.mean(c < -tolerance))
  return out


def scripted(count: int, seed: int, tolerance: float) -> dict:
  """The exact measurements of the module docstring on `count` traces of the scripted agent."""
  rows = []  # per trace: tags [T], credit under policy / null [T], the observer's increments [T]
  for trace in tw.sample_traces(seed, count):
    view = agent_view(trace, trace.id, unit="chunks")
    texts = [s.text for s in view.trace.steps]
    task = tw.parse_task(trace.prompt)
    state = tw.parse_steps(task, texts)
    policy = tw.exact_credit(task, state.actions, "policy")["credit"]
    null = tw.exact_credit(task, state.actions, "null")["credit"]
    p_success = tw.observer(task, state.actions)[1]
    rows.append({"tags": np.array([tw.TAG_OF_ACTION[a] for a in state.actions]),
                 "actions": np.array(state.actions), "policy": policy, "null": null,
                 "prm": np.diff(p_success), "success": trace.outcome > 0.5})  # fmt: skip
  out: dict = {
    "traces": count,
    "steps": int(sum(r["tags"].size for r in rows)),
    "success": float(np.mean([r["success"] for r in rows])),
    "tolerance": tolerance,
  }
  is_call = [np.isin(r["tags"], CALL_TAGS) for r in rows]
  for q in ("policy", "null"):
    decorative = [np.abs(r[q]) <= tolerance for r in rows]
    out[f"decorative_calls_{q}"] = bootstrap_share(
      [d[c] for d, c in zip(decorative, is_call, strict=True)], seed
    )
    out[f"decorative_thoughts_{q}"] = bootstrap_share(
      [d[~c] for d, c in zip(decorative, is_call, strict=True)], seed
    )
    harmful = [(r[q] < -tolerance)[...] for r in rows]
    out[f"harmful_recovered_{q}"] = bootstrap_share([h for h, r in zip(harmful, rows, strict=True)
                                                     if r["success"]], seed)  # fmt: skip
    out[f"prm_spearman_calls_{q}"] = bootstrap_spearman(
      [r["prm"][c] for r, c in zip(rows, is_call, strict=True)],
      [r[q][c] for r, c in zip(rows, is_call, strict=True)],
      seed,
    )
    out[f"prm_spearman_thoughts_{q}"] = bootstrap_spearman(
      [r["prm"][~c] for r, c in zip(rows, is_call, strict=True)],
      [r[q][~c] for r, c in zip(rows, is_call, strict=True)],
      seed,
    )
  per = collections.defaultdict(lambda: collections.defaultdict(list))
  for r in rows:
    for i, tag in enumerate(r["tags"]):
      for q in ("policy", "null"):
        per[tag][q].append(r[q][i])
  out["by_kind"] = {
    tag: _kind_stats(v, tolerance)
    for tag, v in sorted(per.items(), key=lambda kv: -len(kv[1]["policy"]))
  }
  submit = {}
  for r in rows:
    last = r["tags"][-1] == "submit"
    if last:
      key = "ledger_right" if r["success"] else "ledger_wrong"
      for q in ("policy", "null"):
        submit.setdefault(key, {"policy": [], "null": []})[q].append(r[q][-1])
  out["submit"] = {k: {"steps": len(v["policy"]),
                       **{f"mean_{q}": float(np.mean(v[q])) for q in ("policy", "null")}}
                   for k, v in submit.items()}  # fmt: skip
  return out


def from_labels(path: str, tolerance: float, seed: int) -> dict:
  """The decorative shares of an agent-trace label dataset (module docstring)."""
  labels = open_labels(path)
  names = labels.metadata.tag_names
  point, certified, calls, errors = [], [], [], 0
  for example in labels:
    tags = [as_text(t) if not isinstance(t, int | np.integer) else names[t]
            for t in example["tags"]]  # fmt: skip
    credit = np.asarray(example["credit"], np.float64)
    calls.append(np.array([t == "tool_call" for t in tags]))
    # Calls the environment answered with an error (malformed, unknown tool, bad arguments).
    errors += sum("<tool_response>error: " in as_text(s) for s in example["step_text"])
    point.append(np.abs(credit) <= tolerance)
    certified.append(np.asarray(example["klass"]) == KLASS_NAMES.index("decorative"))
  out = {"dataset": path, "policy": labels.metadata.policy, "rollouts": labels.metadata.rollouts,
         "traces": len(labels), "completions": labels.metadata.completions,
         "tool_calls": labels.metadata.tool_calls,
         "success": float(np.mean([bool(e["success"]) for e in labels])),
         "steps": int(sum(c.size for c in calls)), "call_steps": int(sum(c.sum() for c in calls)),
         "error_results": int(errors)}  # fmt: skip
  for name, flags in (("point", point), ("certified", certified)):
    on_calls = [f[c] for f, c in zip(flags, calls, strict=True)]
    on_thoughts = [f[~c] for f, c in zip(flags, calls, strict=True)]
    out[f"decorative_calls_{name}"] = bootstrap_share(on_calls, seed)
    out[f"decorative_thoughts_{name}"] = bootstrap_share(on_thoughts, seed)
  return out


def _ci(v) -> str:
  return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"


def render(report: dict) -> str:
  s = report["scripted"]
  lines = [
    f"scripted agent, exact: {s['traces']} traces, {s['steps']} steps, success {s['success']:.3f}",
    "",
    "| | policy (redrawn) | null (not made / restated) |",
    "|---|---|---|",
    f"| decorative share, tool calls | {_ci(s['decorative_calls_policy'])} | "
    f"{_ci(s['decorative_calls_null'])} |",
    f"| decorative share, thoughts | {_ci(s['decorative_thoughts_policy'])} | "
    f"{_ci(s['decorative_thoughts_null'])} |",
    f"| harmful steps in successful traces | {_ci(s['harmful_recovered_policy'])} | "
    f"{_ci(s['harmful_recovered_null'])} |",
    f"| PRM increment vs credit, Spearman, calls | {_ci(s['prm_spearman_calls_policy'])} | "
    f"{_ci(s['prm_spearman_calls_null'])} |",
    f"| PRM increment vs credit, Spearman, thoughts | {_ci(s['prm_spearman_thoughts_policy'])} | "
    f"{_ci(s['prm_spearman_thoughts_null'])} |",
    "",
    "| step | count | mean credit policy | mean credit null | decorative policy / null | "
    "harmful policy / null |",
    "|---|---|---|---|---|---|",
  ]
  for tag, v in s["by_kind"].items():
    lines.append(f"| {tag} | {v['steps']} | {v['mean_policy']:+.3f} | {v['mean_null']:+.3f} | "
                 f"{v['decorative_policy']:.2f} / {v['decorative_null']:.2f} | "
                 f"{v['harmful_policy']:.2f} / {v['harmful_null']:.2f} |")  # fmt: skip
  lines += ["", "| submit | count | mean credit policy | mean credit null |", "|---|---|---|---|"]
  for k, v in s["submit"].items():
    lines.append(f"| {k} | {v['steps']} | {v['mean_policy']:+.3f} | {v['mean_null']:+.3f} |")
  for d in report.get("labels", []):
    lines += [
      "",
      f"labels {d['dataset']} ({d['policy']}, K = {d['rollouts']}): {d['traces']} traces, "
      f"success {d['success']:.3f}, {d['steps']} steps ({d['call_steps']} calls, "
      f"{d['error_results']} answered with an error), {d['completions']} completions, "
      f"{d['tool_calls']} tool calls",
      f"  decorative share, tool calls: point {_ci(d['decorative_calls_point'])}, certified "
      f"{_ci(d['decorative_calls_certified'])}",
      f"  decorative share, thoughts:   point {_ci(d['decorative_thoughts_point'])}, certified "
      f"{_ci(d['decorative_thoughts_certified'])}",
    ]
  return "\n".join(lines)


def plot(report: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  by = report["scripted"]["by_kind"]
  tags = list(by)
  x = np.arange(len(tags))
  fig, ax = plt.subplots(figsize=(8, 3.6))
  for i, q in enumerate(("policy", "null")):
    ax.bar(x + (i - 0.5) * 0.38, [by[t][f"mean_{q}"] for t in tags], 0.38,
           label=f"mean exact credit, {q}")  # fmt: skip
  ax.axhline(0, color="k", lw=0.6)
  ax.set_xticks(x, [f"{t}\n({by[t]['steps']})" for t in tags], fontsize=8)
  ax.set_ylabel("credit")
  ax.set_title("Tool world, scripted agent: exact credit by kind of step", fontsize=10)
  ax.legend(fontsize=8)
  fig.text(0.01, 0.01, "python eval/agent_credit.py", fontsize=7, color="0.4")
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=120)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--traces", type=int, default=4000, help="scripted traces (exact credit)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--tolerance", type=float, default=0.05, help="|credit| <= this: decorative")
  p.add_argument("--labels", action="append", default=[], help="an agent-trace label dataset")
  p.add_argument("--out", default="", help="write the report as JSON here")
  p.add_argument("--plot", default="", help="write the per-kind figure here")
  args = p.parse_args(argv)
  if args.traces < 2:
    p.error(f"--traces must be >= 2, got {args.traces}")
  report = {"scripted": scripted(args.traces, args.seed, args.tolerance)}
  report["labels"] = [from_labels(d, args.tolerance, args.seed) for d in args.labels]
  print(render(report))
  if args.out:
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(report, f, indent=1)
  if args.plot:
    plot(report, args.plot)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
