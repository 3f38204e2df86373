"""Text labels against the text world's exact credit (`hindsight text-world exact DIR`).

Each trace of a dataset labeled against the world is parsed back to the world's actions
(its prompt and `step_text`), `world.exact_credit` gives the truth, and every estimate is
scored by z = (estimate - truth) / stderr. Honest stderrs give z of RMS about 1 and |z| > 3
rarely; a stderr of 0 is an error wherever the estimate differs from the truth ("false exact
zeros").
"""

from __future__ import annotations

import numpy as np

from hindsight.errors import HindsightError

FIELDS = ("credit", "credit_realized", "progress", "phi")


def _text(x) -> str:
  return x.decode() if isinstance(x, bytes) else str(x)


def exact_labels(example: dict, replacement: str) -> dict[str, np.ndarray]:
  """The world's exact labels of one dataset example ([T] each)."""
  from hindsight.text import world

  prompt = _text(example["prompt"])
  problem = world.parse_problem(prompt)
  if problem is None:
    raise HindsightError("not a text-world dataset: a prompt lacks the problem header")
  actions = [world.parse_action(problem, _text(s)) for s in example["step_text"]]
  return world.exact_credit(problem, actions, replacement)


def compare_to_exact(path: str) -> dict:
  """z-scores of every labeled step of the dataset at `path` against the world's DP."""
  from hindsight.data import open_labels

  labels = open_labels(path)
  replacement = labels.metadata.get("replacement", "policy")
  per_field = {f: {"z": [], "err": [], "false_zeros": 0} for f in FIELDS}
  # Credit's z over the steps whose stderr is a sample stderr, not the tie bound (which is
  # conservative by design): honest stderrs give an RMS near 1 there.
  sampled_z = []
  # Undefined by the estimate alone: the truth exists, but --max-draws x K draws found
  # fewer than 2 that avoid the step's content (content the policy nearly always writes).
  too_rare = undefined_by_truth_only = 0
  for example in labels:
    truth = exact_labels(example, replacement)
    undefined = np.asarray(example["undefined"], bool)
    too_rare += int((undefined & ~truth["undefined"]).sum())
    undefined_by_truth_only += int((~undefined & truth["undefined"]).sum())
    ok = ~undefined & ~truth["undefined"]
    for f in FIELDS:
      est = np.asarray(example[f], np.float64)[ok]
      se = np.asarray(example[f + "_stderr"], np.float64)[ok]
      true = truth[f][ok]
      err = est - true
      exact = se == 0
      per_field[f]["false_zeros"] += int((exact & (np.abs(err) > 1e-6)).sum())
      per_field[f]["z"].extend((err[~exact] / se[~exact]).tolist())
      per_field[f]["err"].extend(err.tolist())
      if f == "credit":
        sampled = ~exact & ~np.asarray(example["credit_bounded"], bool)[ok]
        sampled_z.extend((err[sampled] / se[sampled]).tolist())
  out = {"dataset": labels.path, "replacement": replacement, "fields": {}}
  for f, v in per_field.items():
    z, err = np.asarray(v["z"]), np.asarray(v["err"])
    out["fields"][f] = {
      "steps": int(err.size),
      "z_rms": float(np.sqrt(np.mean(z**2))) if z.size else float("nan"),
      "z_over_3": int((np.abs(z) > 3).sum()),
      "coverage_95": float(np.mean(np.abs(z) <= 1.96)) if z.size else float("nan"),
      "mean_abs_error": float(np.mean(np.abs(err))) if err.size else float("nan"),
      "false_zeros": v["false_zeros"],
    }
  z = np.asarray(sampled_z)
  out["fields"]["credit"]["sampled_steps"] = int(z.size)
  out["fields"]["credit"]["z_rms_sampled"] = float(np.sqrt(np.mean(z**2))) if z.size else np.nan
  c = out["fields"]["credit"]
  out["summary"] = {
    "traces": len(labels),
    "steps": c["steps"],
    "z_rms": c["z_rms"],
    "z_over_3": c["z_over_3"],
    "false_zeros": sum(v["false_zeros"] for v in out["fields"].values()),
    "undefined_too_rare": too_rare,
    "undefined_missed": undefined_by_truth_only,
    "completions": int(labels.metadata.get("completions", 0)),
  }
  return out
