"""Trains the credit model on a label dataset and evaluates it on held-out episodes.

`train_and_evaluate(config, workdir)`:
  1. labels: `data.labels_dir`, or WORKDIR/labels made by the labeling job `data.label`
     (resumable like `hindsight label`);
  2. split by episode into train / validation / test, length-bucketed batches;
  3. AdamW (warmup + cosine decay, global-norm clipping) on the Gaussian NLL + class CE;
  4. every `train.eval_every` steps: validation loss, a checkpoint (last N kept + the best by
     validation loss), metrics to TensorBoard (WORKDIR/tensorboard);
  5. the spread of the best checkpoint's predictions calibrated on the validation split
     (WORKDIR/calibration.json, `hindsight.model.calibration`), then the test split scored
     by it against its training labels (the `label_fit` evaluator): WORKDIR/report.json
     and a scatter plot. `hindsight eval --checkpoint WORKDIR` then scores it against the
     reference credit.

Fine-tuning (e.g. on the steps `hindsight audit` labeled): `init_from` names a run whose best
checkpoint the model starts from (its parameters and DataSpec; a fresh optimizer and
schedule), and `data.mix_labels_dir` appends the old labels to the new ones.

WORKDIR/splits.json names the label dataset and the episodes of each split (the drift
harness evaluates the test split). Each checkpoint step carries the model config and the
DataSpec (`hindsight.model.predictor`), so `Predictor.load(WORKDIR)` needs nothing else.

Restarted after a kill it resumes from the last good checkpoint and ends with the same
parameters as an uninterrupted run (every batch and key is a function of the step number).
SIGTERM saves a checkpoint and returns early with `report["preempted"] = True`; in a
multi-process run every process stops at the same step (they agree on it each step), even
when the signal reaches only one of them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time

import jax
from ml_collections import ConfigDict

from hindsight import evaluators
from hindsight.data.batching import (
  BatchPlan,
  EpisodeReader,
  bucket_lengths,
  make_batch,
  process_rows,
  split_episodes,
)
from hindsight.data.labels import is_complete, open_training_labels
from hindsight.distributed import CONFIG_NAMES, any_process, check_processes, initialize
from hindsight.errors import HindsightError, make_dir
from hindsight.evaluators.label_fit import summary_text
from hindsight.files import write_json
from hindsight.labeling.engine import LabelConfig
from hindsight.labeling.job import LabelJob, run_label_job
from hindsight.model.calibration import write_calibration
from hindsight.model.checkpoints import Checkpoints
from hindsight.model.credit_model import ModelConfig
from hindsight.model.predictor import MODEL_FILE, Predictor, model_files
from hindsight.model.programs import state_digest, train_programs
from hindsight.model.sharding import devices_for_batch, global_batch, make_mesh
from hindsight.progress import CompileAwareBar

log = logging.getLogger("hindsight.train")
MEMBER_FOLD = 1_000_000  # key(seed) folded with this + m seeds ensemble member m's training
# Config fields that may change between a run and its restart without changing its result.
# (Where the coordinator listens and which process this is change with every launch of a
# multi-process run: they are not part of the run.)
RESTART_FREE = (
  "checkpoint.fallback",
  "train.progress",
  "distributed.coordinator",
  "distributed.process_id",
)


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
      saved = {k: v for k, v in json.load(f).items() if k not in RESTART_FREE}
    current_json = json.loads(json.dumps(current))
    # A field added to the configs after the run was made (absent from its config.json)
    # changes nothing while it holds its off value ("", 0, False: every new field's default).
    added_off = {k for k, v in current_json.items() if k not in saved and v in ("", 0, False)}
    diff = sorted(
      k for k in (set(saved) | set(current_json)) - added_off if saved.get(k) != current_json.get(k)
    )
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
  d = config.distributed
  check_processes(d.coordinator, d.num_processes, d.process_id, CONFIG_NAMES)
  if not 0 <= config.model.dropout < 1:
    raise HindsightError(f"config model.dropout={config.model.dropout} must be in [0, 1)")


def _labels_dir(config: ConfigDict, workdir: str) -> str:
  """The label dataset to train on, made first by the config's labeling job if needed."""
  out = config.data.labels_dir or os.path.join(workdir, "labels")
  lab = config.data.label
  if config.data.labels_dir and is_complete(out):
    return out  # given and finished (e.g. an audit's labels): data.label only makes labels
  if not lab.env:
    if not is_complete(out):
      raise HindsightError(
        f"no label dataset at {out} (set data.labels_dir to the --out of `hindsight label`)"
      )
    return out
  job = LabelJob(
    env=lab.env,
    episodes=lab.episodes,
    config=LabelConfig(num_rollouts=lab.rollouts, replacement=lab.replacement),
    seed=lab.seed,
  )
  run_label_job(job, out, progress=config.train.progress)
  return out


def _init_model(config: ConfigDict, spec) -> Predictor:
  """The model `init_from` names, checked against this run's config and labels."""
  init = Predictor.load(config.init_from, "best")
  want = ModelConfig(**config.model.to_dict())
  have = init.model_config
  for field in ("width", "depth", "num_heads", "mlp_ratio"):
    if getattr(want, field) != getattr(have, field):
      raise HindsightError(
        f"config model.{field}={getattr(want, field)} differs from {getattr(have, field)} of "
        f"init_from {config.init_from} (fine-tune with the config it was trained with)"
      )
  s = init.spec
  fits = (s.obs_kind, s.obs_dim, s.num_agents) == (spec.obs_kind, spec.obs_dim, spec.num_agents)
  if not fits or spec.num_actions > s.num_actions:
    raise HindsightError(
      f"the labels ({spec.obs_kind} observations of {spec.obs_dim}, {spec.num_actions} "
      f"actions) do not fit the model of init_from {config.init_from} ({s.obs_kind}, "
      f"{s.obs_dim}, {s.num_actions} actions)"
    )
  return init


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


def train_and_evaluate(config: ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) training; returns the report also written to WORKDIR/report.json."""
  _validate(config)
  d = config.distributed
  initialize(d.coordinator, d.num_processes, d.process_id)
  _check_workdir(config, workdir)
  labels_dir = _labels_dir(config, workdir)
  mix_dir = config.data.mix_labels_dir
  labels = open_training_labels(labels_dir, mix_dir, int(config.data.mix_episodes))
  reader = EpisodeReader(labels)
  seed = int(config.seed)
  splits = split_episodes(
    len(labels), (config.data.validation_fraction, config.data.test_fraction), seed
  )
  lengths, spec = reader.scan(splits["train"], labels.metadata.get("horizon"))
  init = None
  if config.init_from:
    init = _init_model(config, spec)
    spec = init.spec  # the model's normalisation stays the one it was trained with
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

  # An ensemble member (config.member = m > 0) shares the split (a function of seed alone)
  # and varies the initialisation, dropout and batch order: keys folded from m.
  member = int(config.get("member", 0))
  member_key = jax.random.fold_in(jax.random.key(seed), MEMBER_FOLD + member)
  train_seed = seed if member == 0 else int(jax.random.randint(member_key, (), 0, 2**31 - 1))

  def plan(split, shuffle):
    ids = splits[split]
    return BatchPlan(ids, lengths[ids], batch_size, pads, train_seed, shuffle)

  train_plan, val_plan, test_plan = (
    plan("train", True),
    plan("validation", False),
    plan("test", False),
  )
  programs = train_programs(config, spec, mesh)
  step_files = model_files(ModelConfig(**config.model.to_dict()), spec)
  if jax.process_index() == 0:
    write_json(
      os.path.join(workdir, "splits.json"),
      {
        "labels": os.path.abspath(labels_dir),
        "mix_labels": os.path.abspath(mix_dir) if mix_dir else "",
        "mix_episodes": int(config.data.mix_episodes),
        "init_from": os.path.abspath(config.init_from) if config.init_from else "",
        **{k: v.tolist() for k, v in splits.items()},
      },
    )
  validation = evaluators.get("validation_loss")(programs, val_plan, reader, spec, mesh, rows)

  ckpt = Checkpoints(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep)
  key = jax.random.key(train_seed)
  if ckpt.steps() and not os.path.isfile(os.path.join(ckpt.step_dir(ckpt.steps()[-1]), MODEL_FILE)):
    raise HindsightError(
      f"{ckpt.directory} holds checkpoints of an older hindsight (no {MODEL_FILE}): retrain "
      "in a new --workdir"
    )
  start, state = ckpt.restore(programs.abstract_state, fallback=config.checkpoint.fallback)
  if state is None:
    start, state = 0, programs.init(jax.random.fold_in(key, 0))
    if init is not None:
      state["model"] = jax.tree.map(
        lambda new, old: jax.device_put(old, new.sharding), state["model"], init.state
      )
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
      # Every process must stop at the same step (a checkpoint is a collective save): the
      # SIGTERM may reach one process, or each at another step. One tiny all-gather per step
      # agrees on it.
      stopping = any_process(stop["requested"])
      if done % config.train.eval_every == 0 or done == total or stopping:
        val_losses = validation.run(state)
        curve.write({"step": done, "split": "validation", **val_losses})
        if writer:
          for k, v in val_losses.items():
            writer.add_scalar(f"validation/{k}", v, done)
        ckpt.save(done, state, val_losses["loss"], files=step_files)
      if stopping:
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
  final_digest = state_digest(state)
  eval_step = ckpt.best_step() if config.checkpoint.evaluate == "best" else ckpt.steps()[-1]
  eval_step, state = ckpt.restore(programs.abstract_state, step=eval_step, fallback=False)
  ckpt.close()
  # The predicted spread's post-hoc scale, fitted on the validation split (the Predictor
  # applies it to this step; `hindsight.model.calibration`).
  sigma_scale, calibration_steps = evaluators.get("sigma_scale")(
    programs, val_plan, reader, spec, mesh, rows
  ).run(state)
  if jax.process_index() == 0:
    write_calibration(workdir, eval_step, sigma_scale, calibration_steps)
  fit = evaluators.get("label_fit")(programs, test_plan, reader, spec, mesh, rows)
  report, steps = fit.run(state, sigma_scale)
  report.update(
    labels=os.path.abspath(labels_dir),
    env=labels.metadata.get("env"),
    replacement=labels.metadata.get("replacement"),
    episodes={k: int(v.size) for k, v in splits.items()},
    evaluated_checkpoint=eval_step,
    sigma_scale=sigma_scale,  # fitted on the validation split, applied in this report
    evaluated_by=config.checkpoint.evaluate,  # "best" (validation loss) or "last"
    data_spec=json.loads(spec.to_json()),
  )
  report["train"] = {
    "steps": total,
    "resumed_from": start,
    "seconds": round(train_seconds, 2),
    "final_loss": last.get("loss"),
    "params_sha256": final_digest,
  }
  report["summary"] = summary_text(report)
  if jax.process_index() == 0:
    evaluators.write_label_fit(workdir, report, steps)
  return report
