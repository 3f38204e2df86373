"""Trains the credit model on a label dataset and evaluates it on held-out episodes.

`train_and_evaluate(config, workdir)`:
  1. labels: `data.labels_dir`, or WORKDIR/labels made by the labeling job `data.label`
     (resumable like `hindsight label`);
  2. split by episode into train / validation / test, length-bucketed batches;
  3. AdamW (warmup + cosine decay, global-norm clipping) on the Gaussian NLL + class CE;
  4. every `train.eval_every` steps: validation loss, a checkpoint (last N kept + the best by
     validation loss), metrics to TensorBoard (WORKDIR/tensorboard);
  5. the spread of the evaluated checkpoint's predictions (the last, or with
     checkpoint.evaluate=best the lowest validation loss) calibrated on the validation split
     (calibration.json in its step directory, `hindsight.model.calibration`), then the
     test split scored by it against its training labels (the `label_fit` evaluator):
     WORKDIR/report.json and a scatter plot. `hindsight eval --checkpoint WORKDIR` then
     scores it against the reference credit.

Fine-tuning (e.g. on the steps `hindsight audit` labeled): `init_from` names a run whose model
(the step its report scored) this one starts from (its parameters and DataSpec; a fresh
optimizer and schedule), and `data.mix_labels_dir` appends the old labels to the new ones.

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

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time

import jax
import numpy as np
from ml_collections import ConfigDict

from hindsight import evaluators
from hindsight.config_io import check_workdir
from hindsight.data.labels import (
  CHECKSUMS,
  dataset_dir,
  is_complete,
  job_dir,
  open_training_labels,
)
from hindsight.distributed import CONFIG_NAMES, any_process, check_processes, initialize
from hindsight.errors import HindsightError, note
from hindsight.evaluators.label_fit import summary_text
from hindsight.files import finished_report, mark_finished, sha256_file, write_json
from hindsight.labeling.config import LabelConfig, LabelJob
from hindsight.labeling.job import run_label_job
from hindsight.metrics.drift import MIN_EPISODES as MIN_TEST_EPISODES
from hindsight.model.batching import (
  BatchPlan,
  EpisodeReader,
  batch_shape,
  bucket_lengths,
  make_batch,
  process_rows,
  split_episodes,
)
from hindsight.model.calibration import CALIBRATION_FILE, calibration_text
from hindsight.model.checkpoints import Checkpoints, verify_manifest
from hindsight.model.credit_model import ModelConfig
from hindsight.model.predictor import MODEL_FILE, Predictor, model_files
from hindsight.model.programs import ProgramsConfig, state_digest, train_programs
from hindsight.model.sharding import batch_devices, devices_for_batch, global_batch, make_mesh
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
  if int(config.train.get("patience", 0)) < 0:
    raise HindsightError(f"config train.patience={config.train.patience} must be >= 0 (0: off)")
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
  job = LabelJob(env=lab.env, episodes=lab.episodes, config=LabelConfig.from_config(lab),
                 seed=lab.seed)  # fmt: skip
  run_label_job(job, out, progress=config.train.progress)
  return out


def _init_model(config: ConfigDict, spec) -> Predictor:
  """The model `init_from` names, checked against this run's config and labels."""
  init = Predictor.load(config.init_from)  # the step that run scored (`checkpoint.evaluate`)
  want = ModelConfig(**config.model.to_dict())
  have = init.model_config
  for field in ("width", "depth", "num_heads", "mlp_ratio"):
    if getattr(want, field) != getattr(have, field):
      raise HindsightError(
        f"config model.{field}={getattr(want, field)} differs from {getattr(have, field)} of "
        f"init_from {config.init_from} (fine-tune with the config it was trained with)"
      )
  s = init.spec
  fits = (s.encoder.signature, s.num_agents) == (spec.encoder.signature, spec.num_agents)
  if not fits or spec.num_actions > s.num_actions:
    raise HindsightError(
      f"the labels ({spec.encoder.describe()}, {spec.num_actions} actions) do not fit the "
      f"model of init_from {config.init_from} ({s.encoder.describe()}, {s.num_actions} "
      "actions)"
    )
  return init


class _Logs:
  """WORKDIR/metrics.jsonl (one JSON line per logged step) and TensorBoard
  (WORKDIR/tensorboard), written by process 0. A resumed run first drops the lines of steps
  after its checkpoint, so the file reads as one clean run."""

  def __init__(self, workdir: str, start: int):
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.active = jax.process_index() == 0
    self.writer = None
    if not self.active:
      return
    kept = []
    if os.path.isfile(self.path):
      with open(self.path) as f:
        for line in f:
          try:
            if json.loads(line)["step"] <= start:
              kept.append(line)
          except (ValueError, KeyError):
            break  # a line cut short by a kill
    with open(self.path + ".tmp", "w") as f:
      f.writelines(kept)
    os.replace(self.path + ".tmp", self.path)
    from tensorboardX import SummaryWriter

    self.writer = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, split: str, step: int, metrics: dict) -> None:
    if not self.active:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, "split": split, **metrics}, sort_keys=True) + "\n")
    for k, v in metrics.items():
      self.writer.add_scalar(f"{split}/{k}", v, step)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    if self.writer:
      self.writer.close()


def read_metrics(workdir: str, split: str = "train") -> list[dict]:
  """The records of WORKDIR/metrics.jsonl for one split, in step order."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records if r["split"] == split]


@dataclasses.dataclass
class _Data:
  """The run's labels, split by episode, and what the model must know about them."""

  labels_dir: str
  labels: object  # Labels or MixedLabels
  reader: EpisodeReader
  splits: dict  # {split: int64 [n] episode ids}
  lengths: np.ndarray  # int [N] episode lengths
  spec: object  # DataSpec (the init model's when fine-tuning)
  init: Predictor | None  # the model `init_from` names


@dataclasses.dataclass
class _Layout:
  """Where the computation runs and in which batches."""

  mesh: jax.sharding.Mesh
  rows: slice  # this process's rows of every global batch
  train_seed: int  # the batch order's and initialisation's seed (per ensemble member)
  plans: dict  # {split: BatchPlan}


def train_and_evaluate(config: ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) training; returns the report also written to WORKDIR/report.json."""
  _validate(config)
  d = config.distributed
  initialize(d.coordinator, d.num_processes, d.process_id)
  check_workdir(config, workdir, RESTART_FREE)
  # Wall seconds of each stage of this launch (the report's `stages`, the summary's last line).
  stages, tic = {}, time.perf_counter()
  inputs = _inputs_key(config, workdir)  # labels first where the config makes them
  finished = _finished_report(workdir, inputs)
  if finished is not None:
    return finished  # a finished run of this config on these labels: nothing to compute
  data = _load_data(config, workdir)
  stages["labels"] = time.perf_counter() - tic  # labeling (if any) and reading the labels
  layout = _layout(config, data)
  programs = train_programs(ProgramsConfig.from_config(config), data.spec, layout.mesh)
  _write_splits(config, workdir, data)
  ckpt = Checkpoints(os.path.join(workdir, "checkpoints"), keep=config.checkpoint.keep)
  try:  # closed however it ends (a damaged step is an error of the restore)
    start, state = _restore_or_init(config, ckpt, programs, data, layout.train_seed)
    tic = time.perf_counter()
    outcome = _train(config, workdir, data, layout, programs, ckpt, start, state)
    stages["train"] = time.perf_counter() - tic
    if outcome["preempted"]:
      return {"preempted": True, "step": outcome["step"]}
    outcome["stages"] = stages
    report = _evaluate(config, workdir, data, layout, programs, ckpt, outcome)
    if jax.process_index() == 0:
      mark_finished(workdir, inputs)  # last, after the report
    return report
  finally:
    ckpt.close()


def _inputs_key(config: ConfigDict, workdir: str) -> str:
  """What a finished run's report depends on: the config (but its launch fields), the
  labels (their checksums; made first if the config labels them), the hindsight version."""
  from importlib.metadata import version

  from hindsight.drift.reference import cache_key

  labels = [_labels_dir(config, workdir)]
  if config.data.mix_labels_dir:
    labels.append(config.data.mix_labels_dir)
  digests = [sha256_file(os.path.join(dataset_dir(job_dir(p)), CHECKSUMS)) for p in labels]
  fields = config.to_dict()
  for dotted in RESTART_FREE:  # fields that may differ between launches of one run
    *path, name = dotted.split(".")
    node = fields
    for part in path:
      node = node.get(part, {})
    node.pop(name, None)
  return cache_key(config=fields, labels=digests, version=version("hindsight"))


def _finished_report(workdir: str, inputs: str) -> dict | None:
  """The report a finished run with the same inputs wrote in `workdir`, or None. None too
  when a checkpoint step fails its manifest: the full path then refuses it in one line, or
  falls back past it (`checkpoint.fallback`), as for any run."""
  report = finished_report(workdir, inputs)
  if report is None:
    return None
  root = os.path.join(workdir, "checkpoints")
  steps = [d for d in os.listdir(root) if d.isdigit()] if os.path.isdir(root) else []
  if not steps or any(verify_manifest(os.path.join(root, d)) is not None for d in steps):
    return None
  return report


def _load_data(config: ConfigDict, workdir: str) -> _Data:
  """The labels (made first by `data.label` if needed), the split and the DataSpec."""
  labels_dir = _labels_dir(config, workdir)
  labels = open_training_labels(
    labels_dir, config.data.mix_labels_dir, int(config.data.mix_episodes)
  )
  reader = EpisodeReader(labels)
  fractions = (config.data.validation_fraction, config.data.test_fraction)
  splits = split_episodes(len(labels), fractions, int(config.seed))
  if splits["test"].size < MIN_TEST_EPISODES and jax.process_index() == 0:
    note(f"the test split holds {splits['test'].size} of {len(labels)} episodes: the report's "
         f"intervals and `hindsight eval` need at least {MIN_TEST_EPISODES} (label more "
         "episodes or raise --config.data.test_fraction)")  # fmt: skip
  # The step encoder: the data's kind, or the one `data.encoder` names, fitted with the
  # config's options for it (text: `data.tokenizer`, `data.vocab_size`, configs/text.py).
  options = {
    "tokenizer": config.data.get("tokenizer", "bpe"),
    "vocab_size": int(config.data.get("vocab_size", 512)),
    # The LM-backbone encoder's (configs/text_lm.py): the policy's folder and how to start.
    "lm": config.data.get("lm", ""),
    "lm_init": config.data.get("lm_init", "pretrained"),
    "lm_width": int(config.data.get("lm_width", 64)),
  }
  horizon = labels.metadata.horizon or None
  lengths, spec = reader.scan(splits["train"], horizon, config.data.get("encoder", ""), options)
  init = None
  if config.init_from:
    init = _init_model(config, spec)
    spec = init.spec  # the model's normalisation stays the one it was trained with
  return _Data(labels_dir, labels, reader, splits, lengths, spec, init)


def _layout(config: ConfigDict, data: _Data) -> _Layout:
  """The device mesh, this process's rows and the batch plan of every split."""
  batch_size = int(config.data.batch_size)
  devices = jax.devices()
  if config.mesh.devices == -1:
    devices = devices_for_batch(batch_size, devices)
  else:
    if not 1 <= config.mesh.devices <= len(devices):
      raise HindsightError(f"mesh.devices={config.mesh.devices}: there are {len(devices)} devices")
    devices = devices[: config.mesh.devices]
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, devices, int(config.mesh.get("tp", 1)))
  if batch_size % batch_devices(mesh):
    raise HindsightError(
      f"data.batch_size={batch_size} is not a multiple of the {batch_devices(mesh)} row shards "
      "(mesh data x fsdp)"
    )
  rows = process_rows(batch_size, jax.process_index(), jax.process_count())
  # An ensemble member (config.member = m > 0) shares the split (a function of seed alone)
  # and varies the initialisation, dropout and batch order: keys folded from m.
  seed, member = int(config.seed), int(config.get("member", 0))
  member_key = jax.random.fold_in(jax.random.key(seed), MEMBER_FOLD + member)
  train_seed = seed if member == 0 else int(jax.random.randint(member_key, (), 0, 2**31 - 1))
  pads = bucket_lengths(data.lengths, config.data.num_buckets)
  plans = {
    split: BatchPlan(ids, data.lengths[ids], batch_size, pads, train_seed, split == "train")
    for split, ids in data.splits.items()
  }
  return _Layout(mesh, rows, train_seed, plans)


def _write_splits(config: ConfigDict, workdir: str, data: _Data) -> None:
  """WORKDIR/splits.json: the labels and the episodes of each split (the drift harness
  evaluates the test split; `hindsight.drift.held_out_split` reads it)."""
  if jax.process_index() != 0:
    return
  mix_dir = config.data.mix_labels_dir
  write_json(
    os.path.join(workdir, "splits.json"),
    {
      "labels": os.path.abspath(data.labels_dir),
      "mix_labels": os.path.abspath(mix_dir) if mix_dir else "",
      "mix_episodes": int(config.data.mix_episodes),
      "init_from": os.path.abspath(config.init_from) if config.init_from else "",
      **{k: v.tolist() for k, v in data.splits.items()},
    },
  )


def _restore_or_init(config, ckpt: Checkpoints, programs, data: _Data, train_seed: int):
  """(start step, state): the last good checkpoint, else a fresh state (the parameters of
  `init_from` where given, or the step encoder's pretrained ones where it has them)."""
  init = data.init
  steps = ckpt.steps()
  if steps and not os.path.isfile(os.path.join(ckpt.step_dir(steps[-1]), MODEL_FILE)):
    raise HindsightError(
      f"{ckpt.directory} holds checkpoints of an older hindsight (no {MODEL_FILE}): retrain "
      "in a new --workdir"
    )
  start, state = ckpt.restore(programs.abstract_state, fallback=config.checkpoint.fallback)
  if state is None:
    start, state = 0, programs.init(jax.random.fold_in(jax.random.key(train_seed), 0))
    if init is not None:
      state["model"] = jax.tree.map(
        lambda new, old: jax.device_put(old, new.sharding), state["model"], init.state
      )
    elif (pretrained := _encoder_params(data.spec.encoder)) is not None:
      # A step encoder that starts from pretrained weights (the LM backbone from the policy):
      # they replace its random ones, placed as the fresh state's shardings say.
      encoder = state["model"]["obs_encoder"]
      encoder["backbone"] = jax.tree.map(
        lambda new, old: jax.device_put(old, new.sharding), encoder["backbone"], pretrained
      )
  return start, state


def _encoder_params(encoder):
  """The pretrained parameters of a step encoder's `backbone` (an optional part of the
  protocol: `initial_params`), or None."""
  initial = getattr(encoder, "initial_params", None)
  return None if initial is None else initial()


class _Sigterm:
  """SIGTERM asks the loop to stop after a checkpoint (signal handlers can only be set from
  the main thread; elsewhere SIGTERM keeps its default)."""

  def __init__(self):
    self.requested = False
    self._in_main = threading.current_thread() is threading.main_thread()
    self._previous = None

  def __enter__(self):
    if self._in_main:
      self._previous = signal.signal(signal.SIGTERM, self._on_signal)
    return self

  def _on_signal(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._in_main:
      signal.signal(signal.SIGTERM, self._previous)


def _train(config, workdir, data: _Data, layout: _Layout, programs, ckpt, start, state) -> dict:
  """The training loop from `start`: a step per batch of the train plan, validation and a
  checkpoint every `train.eval_every` steps. Returns {preempted, step, state, seconds,
  last (the last logged train metrics), start}."""
  spec, mesh, rows, plan = data.spec, layout.mesh, layout.rows, layout.plans["train"]
  validation = evaluators.get("validation_loss")(
    programs, layout.plans["validation"], data.reader, spec, mesh, rows
  )
  step_files = model_files(ModelConfig(**config.model.to_dict()), spec)
  dropout_root = jax.random.fold_in(jax.random.key(layout.train_seed), 1)
  logs = _Logs(workdir, start)
  total = int(config.train.steps)
  preempted, seconds, last, done = False, 0.0, {}, start
  patience = int(config.train.get("patience", 0))

  def patience_spent(step: int) -> bool:
    """No better validation loss in the `patience` steps up to `step` (a function of the
    saved checkpoints alone: a restarted run stops where the first would have)."""
    return patience > 0 and bool(ckpt.steps()) and step - ckpt.best_step() >= patience

  stopped_early = start if start < total and patience_spent(start) else None
  if stopped_early is not None:
    start = total  # a run that stopped early and was restarted: nothing left to train
  bar = CompileAwareBar(
    total=total,
    initial=start,
    desc="train",
    unit="step",
    disable=not config.train.progress or jax.process_index() != 0,
  )
  with _Sigterm() as sigterm, bar, logs:
    for step in range(start, total):
      pad, ids = plan.at(step)
      tic = time.perf_counter()
      # Padded to its own token bucket (a text encoder's): short traces cost short programs.
      shape = batch_shape(data.reader, ids, spec)
      batch = global_batch(make_batch(data.reader, ids[rows], pad, spec, shape), mesh)
      state, metrics = programs.train_step(state, batch, jax.random.fold_in(dropout_root, step))
      done = step + 1
      bar.update(1)
      if done % config.train.log_every == 0 or done == total:
        last = {k: float(v) for k, v in jax.device_get(metrics).items()}
        bar.set_postfix(loss=f"{last['loss']:.3f}", mae=f"{last['mae']:.3g}")
        logs.write("train", done, last)
      seconds += time.perf_counter() - tic
      # Every process must stop at the same step (a checkpoint is a collective save): the
      # SIGTERM may reach one process, or each at another step. One tiny all-gather per step
      # agrees on it.
      stopping = any_process(sigterm.requested)
      if done % config.train.eval_every == 0 or done == total or stopping:
        val_losses = validation.run(state)
        logs.write("validation", done, val_losses)
        ckpt.save(done, state, val_losses["loss"], files=step_files)
        if not stopping and done < total and patience_spent(done):
          stopped_early = done
          break
      if stopping:
        preempted = True
        log.warning("SIGTERM: saved the checkpoint of step %d; exiting", done)
        break
  return {"preempted": preempted, "step": done, "state": state, "seconds": seconds,
          "last": last, "start": start, "stopped_early": stopped_early}  # fmt: skip


def _evaluate(config, workdir, data: _Data, layout: _Layout, programs, ckpt, outcome) -> dict:
  """The evaluated checkpoint (best or last): its sigma scale fitted on the validation
  split (written into its step directory), then the test split scored against its labels:
  WORKDIR/report.json and plots (`label_fit`)."""
  tic_evaluate = time.perf_counter()
  spec, mesh, rows, plans = data.spec, layout.mesh, layout.rows, layout.plans
  final_digest = state_digest(outcome["state"])
  eval_step = ckpt.best_step() if config.checkpoint.evaluate == "best" else ckpt.steps()[-1]
  eval_step, state = ckpt.restore(programs.abstract_state, step=eval_step, fallback=False)
  sigma_scale, calibration_steps = evaluators.get("sigma_scale")(
    programs, plans["validation"], data.reader, spec, mesh, rows
  ).run(state)
  ckpt.add_files(eval_step, {CALIBRATION_FILE: calibration_text(eval_step, sigma_scale,
                                                                calibration_steps)})  # fmt: skip
  fit = evaluators.get("label_fit")(programs, plans["test"], data.reader, spec, mesh, rows)
  report, steps = fit.run(state, sigma_scale)
  report.update(
    labels=os.path.abspath(data.labels_dir),
    env=data.labels.metadata.env,
    replacement=data.labels.metadata.replacement,
    episodes={k: int(v.size) for k, v in data.splits.items()},
    evaluated_checkpoint=eval_step,
    sigma_scale=sigma_scale,  # fitted on the validation split, applied in this report
    evaluated_by=config.checkpoint.evaluate,  # "best" (validation loss) or "last"
    data_spec=json.loads(spec.to_json()),
  )
  report["train"] = {
    "steps": int(config.train.steps),
    "resumed_from": outcome["start"],
    "seconds": round(outcome["seconds"], 2),
    "final_loss": outcome["last"].get("loss"),
    "params_sha256": final_digest,
    "zero_ties": bool(config.loss.get("zero_ties", False)),
    # The step train.patience stopped the run at (None: it trained every step).
    "stopped_early_at": outcome["stopped_early"],
    "patience": int(config.train.get("patience", 0)),
  }
  report["stages"] = {k: round(v, 1) for k, v in outcome.get("stages", {}).items()}
  report["stages"]["evaluate"] = round(time.perf_counter() - tic_evaluate, 1)
  report["summary"] = summary_text(report)
  if jax.process_index() == 0:
    evaluators.write_label_fit(workdir, report, steps)
  return report


def run_training(config: ConfigDict, workdir: str) -> int:
  """`hindsight train` and `python -m train.main`: train_and_evaluate, then the summary on
  stdout and exit code 0, or 143 after a SIGTERM (a checkpoint of the current step saved)."""
  report = train_and_evaluate(config, workdir)
  if report.get("preempted"):
    print(f"preempted: checkpoint saved at step {report['step']}", file=sys.stderr)
    return 143
  print(report["summary"])
  return 0
