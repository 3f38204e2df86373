"""Trains the credit model on a label dataset and evaluates it on held-out episodes.

`train_and_evaluate(config, workdir)`:
  1. labels: `data.labels_dir`, or WORKDIR/labels made by the labeling job `data.label`
     (resumable like `hindsight label`);
  2. split by episode into train / validation / test, length-bucketed batches;
  3. AdamW (warmup + cosine decay, global-norm clipping) on the Gaussian NLL + class CE;
  4. every `train.eval_every` steps: validation loss, a checkpoint (last N kept + the best by
     validation loss), metrics to TensorBoard (WORKDIR/tensorboard);
  5. the test split scored by the best checkpoint: WORKDIR/report.json and a scatter plot.

Restarted after a kill it resumes from the last good checkpoint and ends with the same
parameters as an uninterrupted run (every batch and key is a function of the step number).
SIGTERM saves a checkpoint and returns early with `report["preempted"] = True`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import jax
import numpy as np
import optax
from flax import nnx
from ml_collections import ConfigDict
from scipy import stats

from hindsight.credit.estimators import KLASS_NAMES
from hindsight.data.batching import (
  BatchPlan,
  DataSpec,
  EpisodeReader,
  bucket_lengths,
  make_batch,
  process_rows,
  split_episodes,
)
from hindsight.data.labels import is_complete, open_labels
from hindsight.errors import HindsightError, make_dir
from hindsight.labeling.engine import LabelConfig
from hindsight.labeling.job import LabelJob, run_label_job
from hindsight.metrics.credit_fit import correlation, per_tag, prediction_metrics
from hindsight.model.checkpoints import Checkpoints
from hindsight.model.credit_model import CreditModel, ModelConfig
from hindsight.model.loss import credit_loss
from hindsight.model.sharding import (
  devices_for_batch,
  global_batch,
  make_mesh,
  replicated,
  state_shardings,
)
from hindsight.progress import CompileAwareBar

log = logging.getLogger("hindsight.train")
# Config fields that may change between a run and its restart without changing its result.
RESTART_FREE = ("checkpoint.fallback", "train.progress")


def _flatten(cfg: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in cfg.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _check_workdir(config: ConfigDict, workdir: str) -> None:
  """A workdir belongs to one config: refuse to resume a run with a different one."""
  make_dir(workdir, "--workdir")
  current = {k: v for k, v in _flatten(config.to_dict()).items() if k not in RESTART_FREE}
  path = os.path.join(workdir, "config.json")
  if os.path.isfile(path):
    with open(path) as f:
      saved = json.load(f)
    current_json = json.loads(json.dumps(current))
    diff = sorted(k for k in set(saved) | set(current_json) if saved.get(k) != current_json.get(k))
    if diff:
      raise HindsightError(
        f"--workdir {workdir} holds a run of a different config ({', '.join(diff[:3])} differ)"
      )
  elif jax.process_index() == 0:
    with open(path + ".tmp", "w") as f:
      json.dump(current, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def _validate(config: ConfigDict) -> None:
  """One-line errors for config values the program cannot run with."""
  positive = {
    "data.batch_size": config.data.batch_size,
    "data.num_buckets": config.data.num_buckets,
    "train.steps": config.train.steps,
    "train.log_every": config.train.log_every,
    "train.eval_every": config.train.eval_every,
    "checkpoint.keep": config.checkpoint.keep,
    "model.width": config.model.width,
    "model.depth": config.model.depth,
    "model.num_heads": config.model.num_heads,
  }
  for name, value in positive.items():
    if value < 1:
      raise HindsightError(f"config {name}={value} must be >= 1")
  if config.model.width % config.model.num_heads:
    raise HindsightError(
      f"config model.width={config.model.width} is not divisible by "
      f"model.num_heads={config.model.num_heads}"
    )
  if config.checkpoint.evaluate not in ("best", "last"):
    raise HindsightError(
      f"config checkpoint.evaluate={config.checkpoint.evaluate!r}: expected 'best' or 'last'"
    )
  if not 0 <= config.model.dropout < 1:
    raise HindsightError(f"config model.dropout={config.model.dropout} must be in [0, 1)")


def _labels_dir(config: ConfigDict, workdir: str) -> str:
  """The label dataset to train on, made first by the config's labeling job if needed."""
  out = config.data.labels_dir or os.path.join(workdir, "labels")
  lab = config.data.label
  if not lab.env:
    if not is_complete(out):
      raise HindsightError(
        f"no label dataset at {out} (set data.labels_dir to the --out of `hindsight label`)"
      )
    return out
  if jax.process_count() > 1 and not is_complete(out):
    raise HindsightError(f"make the labels at {out} before a multi-process run")
  job = LabelJob(
    env=lab.env,
    episodes=lab.episodes,
    config=LabelConfig(num_rollouts=lab.rollouts, replacement=lab.replacement),
    seed=lab.seed,
  )
  run_label_job(job, out, progress=config.train.progress)
  return out


def _optimizer(config: ConfigDict) -> optax.GradientTransformation:
  o, steps = config.optim, config.train.steps
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=o.learning_rate,
    warmup_steps=min(o.warmup_steps, steps),
    decay_steps=max(steps, 1),
    end_value=o.learning_rate * o.final_lr_ratio,
  )
  return optax.chain(
    optax.clip_by_global_norm(o.clip_norm),
    optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
  )


@dataclasses.dataclass
class _Programs:
  """The model's static half and the jitted programs over its (sharded) state."""

  graphdef: nnx.GraphDef
  abstract_state: nnx.State  # ShapeDtypeStructs carrying their shardings
  init: Callable
  train_step: Callable
  eval_step: Callable


def _programs(config: ConfigDict, spec: DataSpec, mesh) -> _Programs:
  model_cfg = ModelConfig(**config.model.to_dict())
  tx = _optimizer(config)
  class_weight = float(config.loss.class_weight)
  beta, zero_weight = float(config.loss.beta), float(config.loss.zero_weight)
  agent_weight = float(config.loss.agent_weight)

  def build(key):
    model = CreditModel(model_cfg, spec, rngs=nnx.Rngs(params=key))
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)

  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build(jax.random.key(0))))
  shardings = state_shardings(abstract, mesh, config.mesh.min_fsdp_size)
  abstract = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )
  metrics_sharding = replicated(mesh)

  @functools.partial(jax.jit, out_shardings=shardings)
  def init(key):
    return nnx.state(build(key))

  @functools.partial(jax.jit, donate_argnums=0, out_shardings=(shardings, metrics_sharding))
  def train_step(state, batch, key):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
      out = model(batch, dropout_key=key if model_cfg.dropout > 0 else None)
      return credit_loss(
        out, batch, model.value_scale[...], class_weight, beta, zero_weight, agent_weight
      )

    (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    metrics["grad_norm"] = optax.tree.norm(grads)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), metrics

  @functools.partial(jax.jit, out_shardings=metrics_sharding)
  def eval_step(state, batch):
    model, _ = nnx.merge(graphdef, state)
    out = model(batch)
    _, metrics = credit_loss(
      out, batch, model.value_scale[...], class_weight, beta, zero_weight, agent_weight
    )
    keep = ("credit", "credit_stderr", "progress", "klass", "label_mask", "agent_shapley")
    keep += ("agent_mask",)
    return out, {k: batch[k] for k in keep if k in batch}, metrics

  return _Programs(graphdef, abstract, init, train_step, eval_step)


def _evaluate(
  programs, state, plan, reader, spec, mesh, rows, with_steps: bool = True
) -> tuple[dict, dict]:
  """Weighted mean losses over a split, and (with_steps) its per-step predictions on valid
  labels; validation during training needs the losses only."""
  sums, counts = {}, {}
  names = ("pred", "pred_mean", "pred_var", "label", "stderr", "progress", "klass", "pred_klass")
  cols = {k: [] for k in names}
  tags = []
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
    cols["pred_mean"].append(out["mean"][sel])
    cols["pred_var"].append(np.exp(out["log_var"][sel]))
    cols["label"].append(labels["credit"][sel])
    cols["stderr"].append(labels["credit_stderr"][sel])
    cols["progress"].append(labels["progress"][sel])
    cols["klass"].append(labels["klass"][sel])
    cols["pred_klass"].append(np.argmax(out["logits"], -1)[sel])
    if "agent_shapley" in out:
      rows_ok = labels["agent_mask"]
      cols.setdefault("agent_pred", []).append(out["agent_shapley"][rows_ok].reshape(-1))
      cols.setdefault("agent_label", []).append(labels["agent_shapley"][rows_ok].reshape(-1))
    for row, i in enumerate(ids):
      if i >= 0:
        ep_tags = np.asarray(reader[int(i)]["tags"] + [""] * pad)[:pad]
        tags.append(ep_tags[sel[row]])
  losses = {k: sums[k] / max(counts[k], 1.0) for k in sums}
  if not with_steps:
    return losses, {}
  steps = {k: np.concatenate(v) for k, v in cols.items()}
  steps["tags"] = np.concatenate(tags) if tags else np.zeros(0, str)
  return losses, steps


class _MetricsLog:
  """WORKDIR/metrics.jsonl, one JSON line per logged step (process 0 writes). A resumed run
  first drops the lines of steps after its checkpoint, so the file reads as one clean run."""

  def __init__(self, path: str, start: int):
    self.path = path
    self.active = jax.process_index() == 0
    if not self.active:
      return
    kept = []
    if os.path.isfile(path):
      with open(path) as f:
        for line in f:
          try:
            if json.loads(line)["step"] <= start:
              kept.append(line)
          except (ValueError, KeyError):
            break  # a line cut short by a kill
    with open(path + ".tmp", "w") as f:
      f.writelines(kept)
    os.replace(path + ".tmp", path)

  def write(self, record: dict) -> None:
    if self.active:
      with open(self.path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def read_metrics(workdir: str, split: str = "train") -> list[dict]:
  """The records of WORKDIR/metrics.jsonl for one split, in step order."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if r["split"] == split]


def params_digest(state) -> str:
  """SHA-256 of every array of the state, in tree order: equal digests = bitwise equal."""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(state):
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      leaf = multihost_utils.process_allgather(leaf, tiled=True)
    h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return h.hexdigest()


def _maybe_initialize_distributed(config: ConfigDict) -> None:
  d = config.distributed
  if d.coordinator and not jax.distributed.is_initialized():
    # CPU processes talk through gloo; accelerators bring their own collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(d.coordinator, d.num_processes, d.process_id)


def train_and_evaluate(config: ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) training; returns the report also written to WORKDIR/report.json."""
  _validate(config)
  _maybe_initialize_distributed(config)
  _check_workdir(config, workdir)
  labels_dir = _labels_dir(config, workdir)
  labels = open_labels(labels_dir)
  reader = EpisodeReader(labels)
  seed = int(config.seed)
  splits = split_episodes(
    len(labels), (config.data.validation_fraction, config.data.test_fraction), seed
  )
  lengths, spec = reader.scan(splits["train"], labels.metadata.get("horizon"))
  pads = bucket_lengths(lengths, config.data.num_buckets)
  batch_size = int(config.data.batch_size)
  devices = jax.devices()
  if config.mesh.devices == -1:
    devices = devices_for_batch(batch_size, devices)
  else:
    if not 1 <= config.mesh.devices <= len(devices):
      raise HindsightError(f"mesh.devices={config.mesh.devices}: there are {len(devices)} devices")
    devices = devices[: config.mesh.devices]
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, devices)
  if batch_size % mesh.size:
    raise HindsightError(
      f"data.batch_size={batch_size} is not a multiple of the {mesh.size} devices"
    )
  rows = process_rows(batch_size, jax.process_index(), jax.process_count())

  def plan(split, shuffle):
    ids = splits[split]
    return BatchPlan(ids, lengths[ids], batch_size, pads, seed, shuffle)

  train_plan, val_plan, test_plan = (
    plan("train", True),
    plan("validation", False),
    plan("test", False),
  )
  programs = _programs(config, spec, mesh)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "data_spec.json"), "w") as f:
      f.write(spec.to_json())

  ckpt = Checkpoints(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep)
  key = jax.random.key(seed)
  start, state = ckpt.restore(programs.abstract_state, fallback=config.checkpoint.fallback)
  if state is None:
    start, state = 0, programs.init(jax.random.fold_in(key, 0))
  dropout_root = jax.random.fold_in(key, 1)

  writer = None
  if jax.process_index() == 0:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(os.path.join(workdir, "tensorboard"))
  curve = _MetricsLog(os.path.join(workdir, "metrics.jsonl"), start)
  stop = {"requested": False}

  def on_sigterm(signum, frame):
    del signum, frame
    stop["requested"] = True

  # Signal handlers can only be set from the main thread; elsewhere SIGTERM keeps its default.
  in_main = threading.current_thread() is threading.main_thread()
  previous_handler = signal.signal(signal.SIGTERM, on_sigterm) if in_main else None
  total, spe = int(config.train.steps), train_plan.steps_per_epoch
  preempted, train_seconds, last = False, 0.0, {}
  bar = CompileAwareBar(
    total=total,
    initial=start,
    desc="train",
    unit="step",
    disable=not config.train.progress or jax.process_index() != 0,
  )
  try:
    epoch_batches, epoch_index = None, -1
    for step in range(start, total):
      epoch, i = divmod(step, spe)
      if epoch != epoch_index:
        epoch_batches, epoch_index = train_plan.epoch(epoch), epoch
      pad, ids = epoch_batches[i]
      tic = time.perf_counter()
      batch = global_batch(make_batch(reader, ids[rows], pad, spec), mesh)
      state, metrics = programs.train_step(state, batch, jax.random.fold_in(dropout_root, step))
      done = step + 1
      bar.update(1)
      if done % config.train.log_every == 0 or done == total:
        last = {k: float(v) for k, v in jax.device_get(metrics).items()}
        bar.set_postfix(loss=f"{last['loss']:.3f}", mae=f"{last['mae']:.3g}")
        curve.write({"step": done, "split": "train", **last})
        if writer:
          for k, v in last.items():
            writer.add_scalar(f"train/{k}", v, done)
      train_seconds += time.perf_counter() - tic
      if done % config.train.eval_every == 0 or done == total or stop["requested"]:
        val_losses, _ = _evaluate(
          programs, state, val_plan, reader, spec, mesh, rows, with_steps=False
        )
        curve.write({"step": done, "split": "validation", **val_losses})
        if writer:
          for k, v in val_losses.items():
            writer.add_scalar(f"validation/{k}", v, done)
        ckpt.save(done, state, val_losses["loss"])
      if stop["requested"]:
        preempted = True
        log.warning("SIGTERM: saved the checkpoint of step %d; exiting", done)
        break
  finally:
    bar.close()
    if in_main:
      signal.signal(signal.SIGTERM, previous_handler)
    if writer:
      writer.close()

  if preempted:
    ckpt.close()
    return {"preempted": True, "step": done}
  final_digest = params_digest(state)
  eval_step = ckpt.best_step() if config.checkpoint.evaluate == "best" else ckpt.steps()[-1]
  eval_step, state = ckpt.restore(programs.abstract_state, step=eval_step, fallback=False)
  ckpt.close()
  report = _report(
    labels_dir, spec, splits, programs, state, eval_step, test_plan, reader, mesh, rows
  )
  report["evaluated_by"] = config.checkpoint.evaluate  # "best" (validation loss) or "last"
  report["train"] = {
    "steps": total,
    "resumed_from": start,
    "seconds": round(train_seconds, 2),
    "final_loss": last.get("loss"),
    "params_sha256": final_digest,
  }
  if jax.process_index() == 0:
    _write_report(workdir, report)
  return report


def _report(labels_dir, spec, splits, programs, state, step, test_plan, reader, mesh, rows):
  out = {
    "labels": os.path.abspath(labels_dir),
    "env": reader.labels.metadata.get("env"),
    "replacement": reader.labels.metadata.get("replacement"),
    "episodes": {k: int(v.size) for k, v in splits.items()},
    "evaluated_checkpoint": step,
    "data_spec": json.loads(spec.to_json()),
  }
  losses, steps = _evaluate(programs, state, test_plan, reader, spec, mesh, rows)
  fit = prediction_metrics(
    steps["pred"],
    steps["pred_mean"],
    steps["pred_var"],
    steps["label"],
    steps["stderr"],
    steps["progress"],
  )
  out.update(fit)
  out["test_loss"] = losses
  out["class_accuracy"] = float(np.mean(steps["pred_klass"] == steps["klass"]))
  out["per_tag"] = per_tag(steps["tags"], steps["pred"], steps["label"])
  if "agent_pred" in steps:
    pred, label = steps["agent_pred"], steps["agent_label"]
    out["agent"] = {
      "pairs": int(label.size),  # (episode, agent) pairs of the test split
      "spearman": correlation(stats.spearmanr, pred, label),
      "pearson": correlation(stats.pearsonr, pred, label),
      "mae": float(np.mean(np.abs(pred - label))),
      "constant_mae": float(np.mean(np.abs(label - np.median(label)))),
    }
  out["summary"] = _summary(out)
  out["_steps"] = steps
  return out


def _summary(r: dict) -> str:
  lines = [
    f"credit model on {r['env']} ({r['replacement']} labels), "
    f"{r['episodes']['test']} held-out episodes, {r['steps']} steps:",
    f"  Spearman {r['spearman']:.3f}  Pearson {r['pearson']:.3f}  MAE {r['mae']:.4g} "
    f"(best constant: {r['constant_mae']:.4g})  "
    f"(of the continuous mean: Spearman {r['spearman_mean']:.3f})",
    f"  labels: reliability {r['label_reliability']:.3f}, exactly 0 {r['exact_zero_share']:.1%}; "
    f"progress scores P(success | history) reach Spearman {r['progress_spearman']:.3f}",
    f"  calibration: z_rms {r['z_rms']:.2f}, 95% coverage {r['coverage_95']:.2f}; "
    f"class accuracy {r['class_accuracy']:.3f} over {', '.join(KLASS_NAMES)}",
  ]
  if np.isnan(r["spearman"]):
    lines.append(
      "  (Spearman nan: the predictions are constant, so they rank nothing; a model trained "
      "for very few steps, like a :smoke config, can end there)"
    )
  if "agent" in r:
    a = r["agent"]
    lines.append(
      f"  agent-level Shapley values ({a['pairs']} episode x agent pairs): Spearman "
      f"{a['spearman']:.3f}  Pearson {a['pearson']:.3f}  MAE {a['mae']:.4g}"
    )
  lines += [
    "  per tag (labeled -> predicted mean credit):",
  ]
  for tag, row in r["per_tag"].items():
    lines.append(
      f"    {tag:<18} {row['steps']:>6} steps  {row['label']:+.3f} -> {row['predicted']:+.3f}"
    )
  return "\n".join(lines)


def _json_safe(x):
  """NaN (a correlation of a constant prediction) becomes null: report.json stays JSON."""
  if isinstance(x, dict):
    return {k: _json_safe(v) for k, v in x.items()}
  if isinstance(x, list | tuple):
    return [_json_safe(v) for v in x]
  if isinstance(x, float | np.floating):
    return float(x) if np.isfinite(x) else None
  return x


def _write_report(workdir: str, report: dict) -> None:
  steps = report.pop("_steps")
  path = os.path.join(workdir, "report.json")
  with open(path + ".tmp", "w") as f:
    json.dump(_json_safe(report), f, indent=1, sort_keys=True, allow_nan=False)
  os.replace(path + ".tmp", path)
  _scatter(os.path.join(workdir, "test_scatter.png"), steps, report)


def _scatter(path: str, steps: dict, report: dict) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5, 5))
  ax.scatter(steps["label"], steps["pred"], s=4, alpha=0.3)
  lo = float(min(steps["label"].min(), steps["pred"].min()))
  hi = float(max(steps["label"].max(), steps["pred"].max()))
  ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
  ax.set_xlabel("labeled credit (rollouts)")
  ax.set_ylabel("predicted credit (one forward pass)")
  ax.set_title(f"{report['env']}: Spearman {report['spearman']:.3f}, MAE {report['mae']:.3g}")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
