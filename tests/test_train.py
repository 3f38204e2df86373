"""The training program: end to end, faults (SIGTERM, SIGKILL, a flipped byte), sharding.

Subprocess runs share a persistent XLA compilation cache (conftest), so only the first pays
for compiling. Every run here trains the `generic:smoke` config on the synthetic dataset.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import FAST_COMPILE, ROOT, flip_byte_in_largest_file, free_port
from flax import nnx

from hindsight.config_io import load_config
from hindsight.model.predictor import Predictor
from hindsight.training import read_metrics, train_and_evaluate
from train.main import main

STEPS = 40  # checkpoints every 10 steps: four places for a kill to land between


def _args(workdir, labels, *overrides):
  return [
    sys.executable,
    "-m",
    "train.main",
    "--config",
    "configs/generic.py:smoke",
    "--workdir",
    str(workdir),
    f"--config.data.labels_dir={labels}",
    f"--config.train.steps={STEPS}",
    "--config.data.num_buckets=1",
    "--config.mesh.devices=2",
    *[f"--config.{o}" for o in overrides],
  ]


def _start(workdir, labels, *overrides, devices=8):
  env = dict(
    os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE}"
  )
  return subprocess.Popen(
    _args(workdir, labels, *overrides),
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _run(workdir, labels, *overrides, devices=8):
  proc = _start(workdir, labels, *overrides, devices=devices)
  out, err = proc.communicate(timeout=300)
  return proc.returncode, out, err


def _report(workdir):
  with open(os.path.join(workdir, "report.json")) as f:
    return json.load(f)


def _saved_steps(workdir):
  """Checkpoint steps whose manifest is written (complete saves)."""
  d = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(d):
    return []
  return sorted(
    int(s)
    for s in os.listdir(d)
    if s.isdigit() and os.path.isfile(os.path.join(d, s, "hindsight_manifest.json"))
  )


def _wait_for_checkpoint_after(proc, workdir, step, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline:
    saved = _saved_steps(workdir)
    if saved and saved[-1] > step:
      return saved[-1]
    assert proc.poll() is None, f"training ended before a checkpoint after step {step}"
    time.sleep(0.02)
  raise AssertionError("no checkpoint appeared")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, synthetic_labels):
  """One uninterrupted run on a 2-device mesh: its report and training curve.

  Kept on disk by path: pytest-xdist may tear module fixtures down between tests of a group.
  """
  workdir = tmp_path_factory.getbasetemp() / "reference_run"
  if not os.path.isfile(workdir / "report.json"):
    shutil.rmtree(workdir, ignore_errors=True)
    rc, _, err = _run(workdir, synthetic_labels)
    assert rc == 0, err
  return workdir, _report(workdir), read_metrics(str(workdir))


@pytest.mark.slow
@pytest.mark.xdist_group("train")
def test_sigterm_then_sigkill_then_resume_ends_bitwise_identical(
  tmp_path, synthetic_labels, reference
):
  _, ref, ref_curve = reference
  workdir = tmp_path / "run"
  # SIGTERM: a checkpoint of the current step, then exit 143.
  proc = _start(workdir, synthetic_labels)
  _wait_for_checkpoint_after(proc, workdir, 0)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err
  assert "preempted: checkpoint saved at step" in err
  preempted_at = int(err.split("saved at step")[1].split()[0])
  assert preempted_at in _saved_steps(workdir) and preempted_at < STEPS
  assert not os.path.exists(workdir / "report.json")
  # SIGKILL: no chance to save; the restart resumes from the last complete checkpoint.
  proc = _start(workdir, synthetic_labels)
  _wait_for_checkpoint_after(proc, workdir, preempted_at)
  proc.kill()
  proc.wait(timeout=60)
  killed_at = _saved_steps(workdir)[-1]
  assert killed_at < STEPS, "the kill landed after training ended; make STEPS larger"
  rc, _, err = _run(workdir, synthetic_labels)
  assert rc == 0, err
  report = _report(workdir)
  assert report["train"]["resumed_from"] >= killed_at > preempted_at > 0
  assert report["train"]["params_sha256"] == ref["train"]["params_sha256"]
  assert read_metrics(str(workdir)) == ref_curve
  assert report["spearman"] == ref["spearman"]


@pytest.mark.xdist_group("train")
def test_damaged_checkpoint_is_refused_with_one_line_naming_the_file(
  tmp_path, synthetic_labels, reference, capsys
):
  ref_dir, _, _ = reference
  workdir = tmp_path / "copy"
  shutil.copytree(ref_dir, workdir)
  victim = flip_byte_in_largest_file(os.path.join(workdir, "checkpoints", str(STEPS)))
  # In-process (the refusal comes before any compile): one line, exit 2, the file named.
  argv = _args(workdir, synthetic_labels)[3:]
  assert main(argv) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("train: error: checkpoint step"), lines
  assert victim in lines[0]
  # (Falling back to the previous good step: tests/test_credit_model.py, in-process.)


@pytest.mark.slow
@pytest.mark.xdist_group("train")
def test_two_processes_preempted_together_resume_and_match_one(
  tmp_path, synthetic_labels, reference
):
  """Two processes of one CPU device each (gloo collectives) against the reference run of
  one process on two devices: each process reads only its half of every batch. A SIGTERM to
  one process stops both at the same step with the same checkpoint; restarted, they finish
  bitwise equal to the uninterrupted reference."""
  _, ref, ref_curve = reference
  workdir = tmp_path / "two"

  def start_both():
    coord = f"distributed.coordinator=localhost:{free_port()}"
    return [
      _start(
        workdir,
        synthetic_labels,
        coord,
        "distributed.num_processes=2",
        f"distributed.process_id={i}",
        devices=1,
      )
      for i in range(2)
    ]

  procs = start_both()
  _wait_for_checkpoint_after(procs[0], workdir, 0)
  procs[1].send_signal(signal.SIGTERM)  # the other process never sees a signal
  steps = []
  for p in procs:
    _, err = p.communicate(timeout=300)
    assert p.returncode == 143, err
    steps.append(int(err.split("saved at step")[1].split()[0]))
  assert steps[0] == steps[1] < STEPS and steps[0] in _saved_steps(workdir)
  for p in start_both():
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
  report = _report(workdir)
  assert report["train"]["resumed_from"] == steps[0]
  # Bitwise: the same global batches meet the same compiled all-reduce over two devices.
  assert report["train"]["params_sha256"] == ref["train"]["params_sha256"]
  np.testing.assert_array_equal(
    [r["loss"] for r in read_metrics(str(workdir))], [r["loss"] for r in ref_curve]
  )


@pytest.mark.slow
@pytest.mark.xdist_group("train_inprocess")
def test_sharded_loss_curve_matches_single_device(tmp_path, synthetic_labels):
  """8 devices as data 4 x fsdp 2 (parameters split too) against 1 device.

  Tolerance 1e-5 relative per logged loss: the batch mean becomes a sum of per-device partial
  sums, so float32 additions happen in another order (about 1e-7 relative), and 12 Adam steps
  can grow that by a few times; anything structural (a wrong shard, a dropped row) is O(1).
  """
  curves = {}
  for name, overrides in {
    "one": ["mesh.devices=1"],
    "sharded": ["mesh.fsdp=2", "mesh.min_fsdp_size=64"],
  }.items():
    config = load_config(
      "configs/generic.py:smoke",
      [
        f"data.labels_dir={synthetic_labels}",
        "train.log_every=1",
        "train.steps=12",
        "train.eval_every=12",
        "data.num_buckets=1",
        *overrides,
      ],
    )
    train_and_evaluate(config, str(tmp_path / name))
    curves[name] = np.array([r["loss"] for r in read_metrics(str(tmp_path / name))])
  assert curves["one"].size == 12
  np.testing.assert_allclose(curves["sharded"], curves["one"], rtol=1e-5)
  # bfloat16 compute (float32 parameters and residual stream): the same curve within the
  # rounding of bfloat16's 8-bit mantissa (2^-8 = 0.4% per op; 3% after 12 steps).
  config = load_config(
    "configs/generic.py:smoke",
    [f"data.labels_dir={synthetic_labels}", "train.log_every=1", "train.steps=12",
     "train.eval_every=12", "data.num_buckets=1", "mesh.devices=1",
     "model.compute_dtype=bfloat16"],
  )  # fmt: skip
  train_and_evaluate(config, str(tmp_path / "bf16"))
  bf16 = np.array([r["loss"] for r in read_metrics(str(tmp_path / "bf16"))])
  np.testing.assert_allclose(bf16, curves["one"], rtol=0.03)
  assert not np.array_equal(bf16, curves["one"])
  params = jax.tree.leaves(nnx.state(Predictor.load(str(tmp_path / "bf16")).state))
  assert {str(x.dtype) for x in params} <= {"float32", "int32", "uint32", "key<fry>"}


def test_the_runs_step_is_its_configs_choice(tmp_path):
  """ "run" reads checkpoint.evaluate from the run's config.json (the run's directory or its
  checkpoints directory named); a directory that is no training run loads its best step as
  before; a config.json that does not say best or last is a one-line error."""
  from hindsight.errors import HindsightError
  from hindsight.model.predictor import run_step_choice

  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "splits.json").write_text("{}")
  for choice in ("last", "best"):
    (run / "config.json").write_text(json.dumps({"checkpoint.evaluate": choice}))
    assert run_step_choice(str(run)) == choice
    assert run_step_choice(str(run / "checkpoints")) == choice
  (run / "config.json").write_text("{}")  # written before the field existed
  assert run_step_choice(str(run)) == "best"
  (run / "splits.json").unlink()  # not a training run's directory
  (run / "config.json").write_text(json.dumps({"checkpoint.evaluate": "last"}))
  assert run_step_choice(str(run)) == "best"
  (run / "splits.json").write_text("{}")
  for bad in ("[1, 2]", json.dumps({"checkpoint.evaluate": "first"}), "{not json"):
    (run / "config.json").write_text(bad)
    with pytest.raises(HindsightError, match=r"config\.json"):
      run_step_choice(str(run))


PATIENCE = ("optim.learning_rate=0.0", "train.patience=20", "checkpoint.evaluate=best")


@pytest.mark.slow
@pytest.mark.xdist_group("train")
def test_patience_stops_where_the_validation_loss_stopped_improving(tmp_path, synthetic_labels):
  """At learning rate 0 the validation loss never improves on its first value (step 10):
  patience 20 stops the run at step 30 of 40, the report says so, and a restart after the
  checkpoints (the finished mark removed) stops there again with the same parameters."""
  workdir = tmp_path / "patience"
  rc, out, err = _run(workdir, synthetic_labels, *PATIENCE)
  assert rc == 0, err
  report = _report(workdir)
  assert report["train"]["stopped_early_at"] == 30 and report["evaluated_checkpoint"] == 10
  assert "stopped early at step 30 of 40" in out
  assert _saved_steps(workdir)[-1] == 30
  os.remove(os.path.join(workdir, "report.inputs"))
  rc, _, err = _run(workdir, synthetic_labels, *PATIENCE)
  assert rc == 0, err
  again = _report(workdir)
  assert again["train"]["stopped_early_at"] == 30
  assert again["train"]["params_sha256"] == report["train"]["params_sha256"]


@pytest.mark.slow
@pytest.mark.xdist_group("train")
def test_report_scores_the_best_checkpoint_not_the_last(tmp_path, synthetic_labels):
  """A learning rate that overshoots late makes the last validation loss not the lowest:
  with checkpoint.evaluate=best the report must score the step with the lowest one (it
  scored the latest, silently), and the run's model is that step for every loader."""
  workdir = tmp_path / "overshoot"
  rc, _, err = _run(workdir, synthetic_labels, "optim.learning_rate=0.3", "optim.warmup_steps=0",
                    "checkpoint.evaluate=best")  # fmt: skip
  assert rc == 0, err
  val = {r["step"]: r["loss"] for r in read_metrics(str(workdir), split="validation")}
  best = min(val, key=val.get)
  assert best != max(val), val  # the situation under test arises (deterministic per seed)
  report = _report(workdir)
  assert report["evaluated_checkpoint"] == best and report["evaluated_by"] == "best", val
  # What eval, serve, score and audit load by default ("run") is the step the report scored;
  # a run whose config chose the last step (today's default) is loaded at its last.
  assert Predictor.load(str(workdir)).step == best
  assert Predictor.load(str(workdir), "last").step == STEPS
  config = json.loads((workdir / "config.json").read_text())
  assert config["checkpoint.evaluate"] == "best"
  (workdir / "config.json").write_text(json.dumps({**config, "checkpoint.evaluate": "last"}))
  assert Predictor.load(str(workdir)).step == STEPS
  assert Predictor.load(str(workdir / "checkpoints")).step == STEPS  # the directory, named too


@pytest.mark.slow
@pytest.mark.xdist_group("train_inprocess")
def test_tabular_smoke_config_labels_trains_and_reports(tmp_path, monkeypatch):
  """A config's whole path on :smoke: label (discrete observations), train, evaluate, report.
  (`make demo` runs the same path on configs/reasoning.py; its labeler compiles 10 s longer.)"""
  workdir = tmp_path / "demo"
  # :smoke's 40 steps leave a near-constant prediction; 400 (a few seconds) learn something.
  # K=32 labels (not :smoke's 8) keep the label noise from deciding the MAE comparison.
  overrides = ["train.steps=400", "train.eval_every=100", "data.label.num_rollouts=32"]
  config = load_config("configs/tabular.py:smoke", overrides)
  report = train_and_evaluate(config, str(workdir))
  on_disk = _report(workdir)
  for key in ("spearman", "pearson", "mae", "summary", "per_tag", "label_reliability"):
    assert key in on_disk
  assert on_disk["episodes"] == {"train": 50, "validation": 7, "test": 7}
  # The last step is the model (the default): scored here, and what every loader loads.
  assert on_disk["evaluated_by"] == "last" and on_disk["evaluated_checkpoint"] == 400
  assert Predictor.load(str(workdir)).step == 400
  assert on_disk["data_spec"]["encoder"]["kind"] == "discrete"
  assert np.isfinite(on_disk["mae"]) and on_disk["mae"] == report["mae"]
  # It learned something: its MAE beats the best constant's, and it ranks the ~130 test
  # steps (a constant ranks nothing; chance would give Spearman 0 +- 0.09; it reaches 0.44).
  assert on_disk["mae"] < on_disk["constant_mae"], (on_disk["mae"], on_disk["constant_mae"])
  assert on_disk["spearman"] is not None and on_disk["spearman"] > 0.25, on_disk["spearman"]
  assert on_disk["pearson"] > 0.25, on_disk["pearson"]
  assert "pick" in on_disk["per_tag"]
  assert os.path.getsize(workdir / "test_scatter.png") > 1000
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(workdir / "tensorboard"))
  assert os.path.isfile(workdir / "labels" / "hindsight_labels" / "1.0.0" / "dataset_info.json")
  # A rerun of the finished run reads its report back: nothing is loaded, trained or scored.
  from hindsight import training

  monkeypatch.setattr(training, "_load_data", lambda *a: pytest.fail("a finished run recomputed"))
  assert train_and_evaluate(config, str(workdir)) == on_disk


@pytest.mark.slow
@pytest.mark.xdist_group("train_inprocess")
def test_a_config_that_labels_then_trains_is_deterministic(tmp_path):
  """The same config and seed in two fresh workdirs: bitwise the same labels (every field of
  every episode) and the same trained parameters; another training seed, other parameters."""
  from hindsight.data import open_labels

  overrides = ["train.steps=20", "train.eval_every=10", "train.progress=False"]
  runs = {}
  for name, extra in (("a", []), ("b", []), ("seed1", ["seed=1"])):
    config = load_config("configs/tabular.py:smoke", overrides + extra)
    runs[name] = train_and_evaluate(config, str(tmp_path / name))["train"]["params_sha256"]
  assert runs["a"] == runs["b"] and runs["a"] != runs["seed1"], runs
  a, b = (open_labels(str(tmp_path / n / "labels")) for n in ("a", "b"))
  assert len(a) == len(b) == 64
  for i in range(len(a)):
    ea, eb = a[i], b[i]
    assert sorted(ea) == sorted(eb)
    for k in ea:
      np.testing.assert_array_equal(np.asarray(ea[k]), np.asarray(eb[k]), err_msg=f"{i} {k}")


@pytest.mark.parametrize("name", ["tabular", "key_to_door", "reasoning", "team", "generic"])
def test_every_config_and_its_smoke_variant_load(name):
  from hindsight import default_config as common

  full, smoke = load_config(f"configs/{name}.py"), load_config(f"configs/{name}.py:smoke")
  # The smoke variant is the experiment with exactly the smoke sizes on top, nothing else.
  episodes = smoke.data.label.episodes
  assert smoke.to_dict() == common.smoke(full.copy_and_resolve_references(), episodes).to_dict()
  assert smoke.train.steps == 40 and full.train.steps >= 1000 and episodes <= 64
  assert bool(full.data.label.env) == (name != "generic")


def test_bad_config_input_is_one_line(capsys, tmp_path):
  cases = [
    (["--config", "configs/generic.py:smoke"], "no label dataset at"),
    (["--config", "configs/nope.py"], "no such file"),
    (["--config", "configs/generic.py:smoke", "--config.train.stepz=3"], "no such config field"),
    (["--config", "configs/generic.py:smoke", "--config.train.steps=many"], "expected int"),
    (["--config", "configs/reasoning.py:huge"], "unknown variant"),
    (["--config", "configs/generic.py", "--config.model.num_heads=3"], "not divisible"),
    (
      ["--config", "configs/generic.py", "--config.distributed.num_processes=2"],
      "2 processes need config distributed.coordinator HOST:PORT",
    ),
  ]
  for argv, fragment in cases:
    assert main([*argv, "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], (argv, err)
  # A workdir keeps the config of its first run (written before the missing labels stopped
  # it) and refuses another; an uncreatable workdir is one line too.
  base = ["--config", "configs/generic.py:smoke", "--config.data.labels_dir=/nonexistent"]
  assert main([*base, "--workdir", str(tmp_path / "v")]) == 2
  assert main([*base, "--config.train.steps=7", "--workdir", str(tmp_path / "v")]) == 2
  (blocker := tmp_path / "file").write_text("x")
  assert main([*base, "--workdir", str(blocker / "w")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert "no label dataset" in err[0], err
  assert "holds a run of a different config (train.steps differ)" in err[1], err
  assert "--workdir" in err[2] and "cannot create it" in err[2], err


def test_workdir_check_ignores_launch_details_and_fields_added_later(tmp_path):
  """A run made before a config field existed resumes while the field is off; the
  coordinator address and process id change with every launch and are not the run's."""
  from hindsight.config_io import check_workdir
  from hindsight.training import RESTART_FREE

  config = load_config("configs/generic.py:smoke")
  check_workdir(config, str(tmp_path), RESTART_FREE)
  path = tmp_path / "config.json"
  saved = json.loads(path.read_text())
  assert "distributed.coordinator" not in saved
  saved.pop("init_from")  # as written by a hindsight without fine-tuning
  path.write_text(json.dumps(saved))
  relaunch = load_config(
    "configs/generic.py:smoke",
    ["distributed.coordinator=localhost:1234", "distributed.process_id=1"],
  )
  check_workdir(relaunch, str(tmp_path), RESTART_FREE)  # accepted
  tuned = load_config("configs/generic.py:smoke", ["init_from=/some/run"])
  with pytest.raises(Exception, match="init_from differ"):
    check_workdir(tuned, str(tmp_path), RESTART_FREE)


@pytest.mark.slow
@pytest.mark.xdist_group("train_inprocess")
def test_ensemble_members_share_the_split_not_the_parameters(tmp_path, synthetic_labels):
  """config.member = m > 0: the same split (from seed alone), another initialisation and
  batch order; member 0 is the plain run."""
  overrides = [f"data.labels_dir={synthetic_labels}", "train.steps=10", "train.eval_every=10"]
  runs = {}
  for m in (0, 1):
    workdir = str(tmp_path / f"member{m}")
    train_and_evaluate(
      load_config("configs/generic.py:smoke", [*overrides, f"member={m}"]), workdir
    )
    with open(os.path.join(workdir, "splits.json")) as f:
      runs[m] = (json.load(f), Predictor.load(workdir).digest)
  assert runs[0][0] == runs[1][0]  # the same labels and the same three splits
  assert runs[0][1] != runs[1][1]


@pytest.mark.slow
@pytest.mark.xdist_group("train")
def test_checkpoint_fallback_sets_a_damaged_step_aside_and_retrains_to_the_same_parameters(
  tmp_path, synthetic_labels, reference
):
  """A finished run whose last checkpoint is damaged: without `checkpoint.fallback` the
  rerun refuses in one line; with it, the step is moved to checkpoints.damaged/, training
  resumes from the previous good step and ends with the uninterrupted run's parameters."""
  ref_dir, ref, _ = reference
  workdir = tmp_path / "run"
  shutil.copytree(ref_dir, workdir)
  last = _saved_steps(workdir)[-1]
  flip_byte_in_largest_file(workdir / "checkpoints" / str(last))
  rc, _, err = _run(workdir, synthetic_labels)
  assert rc == 2 and "damaged" in err and len(err.strip().splitlines()) == 1, err
  rc, _, err = _run(workdir, synthetic_labels, "checkpoint.fallback=True")
  assert rc == 0, err
  assert os.listdir(workdir / "checkpoints.damaged")
  assert _report(workdir)["train"]["params_sha256"] == ref["train"]["params_sha256"]
  assert _report(workdir)["train"]["resumed_from"] < last


def test_a_run_as_short_as_its_warmup_has_a_schedule():
  """train.steps <= optim.warmup_steps (a quick trial of a config made for long runs) warms
  up over the whole run instead of failing in optax (its decay needs decay_steps >
  warmup_steps); a longer run keeps its warmup and cosine decay. Read off the updates: on a
  constant gradient Adam's step is the learning rate itself."""
  import optax

  from hindsight.model.programs import OptimConfig, make_optimizer

  def learning_rates(steps, warmup):
    tx = make_optimizer(OptimConfig(learning_rate=1.0, warmup_steps=warmup, weight_decay=0.0,
                                    final_lr_ratio=0.01), steps)  # fmt: skip
    params = {"w": np.zeros(3, np.float32)}
    state, out = tx.init(params), []
    for _ in range(steps):
      updates, state = tx.update({"w": np.ones(3, np.float32)}, state, params)
      out.append(-float(updates["w"][0]))
    return np.array(out)

  np.testing.assert_allclose(learning_rates(10, 100), np.arange(10) / 10, atol=1e-5)
  cosine = optax.warmup_cosine_decay_schedule(0.0, 1.0, 2, 10, 0.01)
  np.testing.assert_allclose(learning_rates(10, 2), [cosine(t) for t in range(10)], atol=1e-5)
