"""One pass of a model state over a split: weighted mean losses and per-step predictions."""

from __future__ import annotations

import jax
import numpy as np

from hindsight.model.batching import make_batch
from hindsight.model.sharding import global_batch

# Per-step columns predict_split returns (valid steps with a finite label only).
COLUMNS = (
  "pred", "pred_mu", "pred_var", "label", "stderr", "noise", "progress", "klass", "pred_klass",
)  # fmt: skip


def predict_split(
  programs, state, plan, reader, spec, mesh, rows, with_steps: bool = True
) -> tuple[dict, dict]:
  """(losses, steps): weighted mean losses over the split and, with_steps, its per-step
  columns (COLUMNS, tags, episode ids, `bounded`: the label's stderr is a tie bound, and
  `sampled`: the label carries a sample stderr, the `noise` column; each [N] over valid steps
  with a finite label)."""
  sums, counts = {}, {}
  cols = {k: [] for k in COLUMNS}
  tags, episodes, bounded, sampled = [], [], [], []
  for pad, ids in plan.epoch(0):
    batch = global_batch(make_batch(reader, ids[rows], pad, spec), mesh)
    out, labels, metrics = jax.device_get(programs.eval_step(state, batch))
    for k, v in metrics.items():
      if k in ("label_steps", "steps", "agent_rows"):
        continue
      if k.startswith("agent_"):
        w = metrics["agent_rows"]
      else:
        w = metrics["steps"] if k in ("ce", "accuracy") else metrics["label_steps"]
      sums[k] = sums.get(k, 0.0) + float(v) * float(w)
      counts[k] = counts.get(k, 0.0) + float(w)
    if not with_steps:
      continue
    sel = labels["label_mask"]
    cols["pred"].append(out["credit"][sel])
    cols["pred_mu"].append(out["mu"][sel])
    cols["pred_var"].append(np.exp(out["log_var"][sel]))
    cols["label"].append(labels["credit"][sel])
    cols["stderr"].append(labels["credit_stderr"][sel])
    cols["noise"].append(labels["credit_noise"][sel])
    cols["progress"].append(labels["progress"][sel])
    cols["klass"].append(labels["klass"][sel])
    cols["pred_klass"].append(np.argmax(out["logits"], -1)[sel])
    if "agent_shapley" in out:
      rows_ok = labels["agent_mask"]
      cols.setdefault("agent_pred", []).append(out["agent_shapley"][rows_ok].reshape(-1))
      cols.setdefault("agent_label", []).append(labels["agent_shapley"][rows_ok].reshape(-1))
    for row, i in enumerate(ids):
      if i >= 0:
        ep = reader[int(i)]
        ep_tags = np.asarray(list(ep.tags) + [""] * pad)[:pad]
        tags.append(ep_tags[sel[row]])
        episodes.append(np.full(int(sel[row].sum()), i))
        ep_bounded = np.zeros(pad, bool)
        n = min(len(ep), pad)
        ep_bounded[:n] = ep.credit_bounded[:n]
        bounded.append(ep_bounded[sel[row]])
        ep_sampled = np.zeros(pad, bool)
        if ep.credit_sample_stderr is not None:
          ep_sampled[:n] = np.isfinite(ep.credit_sample_stderr[:n])
        sampled.append(ep_sampled[sel[row]])
  losses = {k: sums[k] / max(counts[k], 1.0) for k in sums}
  if not with_steps:
    return losses, {}
  steps = {k: np.concatenate(v) for k, v in cols.items()}
  steps["tags"] = np.concatenate(tags) if tags else np.zeros(0, str)
  steps["episode"] = np.concatenate(episodes) if episodes else np.zeros(0, np.int64)
  steps["bounded"] = np.concatenate(bounded) if bounded else np.zeros(0, bool)
  steps["sampled"] = np.concatenate(sampled) if sampled else np.zeros(0, bool)
  return losses, steps


class LossEvaluator:
  """Weighted mean losses of a state over one split (what checkpoints are selected by)."""

  def __init__(self, programs, plan, reader, spec, mesh, rows):
    self.args = (plan, reader, spec, mesh, rows)
    self.programs = programs

  def run(self, state) -> dict:
    return predict_split(self.programs, state, *self.args, with_steps=False)[0]
