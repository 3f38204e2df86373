"""The labeling job and the CLI: storage, determinism, resume after SIGKILL, bad input."""

import contextlib
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import FAST_COMPILE, HINDSIGHT, ROOT, assert_one_line_error, run_cli

from hindsight.cli import main
from hindsight.data import open_labels
from hindsight.envs import random_mdp
from hindsight.errors import HindsightError
from hindsight.labeling import STEP_FIELDS, LabelConfig
from hindsight.labeling.config import LabelJob
from hindsight.labeling.job import run_label_job


def _examples(path):
  return [open_labels(path)[i] for i in range(len(open_labels(path)))]


def _assert_same(a, b):
  """Bitwise equality of every field of every episode (NaN == NaN, but -0.0 != 0.0)."""
  assert len(a) == len(b)
  for i, (x, y) in enumerate(zip(a, b, strict=True)):
    assert x.keys() == y.keys()
    for k in x:
      assert np.asarray(x[k]).tobytes() == np.asarray(y[k]).tobytes(), (i, k, x[k], y[k])


def _array_record_bytes(out):
  """The raw record files. Equal only within one process: protobuf serialises the
  tf.train.Example feature map in a per-process hash order, so across processes we compare
  decoded episodes bitwise (`_assert_same`) instead."""
  d = os.path.join(out, "hindsight_labels", "1.0.0")
  files = sorted(f for f in os.listdir(d) if "array_record" in f)
  return [open(os.path.join(d, f), "rb").read() for f in files]


def test_dataset_fields_and_chunk_size_invariance(tmp_path, mdp_file):
  """Every field of docs/design.md is stored; one chunk or three give identical datasets."""
  config = LabelConfig(num_rollouts=8, replacement="uniform")
  # 8 fake devices x micro-batch 16: chunk sizes round up to multiples of 128.
  a = run_label_job(
    LabelJob(f"tabular:{mdp_file}", 300, config, seed=5, chunk_size=1), str(tmp_path / "a")
  )
  b = run_label_job(
    LabelJob(f"tabular:{mdp_file}", 300, config, seed=5, chunk_size=384), str(tmp_path / "b")
  )
  assert not os.path.exists(tmp_path / "a" / "_chunks")
  labels = open_labels(str(tmp_path / "a"))
  assert len(labels) == 300
  ex = labels[7]
  for field in (*STEP_FIELDS, "klass", "states", "observations", "actions", "rewards", "tags"):
    assert len(ex[field]) == ex["length"], field
  assert int(ex["episode"]) == 7
  for key in ("env", "policy", "replacement", "rollouts", "seed"):
    assert key in labels.info.metadata  # as stored
  assert labels.metadata.replacement == "uniform" and labels.metadata.rollouts == 8
  _assert_same(_examples(str(tmp_path / "a")), _examples(str(tmp_path / "b")))
  assert _array_record_bytes(str(tmp_path / "a")) == _array_record_bytes(str(tmp_path / "b"))
  assert a != b


def test_rerun_is_noop_and_other_args_are_refused(tmp_path, mdp_file):
  out = str(tmp_path / "o")
  job = LabelJob(f"tabular:{mdp_file}", 8, LabelConfig(num_rollouts=4), seed=1, chunk_size=8)
  run_label_job(job, out)
  before = _array_record_bytes(out)
  run_label_job(job, out)  # finished already: nothing to do
  assert _array_record_bytes(out) == before
  with pytest.raises(HindsightError, match=r"different job \(seed: 1 stored, 2 given\)"):
    run_label_job(
      LabelJob(f"tabular:{mdp_file}", 8, LabelConfig(num_rollouts=4), seed=2, chunk_size=8), out
    )


@pytest.mark.slow
def test_resume_after_sigkill_matches_uninterrupted(tmp_path, mdp_file):
  args = ["--env", f"tabular:{mdp_file}", "--episodes", 96, "--rollouts", 16,
          "--replacement", "policy", "--seed", 3, "--chunk-size", 8, "--no-progress"]  # fmt: skip
  ref, out = str(tmp_path / "ref"), str(tmp_path / "killed")
  # Every run in a process of its own on one device (the chunk size is rounded to the
  # devices' micro-batches, and a rerun must match the killed job's; at eight devices the
  # job is two chunks and ends before it can be killed).
  one_device = {"XLA_FLAGS": FAST_COMPILE}
  proc = run_cli("label", *args, "--out", ref, env=one_device)
  assert proc.returncode == 0, proc.stderr

  # The same XLA flags as run_cli: optimisation levels round differently (by an ulp).
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE)
  p = subprocess.Popen(
    [*HINDSIGHT, "label", *map(str, args), "--out", out], cwd=ROOT, env=env,
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
  )  # fmt: skip
  chunks = os.path.join(out, "_chunks")
  deadline = time.time() + 240
  while time.time() < deadline and p.poll() is None:
    if os.path.isdir(chunks) and sum(f.endswith(".npz") for f in os.listdir(chunks)) >= 2:
      break
    time.sleep(0.05)
  assert p.poll() is None, "the job finished before it could be killed"
  p.send_signal(signal.SIGKILL)
  p.wait()

  # A killed job never reads as complete.
  with pytest.raises(HindsightError, match="no complete label dataset"):
    open_labels(out)
  proc = run_cli("export", out)
  assert_one_line_error(proc, "no complete label dataset", "rerun")

  proc = run_cli("label", *args, "--out", out, env=one_device)
  assert proc.returncode == 0, proc.stderr
  _assert_same(_examples(ref), _examples(out))
  assert open_labels(ref).metadata == open_labels(out).metadata
  assert not os.path.exists(os.path.join(out, "_chunks"))


def test_export_jsonl_and_summary(tmp_path, mdp_file, capsys):
  out = str(tmp_path / "o")
  assert main(["label", "--env", f"tabular:{mdp_file}", "--episodes", "6", "--rollouts", "4",
               "--out", out, "--exact", "--no-progress"]) == 0  # fmt: skip
  capsys.readouterr()
  assert main(["export", out, "--format", "jsonl"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert len(lines) == 6
  rows = [json.loads(line) for line in lines]
  assert [r["episode"] for r in rows] == list(range(6))
  labels = open_labels(out)
  names = labels.metadata.klass_names
  for r, ex in zip(rows, labels, strict=True):
    assert len(r["credit"]) == r["length"] == len(r["tags"]) == len(r["states"])
    # Every exported value is the stored one (float32 -> JSON double exactly).
    for field in ("credit", "credit_stderr", "progress", "phi_hard", "rewards"):
      np.testing.assert_array_equal(np.asarray(r[field], np.float32), ex[field], err_msg=field)
    assert r["actions"] == ex["actions"].tolist() and r["states"] == ex["states"].tolist()
    assert r["klass"] == [names[k] for k in ex["klass"]]
    assert r["return"] == float(ex["return"]) and r["success"] == bool(ex["success"])
  assert main(["summary", out]) == 0
  text = capsys.readouterr().out
  assert text.splitlines()[0] == labels.path
  assert f"6 episodes, {sum(r['length'] for r in rows)} steps" in text


def _bad_mdp(tmp_path, **changes):
  mdp = random_mdp(0, num_states=4, num_actions=2, horizon=3)
  arrays = dict(
    P=mdp.P, r=mdp.r, pi=mdp.pi, mu0=mdp.mu0, horizon=np.int64(3), terminal=mdp.terminal
  )
  for k, v in changes.items():
    if v is None:
      arrays.pop(k)
    else:
      arrays[k] = v
  path = tmp_path / f"bad_{len(list(tmp_path.glob('bad_*')))}.npz"
  np.savez(path, **arrays)
  return f"tabular:{path}"


def _bad_cases(tmp_path):
  mdp = random_mdp(0, num_states=4, num_actions=2, horizon=3)
  P_neg = mdp.P.copy()
  P_neg[0, 0, 0] = -0.1
  P_sum = mdp.P.copy()
  P_sum[1, 1] *= 0.5
  pi_sum = mdp.pi.copy()
  pi_sum[2] = [0.7, 0.7]
  mu0_term = np.zeros(4)
  mu0_term[3] = 1.0
  not_npz = tmp_path / "x.npz"
  not_npz.write_text("hello")
  return [
    (_bad_mdp(tmp_path, P=None), "missing required array 'P'"),
    (_bad_mdp(tmp_path, P=mdp.P[:, :, :3]), "P must have shape"),
    (_bad_mdp(tmp_path, r=mdp.r[:3]), "r must have shape"),
    (_bad_mdp(tmp_path, P=P_neg), "is not a probability"),
    (_bad_mdp(tmp_path, P=P_sum), "P row [1, 1] sums to"),
    (_bad_mdp(tmp_path, pi=pi_sum), "pi row [2] sums to"),
    (_bad_mdp(tmp_path, mu0=mu0_term), "mu0 puts mass on terminal state 3"),
    (_bad_mdp(tmp_path, null_action=np.int64(5)), "null_action 5 is out of range"),
    (_bad_mdp(tmp_path, horizon=np.int64(0)), "horizon must be >= 1"),
    (_bad_mdp(tmp_path, terminal=np.zeros(4)), "terminal must be bool"),
    (f"tabular:{tmp_path}/missing.npz", "no such file"),
    (f"tabular:{not_npz}", "not a readable .npz file"),
    ("gridworld", "unknown environment"),
  ]


def test_bad_tabular_files_one_line_errors(tmp_path, capsys):
  """In-process for speed: each bad input is one line naming the problem and exit 2."""
  for spec, fragment in _bad_cases(tmp_path):
    out = str(tmp_path / "never")
    code = main(["label", "--env", spec, "--episodes", "2", "--out", out, "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, spec
    assert len(err) == 1 and err[0].startswith("hindsight: error: "), err
    assert fragment in err[0], (fragment, err[0])
    assert not os.path.exists(os.path.join(out, "hindsight_labels")), spec


def test_bad_arguments_one_line_errors(tmp_path, mdp_file, capsys):
  env = f"tabular:{mdp_file}"
  no_null = str(tmp_path / "nonull.npz")
  random_mdp(1, num_states=4, num_actions=2, horizon=3, null_action=None).save(no_null)
  cases = [
    (["--env", env, "--episodes", "0"], "--episodes must be >= 1"),
    (["--env", env, "--episodes", "2", "--rollouts", "1"], "--rollouts must be >= 2"),
    (["--env", f"tabular:{no_null}", "--episodes", "2", "--replacement", "null"],
     "declares none"),
    (["--env", env, "--episodes", "2", "--replacement", "bogus"], "invalid choice"),
    (["--env", env, "--episodes", "2", "--confidence", "1.5"], "--confidence"),
    (["--env", env, "--episodes", "2", "--decorative-tolerance", "-0.1"],
     "--decorative-tolerance must be"),
    (["--env", env, "--episodes", "2", "--decorative-tolerance", "nan"],
     "--decorative-tolerance must be"),
    (["--env", env, "--episodes", "2", "--gamma", "0"], "--gamma must be in (0, 1]"),
    (["--env", env, "--episodes", "2", "--gamma", "1.5"], "--gamma must be in (0, 1]"),
    (["--env", env, "--episodes", "2", "--chunk-size", "0"], "--chunk-size must be >= 1"),
    (["--env", env, "--episodes", "2", "--seed", "-1"], "--seed must be in [0, 2^32)"),
    (["--env", env, "--episodes", "2", "--seed", str(2**32)], "--seed must be in [0, 2^32)"),
    (["--env", env, "--episodes", "2", "--workers", "0"], "--workers must be >= 1"),
    (["--env", "gymnasium:CartPole-v1", "--episodes", "2", "--horizon", "0"],
     "--horizon must be >= 1"),
    (["--env", env, "--episodes", "2", "--horizon", "5"], "dm_env: environments only"),
    (["--env", "key_to_door", "--episodes", "2", "--exact"], "--exact needs a tabular MDP"),
    (["--env", env, "--episodes", "2", "--exact", "--rollouts", "0"], "--rollouts must be >= 1"),
    (["--env", "gridworld", "--episodes", "2"], "gymnasium:ENV_ID, dm_env:MODULE:FACTORY"),
    (["--env", env, "--episodes", "2", "--rollouts", "two"], "invalid int value"),
  ]  # fmt: skip
  for argv, fragment in cases:
    usage = "bogus" in argv or "two" in argv  # argparse's own errors exit from inside
    with pytest.raises(SystemExit) if usage else contextlib.nullcontext():
      code = main(["label", *argv, "--out", str(tmp_path / "o"), "--no-progress"])
      assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hindsight: error: "), err
    assert fragment in err[0], (fragment, err[0])
  not_ours = tmp_path / "full"
  not_ours.mkdir()
  (not_ours / "precious.txt").write_text("keep me")
  assert main(["label", "--env", env, "--episodes", "2", "--out", str(not_ours)]) == 2
  assert "not empty" in capsys.readouterr().err


def test_cli_subprocess_exit_code_and_single_line(tmp_path):
  """The real executable path: exit 2, one line, no traceback, nothing written."""
  mu0 = np.zeros(4)
  mu0[3] = 1.0
  proc = run_cli("label", "--env", _bad_mdp(tmp_path, mu0=mu0), "--episodes", 2,
                 "--out", tmp_path / "o")  # fmt: skip
  assert_one_line_error(proc, "mu0 puts mass on terminal state 3")
  assert not (tmp_path / "o").exists()
  proc = run_cli("export", tmp_path / "nowhere")
  assert_one_line_error(proc, "no such directory")


def test_the_printed_dataset_path_is_accepted_everywhere(tmp_path, mdp_file, capsys):
  """`hindsight label` prints DIR/hindsight_labels/1.0.0; every reader takes it as well as DIR."""
  from hindsight.data import is_complete

  out = str(tmp_path / "o")
  assert main(["label", "--env", f"tabular:{mdp_file}", "--episodes", "4", "--rollouts", "4",
               "--out", out, "--no-progress"]) == 0  # fmt: skip
  printed = capsys.readouterr().out.strip().removeprefix("labels: ")
  assert printed.endswith(os.path.join("hindsight_labels", "1.0.0"))
  assert is_complete(printed) and len(open_labels(printed)) == 4
  for command in (["summary", printed], ["export", printed]):
    assert main(command) == 0, command
  assert len(capsys.readouterr().out.strip().splitlines()) > 4


def test_unwritable_out_is_one_line(tmp_path, mdp_file):
  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  for out, fragment in ((blocker / "sub", "Not a directory"), ("/proc/hindsight", "--out")):
    proc = run_cli("label", "--env", f"tabular:{mdp_file}", "--episodes", 2, "--out", out)
    assert_one_line_error(proc, "--out", "cannot create it", fragment)


@pytest.fixture
def small_labels(tmp_path, mdp_file):
  out = str(tmp_path / "labels")
  config = LabelConfig(num_rollouts=4, replacement="uniform")
  run_label_job(LabelJob(f"tabular:{mdp_file}", 40, config, seed=1), out, progress=False)
  return out


def _dataset_file(out, predicate):
  d = os.path.join(out, "hindsight_labels", "1.0.0")
  return os.path.join(d, next(f for f in sorted(os.listdir(d)) if predicate(f)))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage_info", "garbage_checksums"])
def test_damaged_dataset_is_named_never_half_read(small_labels, damage):
  """export and summary check every file against the checksums written at finalisation
  before reading: a damaged dataset is one line naming the file, and nothing on stdout."""
  from conftest import flip_byte_in_largest_file

  if damage == "truncate":
    victim = _dataset_file(small_labels, lambda f: "array_record" in f)
    with open(victim, "r+b") as f:
      f.truncate(os.path.getsize(victim) // 2)
  elif damage == "flip":
    victim = flip_byte_in_largest_file(os.path.join(small_labels, "hindsight_labels"))
  elif damage == "garbage_info":
    victim = _dataset_file(small_labels, lambda f: f == "dataset_info.json")
    with open(victim, "w") as f:
      f.write("{not json")
  else:
    victim = _dataset_file(small_labels, lambda f: f == "hindsight_checksums.json")
    with open(victim, "w") as f:
      f.write("[]")
  for command in ("export", "summary"):
    proc = run_cli(command, small_labels)
    assert_one_line_error(proc, os.path.basename(victim), "damaged")
    assert proc.stdout == ""


def test_a_job_resumed_with_other_arguments_is_refused(tmp_path, mdp_file):
  """An --out holding an unfinished job (its job.json) refuses a job with another seed."""
  out = str(tmp_path / "o")
  os.makedirs(os.path.join(out, "_chunks"))
  config = LabelConfig(num_rollouts=4)
  with open(os.path.join(out, "_chunks", "job.json"), "w") as f:
    json.dump(LabelJob(f"tabular:{mdp_file}", 300, config, seed=1).describe(), f)
  with pytest.raises(HindsightError, match=r"unfinished job with other arguments \(.*seed"):
    run_label_job(LabelJob(f"tabular:{mdp_file}", 300, config, seed=2), out, progress=False)


def test_coalition_on_a_text_file_says_what_it_wants(tmp_path):
  text = tmp_path / "values.txt"
  text.write_text("0 1 1 2\n")
  proc = run_cli("coalition", "--values", text)
  assert_one_line_error(proc, "not a .npy array file", "numpy.save")
  assert "pickle" not in proc.stderr


def test_usage_mistakes_name_what_is_wrong(tmp_path, capsys):
  """A typo names the unknown flag (not the required one it hides), a prefix of a flag is not
  taken for it, a negative LO:HI says to use '=', and Python callers see resolved paths."""
  from hindsight.model.predictor import Predictor, training_run

  out = str(tmp_path / "o")
  cases = [
    (["label", "--env", "key_corridor", "--episods", "3", "--out", out],
     "unrecognized arguments: --episods 3 (did you mean --episodes?)"),
    (["label", "--env", "key_corridor", "--episodes", "3", "--rollout", "4", "--out", out],
     "unrecognized arguments: --rollout"),
    (["label", "--env", "gymnax:MemoryChain-bsuite", "--episodes", "3", "--return-range",
      "-1:1", "--out", out], "--return-range=-1:1"),
    (["train", "--workdir", out], "--labels DIR is required"),
    (["train", "--workdir", out, "--labels", out, "--bogus"], "unrecognized arguments: --bogus"),
  ]  # fmt: skip
  for argv, fragment in cases:
    try:
      code = main(argv)
    except SystemExit as e:  # argparse's usage errors
      code = e.code
    assert code == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, (argv, err)
  assert not os.path.exists(out)
  with pytest.raises(HindsightError, match=f"{tmp_path}/nowhere: no checkpoints") as e:
    Predictor.load(os.path.relpath(tmp_path / "nowhere"))
  assert "--checkpoint" not in str(e.value)
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  (tmp_path / "run" / "splits.json").write_text("{}")
  with pytest.raises(HindsightError, match="checkpoint directory of the run"):
    training_run(str(tmp_path / "run" / "checkpoints"))


def test_a_text_job_recorded_with_a_relative_trace_file_resumes(tmp_path, monkeypatch):
  """Jobs once recorded `text:FILE` as given (relative); `hindsight label` now records it
  absolute, and a rerun from the directory the job ran in is the same job."""
  from hindsight.labeling.job import _as_recorded_now

  monkeypatch.chdir(tmp_path)
  old = {"env": "text:traces/t.jsonl", "episodes": 3}
  assert _as_recorded_now(old) == {"env": f"text:{tmp_path}/traces/t.jsonl", "episodes": 3}
  for kept in ({"env": "text:/abs/t.jsonl"}, {"env": "reasoning"}, {"env": "gymnax:CartPole-v1"}):
    assert _as_recorded_now(kept) == kept
