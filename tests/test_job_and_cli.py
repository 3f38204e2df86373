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
from hindsight.labeling.job import LabelJob, run_label_job


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
  """Every DESIGN field is stored; one chunk or three give identical datasets."""
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
    assert key in labels.metadata
  assert labels.metadata["replacement"] == "uniform" and labels.metadata["rollouts"] == 8
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
  with pytest.raises(HindsightError, match="different job"):
    run_label_job(
      LabelJob(f"tabular:{mdp_file}", 8, LabelConfig(num_rollouts=4), seed=2, chunk_size=8), out
    )


def test_resume_after_sigkill_matches_uninterrupted(tmp_path, mdp_file):
  args = ["--env", f"tabular:{mdp_file}", "--episodes", 96, "--rollouts", 16,
          "--replacement", "policy", "--seed", 3, "--chunk-size", 8, "--no-progress"]  # fmt: skip
  ref, out = str(tmp_path / "ref"), str(tmp_path / "killed")
  proc = run_cli("label", *args, "--out", ref)
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

  proc = run_cli("label", *args, "--out", out)
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
  for r in rows:
    assert set(r["klass"]) <= {"decorative", "load_bearing", "harmful", "undetermined"}
    assert len(r["credit"]) == r["length"] == len(r["tags"]) == len(r["states"])
  assert main(["summary", out]) == 0
  assert "Spearman(progress, credit)" in capsys.readouterr().out


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
  ]  # fmt: skip
  for argv, fragment in cases:
    with pytest.raises(SystemExit) if "bogus" in argv else contextlib.nullcontext():
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
