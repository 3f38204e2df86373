"""Text labels against the text or tool world's exact credit (`hindsight text-world exact DIR`).

Each trace of a dataset labeled against the world is parsed back to the world's actions
(its prompt and `step_text`), `world.exact_credit` gives the truth, and every estimate is
scored by z = (estimate - truth) / stderr. Honest stderrs give z of RMS about 1 and |z| > 3
rarely; a stderr of 0 is an error wherever the estimate differs from the truth ("false exact
zeros").
"""

from __future__ import annotations

import numpy as np

from hindsight.data.labels import as_text
from hindsight.errors import HindsightError

FIELDS = ("credit", "credit_realized", "progress", "phi")


def exact_labels(example: dict, replacement: str) -> dict[str, np.ndarray]:
  """The world's exact labels of one dataset example ([T] each): the text world's, or the
  tool world's where the prompt is one of its tasks."""
  from hindsight.worlds import tool_world, world

  prompt = as_text(example["prompt"])
  if tool_world.parse_task(prompt) is not None:
    steps = [as_text(s) for s in example["step_text"]]
    return tool_world.exact_labels(prompt, steps, replacement)
  problem = world.parse_problem(prompt)
  if problem is None:
    raise HindsightError("not a text-world or tool-world dataset: a prompt lacks its header")
  actions = [world.parse_action(problem, as_text(s)) for s in example["step_text"]]
  return world.exact_credit(problem, actions, replacement)


def bundled_world(examples) -> tuple[str, str] | None:
  """(the bundled world every example's prompt is a problem of, "text world" or "tool
  world"; its model's name), else None: what `hindsight eval`'s exact reference reads
  (`text.evaluate`)."""
  from hindsight.worlds import tool_world, world

  prompts = [as_text(e["prompt"]) for e in examples]
  if all(world.parse_problem(p) is not None for p in prompts):
    return "text world", world.MODEL_NAME
  if all(tool_world.parse_task(p) is not None for p in prompts):
    return "tool world", tool_world.MODEL_NAME
  return None


def exact_reference(examples, replacement: str) -> tuple[list[dict], list[np.ndarray]]:
  """(the world's exact labels of each trace, [T] fields each; the Bayes observer's credit
  [T] per trace): the text world's, or the tool world's (`tool_world.observer`)."""
  from hindsight.worlds import tool_world, world

  truth, observer = [], []
  for e in examples:
    truth.append(exact_labels(e, replacement))
    prompt, steps = as_text(e["prompt"]), [as_text(s) for s in e["step_text"]]
    task = tool_world.parse_task(prompt)
    if task is not None:
      actions = tool_world.parse_steps(task, steps).actions
      observer.append(tool_world.observer(task, actions, replacement)[0])
      continue
    problem = world.parse_problem(prompt)
    actions = [world.parse_action(problem, s) for s in steps]
    observer.append(world.observer_credit(problem, actions, replacement))
  return truth, observer


def compare_to_exact(path: str) -> dict:
  """z-scores of every labeled step of the dataset at `path` against the world's DP."""
  from hindsight.credit.estimators import DECORATIVE, HARMFUL, LOAD_BEARING, UNDETERMINED
  from hindsight.data import open_labels

  labels = open_labels(path)
  replacement = labels.metadata.replacement
  per_field = {f: {"z": [], "err": [], "false_zeros": 0} for f in FIELDS}
  # Credit's z over the steps whose stderr is a sample stderr, not the tie bound (which is
  # conservative by design): honest stderrs give an RMS near 1 there.
  sampled_z = []
  # klass against the truth: a decided step (load_bearing, harmful, decorative) whose exact
  # credit contradicts its class. With honest intervals at level `confidence` that happens
  # to at most 1 - confidence of them.
  tolerance = labels.metadata.decorative_tolerance
  decided = contradicted = 0
  # phi_hard, an indicator, against its expectation: 1 - (1 - Q_t(x_t, a_t))^K for the K
  # continuations after step t < T - 1 (Q = progress + phi of the truth), summed over steps
  # (z of the sum, variance sum h (1 - h)); at t = T - 1 it is the trace's own outcome.
  K = labels.metadata.rollouts
  hard_obs = hard_exp = hard_var = 0.0
  hard_steps = hard_last_errors = 0
  # Undefined by the estimate alone: the truth exists, but --max-draws x K draws found
  # fewer than 2 that avoid the step's content (content the policy nearly always writes).
  too_rare = undefined_by_truth_only = 0
  for example in labels:
    truth = exact_labels(example, replacement)
    undefined = np.asarray(example["undefined"], bool)
    too_rare += int((undefined & ~truth["undefined"]).sum())
    undefined_by_truth_only += int((~undefined & truth["undefined"]).sum())
    ok = ~undefined & ~truth["undefined"]
    hard = np.asarray(example["phi_hard"], np.float64)
    q_taken = truth["progress"] + truth["phi"]
    h = 1.0 - (1.0 - np.clip(q_taken[:-1], 0.0, 1.0)) ** K
    hard_obs, hard_exp = hard_obs + hard[:-1].sum(), hard_exp + h.sum()
    hard_var, hard_steps = hard_var + (h * (1.0 - h)).sum(), hard_steps + h.size
    hard_last_errors += int(hard[-1] != float(bool(example["success"])))
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
        klass = np.asarray(example["klass"])[ok]
        wrong = np.select(
          [klass == LOAD_BEARING, klass == HARMFUL, klass == DECORATIVE],
          [true <= tolerance, true >= -tolerance, np.abs(true) > tolerance],
          False,
        )
        decided += int((klass != UNDETERMINED).sum())
        contradicted += int(wrong.sum())
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
  out["fields"]["credit"]["klass_decided"] = decided
  out["fields"]["credit"]["klass_contradicted"] = contradicted
  out["fields"]["phi_hard"] = {
    "steps": hard_steps,
    "observed": float(hard_obs),
    "expected": float(hard_exp),
    "z": float((hard_obs - hard_exp) / np.sqrt(hard_var)) if hard_var > 0 else 0.0,
    "last_step_errors": hard_last_errors,
  }
  c = out["fields"]["credit"]
  out["summary"] = {
    "traces": len(labels),
    "steps": c["steps"],
    "z_rms": c["z_rms"],
    "z_over_3": c["z_over_3"],
    "false_zeros": sum(out["fields"][f]["false_zeros"] for f in FIELDS),
    "undefined_too_rare": too_rare,
    "undefined_missed": undefined_by_truth_only,
    "completions": labels.metadata.completions or 0,
  }
  if labels.metadata.tool_calls is not None:
    out["summary"]["tool_calls"] = labels.metadata.tool_calls
  return out


def exact_summary_text(report: dict) -> str:
  """`compare_to_exact`'s summary in one console line."""
  s = report["summary"]
  return (
    f"{s['steps']} steps of {s['traces']} traces: z RMS {s['z_rms']:.3f}, |z| > 3 on "
    f"{s['z_over_3']}, exact zeros where the truth is not 0: {s['false_zeros']}"
  )
