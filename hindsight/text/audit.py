"""`hindsight audit` on a text model: the audited steps resampled through a completions endpoint.

The pool is a file of traces in the JSONL format of docs/text.md (`--trajectories FILE`) or a
text label dataset (`--trajectories DIR`; the verifier's references are read back from the
trace file it was labeled from). A drawn step t of a T-step trace is labeled as the text
labeler labels it under `policy` (`text.estimate`): K continuations of x_{t+1} (the keep arm;
the trace's own outcome when t = T - 1) and K of x_t (the replace arm), with the labels' own
model name and sampling (their metadata) and seeds drawn from the draw's key. The budget is
in completions: a draw costs 2K (K for a last step), the cost bound the audit checks before
each draw. Everything else (design, alarm, report) is the functional audit's
(`audit.runner`); the audited steps are not written as a label dataset for text.
"""

from __future__ import annotations

import os
import types
from typing import NamedTuple

import jax
import numpy as np

from hindsight.credit.estimators import classify, z_value
from hindsight.data.labels import as_text
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.text.options import TextOptions


class TextTraj(NamedTuple):
  """The pool as the audit indexes it: trace ids [E] and the valid steps [E, H]."""

  index: np.ndarray
  mask: np.ndarray


def _traces_from_dataset(path: str, limit: int):
  """The traces of a text label dataset (its step texts; references from its trace file)."""
  from hindsight.data import open_labels
  from hindsight.text.evaluate import trace_file
  from hindsight.text.trace import TextStep, TextTrace, read_traces

  labels = open_labels(path)
  recorded = labels.metadata.env.removeprefix("text:")
  source = trace_file(recorded, path)
  references = {}
  if source is not None:
    references = {t.id: t.reference for t in read_traces(source)}
  elif labels.metadata.text_options.get("verifier", "boxed") != "env":
    # Without the file every reference would be missing and every outcome 0, silently.
    raise HindsightError(
      f"{path}: its trace file {recorded} is not found (where it was recorded, or under a "
      "directory above the labels): the audit's verifier reads each trace's reference from "
      "it; run from the directory the labels were made in"
    )
  out = []
  for i, e in enumerate(labels):
    if limit and i >= limit:
      break
    trace_id = as_text(e["trace_id"])
    out.append(TextTrace(prompt=as_text(e["prompt"]), id=trace_id,
                         steps=[TextStep(text=as_text(s)) for s in e["step_text"]],
                         reference=references.get(trace_id),
                         outcome=float(e["return"])))  # fmt: skip
  return out


class TextAuditLabeler:
  """The audit's labeler for text traces (module docstring): the surface `audit.runner`
  uses (config, env.horizon, step_info, label_steps, cost_bound) over a `TextLabeler`."""

  cost_unit = "completions"

  def __init__(self, traces_path: str, count: int, config: LabelConfig, options: TextOptions,
               seed: int, cache: str):  # fmt: skip
    from hindsight.text.labeler import TextLabeler

    if config.replacement != "policy":
      raise HindsightError(
        f"the text audit resamples under `policy`; the model's labels are `{config.replacement}`"
      )
    self.inner = TextLabeler(f"text:{traces_path}", count, config, options)
    self.inner.open(cache)
    self.traces = self.inner.with_steps(self.inner.traces, range(count), seed)
    for t in self.traces:
      if t.outcome is None and t.reference is None:
        raise HindsightError(f"trace {t.id}: no reference for the verifier and no outcome")
    self.outcome = np.array([
      t.outcome if t.outcome is not None else self.inner.verify(t.completion(), t)
      for t in self.traces
    ])  # fmt: skip
    self.config = config
    H = max(len(t.steps) for t in self.traces)
    self.env = types.SimpleNamespace(name="text", horizon=H)
    lengths = np.array([len(t.steps) for t in self.traces])
    self.traj = TextTraj(np.arange(len(self.traces)), np.arange(H)[None] < lengths[:, None])

  def step_info(self, traj: TextTraj):
    """(undefined [E, H]: never under `policy`, the return range [E, H, 2]: outcomes in
    [0, 1])."""
    E, H = traj.mask.shape
    bounds = np.broadcast_to(np.array([0.0, 1.0]), (E, H, 2))
    return np.zeros((E, H), bool), bounds

  def cost_bound(self, steps: dict) -> np.ndarray:
    """Completions a draw may cost: 2K (the keep and replace arms)."""
    return np.full(steps["t"].shape, 2 * self.config.num_rollouts, np.int64)

  def label_steps(self, traj: TextTraj, ts: np.ndarray, keys) -> dict:
    """Labels of steps ts[j] of traces traj.index[j], each resampled with seeds from keys[j]."""
    from hindsight.text.estimate import difference, row_stats
    from hindsight.text.labeler import Ask, step_name

    K, cfg = self.config.num_rollouts, self.config
    seeds = np.asarray(jax.vmap(lambda k: jax.random.randint(k, (2,), 0, 2**31 - 1))(keys))
    requests, where = [], []
    for j, (i, t) in enumerate(zip(np.asarray(traj.index), np.asarray(ts), strict=True)):
      trace = self.traces[int(i)]
      requests.append(Ask(trace.prefix(int(t)), int(seeds[j, 0]), 0, K,
                          step_name(trace, int(i), int(t))))  # fmt: skip
      where.append((j, "replace", int(i), int(t)))
      if t < len(trace.steps) - 1:
        requests.append(Ask(trace.prefix(int(t) + 1), int(seeds[j, 1]), 0, K,
                            step_name(trace, int(i), int(t) + 1)))  # fmt: skip
        where.append((j, "keep", int(i), int(t) + 1))
    got = self.inner.sample(requests)
    n = len(ts)
    keep = [None] * n
    replace = [None] * n
    for (j, arm, i, prefix), completions in zip(where, got, strict=True):
      outcomes = self.inner.outcomes_of(self.traces[i], prefix, completions)
      (keep if arm == "keep" else replace)[j] = outcomes
    credit, se, bounded, cost = np.zeros(n), np.zeros(n), np.zeros(n, bool), np.zeros(n, np.int64)
    for j in range(n):
      i = int(np.asarray(traj.index)[j])
      if keep[j] is None:  # the last step: the trace's own outcome, exact
        k_stats = (np.array([self.outcome[i]]), np.zeros(1), np.zeros(1, bool))
      else:
        k_stats = row_stats([keep[j]], cfg.confidence)
      c, s, b = difference(k_stats, row_stats([replace[j]], cfg.confidence))
      credit[j], se[j], bounded[j] = c[0], s[0], b[0]
      cost[j] = K * (1 + (keep[j] is not None))
    klass = np.asarray(classify(credit, se, cfg.decorative_tolerance, z_value(cfg.confidence)))
    return {"credit": credit, "credit_stderr": se, "credit_bounded": bounded, "klass": klass,
            "rollout_steps": cost}  # fmt: skip


def prepare_text_audit(cfg, predictor, meta, out: str):
  """(label config, env spec, labeler, pool) of an audit of a text model (`audit.runner`),
  from its labels' metadata `meta` (`LabelMetadata`)."""
  from hindsight.audit.pool import Pool
  from hindsight.data.episode import Episode
  from hindsight.text.trace import read_traces, write_traces

  if cfg.trajectories is None:
    raise HindsightError("a text model is audited on --trajectories FILE.jsonl or a text dataset")
  if not cfg.endpoint:
    raise HindsightError("a text audit needs --endpoint URL (the model's completions server)")
  if meta.job_description.get("text", {}).get("tools"):
    raise HindsightError(
      "the audit does not resample agent traces (its labels ran tools): audit the run with "
      "`hindsight eval --reference resample`, which relabels them with their environment"
    )
  if os.path.isdir(cfg.trajectories):
    traces = _traces_from_dataset(cfg.trajectories, cfg.episodes)
  else:
    traces = read_traces(cfg.trajectories, limit=cfg.episodes or None)
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, "traces.jsonl")
  write_traces(path, traces)
  job = meta.job_description
  options = dict(job["text"])
  options["stop"] = tuple(options.get("stop", ()))
  label_cfg = LabelConfig.from_metadata(meta, num_rollouts=cfg.rollouts)
  labeler = TextAuditLabeler(path, len(traces), label_cfg,
                             TextOptions(endpoint=cfg.endpoint, **options), cfg.seed,
                             os.path.join(out, "completions.sqlite"))  # fmt: skip
  episodes = []
  for i, t in enumerate(labeler.traces):
    trace = {"steps": [s.text for s in t.steps], "outcome": float(labeler.outcome[i])}
    episodes.append(Episode.parse(trace, predictor.spec, f"trace {t.id or i}"))
  source = {"kind": "text traces", "path": os.path.abspath(cfg.trajectories),
            "episodes": len(traces)}  # fmt: skip
  pool = Pool(traj=labeler.traj, episodes=episodes, source=source)
  return label_cfg, meta.env or "text", labeler, pool
