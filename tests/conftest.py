"""Test setup: 8 fake CPU devices (DESIGN section 4), set before JAX starts."""

import os
import sys

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HINDSIGHT = [sys.executable, "-m", "hindsight.cli"]


@pytest.fixture
def mdp_file(tmp_path):
  """A random tabular MDP saved to disk; returns its path."""
  from hindsight.envs import random_mdp

  path = tmp_path / "mdp.npz"
  random_mdp(3, num_states=5, num_actions=3, horizon=6).save(path)
  return str(path)


def run_cli(*args, timeout=300, env=None):
  """Runs `python -m hindsight.cli ARGS` in a subprocess; returns CompletedProcess."""
  import subprocess

  full_env = dict(os.environ, **(env or {}))
  full_env.pop("XLA_FLAGS", None)  # the CLI picks its own device count, as for a user
  return subprocess.run(
    [*HINDSIGHT, *map(str, args)],
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=ROOT,
    env=full_env,
  )


def assert_one_line_error(proc, *fragments):
  """Exit code 2, stderr is exactly one line naming the problem, no traceback."""
  assert proc.returncode == 2, (proc.returncode, proc.stderr)
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("hindsight: error: "), lines[0]
  for fragment in fragments:
    assert fragment in lines[0], (fragment, lines[0])
  assert "Traceback" not in proc.stderr


np.set_printoptions(precision=4, suppress=True)
