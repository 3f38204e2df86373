"""`hindsight label` under jax.distributed: two CPU processes give the one-process dataset,
a killed process's range is resumed by rerunning the job, mismatched processes are refused."""

import os
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import FAST_COMPILE, HINDSIGHT, ROOT, assert_one_line_error, free_port, run_cli

from hindsight.data import is_complete, open_labels
from hindsight.envs import random_mdp

pytestmark = pytest.mark.xdist_group("label_distributed")


@pytest.fixture
def long_mdp(tmp_path):
  """Long enough episodes (H = 40) that a chunk takes a noticeable time to label."""
  path = tmp_path / "mdp.npz"
  random_mdp(11, num_states=16, num_actions=4, horizon=40).save(path)
  return str(path)


def _args(mdp, out, *extra):
  return ["label", "--env", f"tabular:{mdp}", "--episodes", 512, "--rollouts", 32,
          "--replacement", "uniform", "--seed", 4, "--chunk-size", 32, "--no-progress",
          "--out", out, *extra]  # fmt: skip


def _start(args, port, process_id):
  """One process of a two-process job (the same XLA flags as `run_cli`)."""
  flags = ["--coordinator", f"localhost:{port}", "--num-processes", 2, "--process-id", process_id]
  return subprocess.Popen(
    [*HINDSIGHT, *map(str, args + flags)],
    cwd=ROOT,
    env=dict(os.environ, XLA_FLAGS=FAST_COMPILE),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _chunk_files(out):
  chunks = os.path.join(out, "_chunks")
  return (
    sorted(f for f in os.listdir(chunks) if f.endswith(".npz")) if os.path.isdir(chunks) else []
  )


def _assert_same_dataset(a, b):
  """Every decoded field of every episode bitwise equal, and the same metadata."""
  a, b = open_labels(a), open_labels(b)
  assert len(a) == len(b) and a.metadata == b.metadata
  for i in range(len(a)):
    x, y = a[i], b[i]
    assert x.keys() == y.keys()
    for k in x:
      assert np.asarray(x[k]).tobytes() == np.asarray(y[k]).tobytes(), (i, k)


@pytest.mark.slow
def test_two_processes_killed_then_rerun_equal_one_process(tmp_path, long_mdp):
  ref, out = str(tmp_path / "one"), str(tmp_path / "two")
  # One device, as each of the two processes below has.
  proc = run_cli(*_args(long_mdp, ref), env={"XLA_FLAGS": FAST_COMPILE})
  assert proc.returncode == 0, proc.stderr

  # Process 1 labels chunks 1, 3, 5, ...; kill it once its first chunk is written.
  port = free_port()
  procs = [_start(_args(long_mdp, out), port, i) for i in range(2)]
  first_of_process_1 = "episodes_000000032_"
  deadline = time.time() + 240
  while time.time() < deadline and procs[1].poll() is None:
    if any(f.startswith(first_of_process_1) for f in _chunk_files(out)):
      break
    time.sleep(0.01)
  assert procs[1].poll() is None, "process 1 finished before it could be killed"
  procs[1].send_signal(signal.SIGKILL)
  procs[1].wait()
  # The survivor leaves at its next barrier with one line, not after JAX's 100 s heartbeat
  # timeout with a page of fatal logs.
  _, err = procs[0].communicate(timeout=120)
  assert procs[0].returncode == 2, err
  assert err.strip().startswith("hindsight: error: process 0 lost another process"), err
  assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
  assert not is_complete(out)
  kept = _chunk_files(out)
  assert first_of_process_1 in " ".join(kept) and len(kept) < 512 // 32

  # Rerun every process: each resumes its own range; process 0 writes the one dataset.
  port = free_port()
  procs = [_start(_args(long_mdp, out), port, i) for i in range(2)]
  for p in procs:
    stdout, err = p.communicate(timeout=240)
    assert p.returncode == 0, err
    assert stdout.strip().endswith("labels: " + os.path.join(out, "hindsight_labels", "1.0.0"))
  _assert_same_dataset(ref, out)
  assert not os.path.exists(os.path.join(out, "_chunks"))


def test_processes_given_other_arguments_are_refused(tmp_path, long_mdp):
  out, port = str(tmp_path / "o"), free_port()
  procs = [
    _start(_args(long_mdp, out), port, 0),
    _start(_args(long_mdp, out, "--rollouts", 16), port, 1),
  ]
  results = [subprocess.CompletedProcess(p.args, p.wait(timeout=240), "", p.stderr.read())
             for p in procs]  # fmt: skip
  assert_one_line_error(results[1], "process 1 was given other arguments", "rollouts")
  assert_one_line_error(results[0], "process 1 failed while opening --out")
  assert not is_complete(out)


@pytest.mark.parametrize(
  "flags, fragment",
  [
    (["--num-processes", 2], "2 processes need --coordinator HOST:PORT"),
    (["--coordinator", "localhost", "--num-processes", 2], "--coordinator must be HOST:PORT"),
    (
      ["--coordinator", "localhost:1", "--num-processes", 2, "--process-id", 2],
      "--process-id must be in [0, 2)",
    ),
    (["--num-processes", 0], "--num-processes must be >= 1"),
  ],
)
def test_bad_process_flags_are_one_line(tmp_path, mdp_file, flags, fragment):
  proc = run_cli(*_args(mdp_file, str(tmp_path / "o"), *flags), process=True)
  assert_one_line_error(proc, fragment)
  assert not os.path.exists(tmp_path / "o")
