"""Test setup: 8 fake CPU devices (docs/design.md, section 3), set before JAX starts."""

import os
import sys

# XLA optimisation level 0 (also FAST_COMPILE below, for subprocesses): compiles are 2-3x faster
# (the reasoning labeler: 22 s -> 8 s), and compiling, not running, is what these small
# programs spend their time on.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST_COMPILE = "--xla_backend_optimization_level=0"
CLI_FLAGS = os.environ["XLA_FLAGS"]  # a subprocess's flags where its device count is not tested
# One persistent XLA cache for the subprocesses the tests start: the training tests start several
# that compile the same programs (results do not depend on it) ...
_CACHE = os.path.join(ROOT, ".pytest_cache", "jax-compilation-cache")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("HINDSIGHT_COMPILATION_CACHE", _CACHE)  # the CLI's own setting
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
HINDSIGHT = [sys.executable, "-m", "hindsight.cli"]
# ... but not in the pytest processes themselves: a worker that lives through the whole suite
# (thousands of executables) has crashed inside XLA's CPU executable (de)serialization
# (`compilation_cache.put_executable_and_time` / `get_executable_and_time`, a segfault that
# takes the worker down). In-process CLI runs (`enable_compilation_cache` sets only the
# directory) compile instead: about 10% slower on the CLI-heavy modules, and that code never runs.
import jax  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)

# Where the suite's time goes: the seconds this process spent in XLA compiles (JAX's backend
# compile event; tracing and lowering, whose events nest, are not counted), summed over the
# workers and printed beside the tests' own seconds at the end of the run
# (`pytest_terminal_summary`). The CLI subprocesses the tests start are not counted.
_SPENT = {"compile_seconds": 0.0, "backend_compiles": 0, "test_seconds": 0.0}


def _count_compile(event: str, seconds: float, **_) -> None:
  if event == "/jax/core/compile/backend_compile_duration":
    _SPENT["compile_seconds"] += seconds
    _SPENT["backend_compiles"] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def pytest_configure(config):
  """The XLA cache persists across runs (its key is the compiled module itself), but the
  stored labeling programs start empty in every run: a hole in their key would otherwise
  stick from one run to the next and hide itself (xdist: the controller clears it once,
  before any worker starts)."""
  import shutil

  if not os.environ.get("PYTEST_XDIST_WORKER"):
    shutil.rmtree(os.path.join(os.environ["HINDSIGHT_COMPILATION_CACHE"], "programs"),
                  ignore_errors=True)  # fmt: skip


# Modules in the slow tier as a whole: the language model, its servers, RL and the end-to-end
# programs, whose shared fixtures train or serve something (each 20-280 s of a cold suite's
# worker time). `make test-fast` runs the rest, the library's core, in about 4 minutes.
SLOW_MODULES = frozenset({
  "test_adapters", "test_agents_text", "test_eval_programs", "test_label_honesty",
  "test_labeler_vs_exact", "test_lm_engine", "test_lm_hf", "test_lm_serve_chat",
  "test_lm_server", "test_lm_train_cli", "test_own_lm", "test_rl", "test_rl_credit",
  "test_rl_pp", "test_rl_text", "test_serving", "test_serving_text", "test_stored_programs",
  "test_text_model",
})  # fmt: skip


def pytest_collection_modifyitems(config, items):
  """Every test of a `SLOW_MODULES` module is marked slow (beside the tests marked one by one)."""
  for item in items:
    if item.path.stem in SLOW_MODULES:
      item.add_marker(pytest.mark.slow)


def pytest_runtest_logreport(report):
  """The tests' own seconds (setup, call and teardown), as the controller hears of them."""
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    _SPENT["test_seconds"] += report.duration


def pytest_sessionfinish(session):
  """A worker hands its compile seconds to the controller (`pytest_testnodedown`)."""
  if hasattr(session.config, "workeroutput"):
    session.config.workeroutput["spent"] = {k: _SPENT[k] for k in ("compile_seconds",
                                                                   "backend_compiles")}  # fmt: skip


def pytest_testnodedown(node, error):
  spent = getattr(node, "workeroutput", {}).get("spent", {})
  for key, value in spent.items():
    _SPENT[key] += value


def pytest_terminal_summary(terminalreporter):
  if os.environ.get("PYTEST_XDIST_WORKER") or not _SPENT["test_seconds"]:
    return
  share = _SPENT["compile_seconds"] / _SPENT["test_seconds"]
  terminalreporter.write_line(
    f"XLA compiles in the test processes: {_SPENT['backend_compiles']} programs, "
    f"{_SPENT['compile_seconds']:.0f} s of the tests' {_SPENT['test_seconds']:.0f} s "
    f"({share:.0%}; tracing, lowering and the CLI subprocesses not counted)"
  )


def page_file(page: str, name: str) -> str:
  """The Python block of `page` (README.md, docs/X.md) that starts with the comment `# NAME`:
  a file the page asks its reader to write (docs/rl.md's my_catch.py), that line dropped."""
  import re

  with open(os.path.join(ROOT, page)) as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
  for block in blocks:
    first, _, rest = block.partition("\n")
    if first.strip() == f"# {name}":
      return rest
  raise AssertionError(f"{page}: no ```python block starting '# {name}'")


def page_module(tmp_path, monkeypatch, page: str, name: str) -> None:
  """`page_file(page, name)` written as tmp_path/NAME and importable under its module name
  for the test (a module of that name imported before is forgotten first)."""
  (tmp_path / name).write_text(page_file(page, name))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, name.removesuffix(".py"), raising=False)


@pytest.fixture
def mdp_file(tmp_path):
  """A random tabular MDP saved to disk; returns its path."""
  from hindsight.envs import random_mdp

  path = tmp_path / "mdp.npz"
  random_mdp(3, num_states=5, num_actions=3, horizon=6).save(path)
  return str(path)


def run_cli(*args, timeout=300, env=None, process=False):
  """`hindsight ARGS` as a CompletedProcess (returncode, stdout, stderr). In this process
  (`hindsight.cli.main`, from the repository root, its output captured): a fresh
  interpreter costs a JAX start and a compile of every program the command runs, and the
  command is what these tests are about. `process=True` or an `env` runs
  `python -m hindsight.cli ARGS` in a subprocess, for tests of the process boundary itself:
  at this session's device count and XLA flags (CLI_FLAGS), so the programs such processes
  compile are shared through the persistent cache, unless `env` sets its own XLA_FLAGS (a
  test of the device count itself)."""
  import subprocess

  argv = [str(a) for a in args]
  if process or env is not None:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(
      [*HINDSIGHT, *argv],
      capture_output=True,
      text=True,
      timeout=timeout,
      cwd=ROOT,
      env=full_env,
    )
  import contextlib
  import io

  from hindsight.cli import main

  out, err = io.StringIO(), io.StringIO()
  with contextlib.chdir(ROOT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
      code = main(argv)
    except SystemExit as e:  # argparse's usage errors and --help
      code = e.code if isinstance(e.code, int) else 2
  return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def free_port() -> int:
  """A TCP port nobody listens on now (for a jax.distributed coordinator)."""
  import socket

  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def wait_until_ready(client, proc, timeout=120):
  """Polls a `hindsight serve` subprocess's /readyz through `client` until it is warm; fails
  with the server's stderr if it exits or the timeout passes first."""
  import time

  deadline = time.time() + timeout
  while not client.ready():
    assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
    time.sleep(0.2)


def assert_one_line_error(proc, *fragments):
  """Exit code 2, stderr is exactly one line naming the problem, no traceback."""
  assert proc.returncode == 2, (proc.returncode, proc.stderr)
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith("hindsight: error: "), lines[0]
  for fragment in fragments:
    assert fragment in lines[0], (fragment, lines[0])
  assert "Traceback" not in proc.stderr


def flip_byte_in_largest_file(directory) -> str:
  """Flips one bit pattern in the middle of the largest file under `directory`; its path."""
  files = [os.path.join(r, f) for r, _, fs in os.walk(directory) for f in fs]
  victim = max(files, key=os.path.getsize)
  with open(victim, "r+b") as f:
    f.seek(os.path.getsize(victim) // 2)
    byte = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([byte[0] ^ 0xFF]))
  return victim


def shared_run(tmp_path_factory, name: str, config: str, overrides=()) -> str:
  """A training run made once per test session and shared by every module and xdist
  worker that asks for the same `name` (a lock serialises its training; later askers find
  it finished). Tests read it and never write into it."""
  import fcntl

  from hindsight.config_io import load_config
  from hindsight.training import train_and_evaluate

  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # shared by the session's workers
  workdir = root / f"shared_{name}"
  with open(root / f"shared_{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (workdir / "report.json").is_file():
      train_and_evaluate(load_config(config, list(overrides)), str(workdir))
  return str(workdir)


# The tabular :smoke run the harness, audit and serving tests share: K=32 labels (enough with
# a sample stderr for the sigma scale's fit, and a model of the original policy close enough
# to its credit that a shifted policy's gap shows), 200 steps, checkpoints every 50.
TABULAR_RUN = (
  "tabular_k32",
  "configs/tabular.py:smoke",
  ("train.steps=200", "train.eval_every=50", "data.label.num_rollouts=32"),
)


@pytest.fixture(scope="session")
def tabular_run(tmp_path_factory):
  return shared_run(tmp_path_factory, *TABULAR_RUN)


def trained_run(tmp_path_factory, name: str, config: str, overrides=()) -> str:
  """A training run of `config` (with --config overrides) in a fresh directory; its path."""
  from hindsight.config_io import load_config
  from hindsight.training import train_and_evaluate

  workdir = tmp_path_factory.mktemp(name)
  train_and_evaluate(load_config(config, list(overrides)), str(workdir))
  return str(workdir)


np.set_printoptions(precision=4, suppress=True)


@pytest.fixture(scope="session")
def synthetic_labels(tmp_path_factory):
  """A 96-episode label dataset with a learnable credit (tests/synthetic_labels.py).

  Kept by path: pytest-xdist may run a session fixture again in the same worker.
  """
  from synthetic_labels import write_synthetic_labels

  from hindsight.data import is_complete

  out = str(tmp_path_factory.getbasetemp() / "synthetic_labels")
  return out if is_complete(out) else write_synthetic_labels(out)


@pytest.fixture(scope="session")
def text_run(tmp_path_factory):
  """Labels of 96 text-world traces at K = 8 and a small credit model trained on them (the
  "text_model" xdist group's: test_text_model.py, test_serving_text.py)."""
  from hindsight.labeling.config import LabelConfig
  from hindsight.labeling.job import LabelJob, run_label_job
  from hindsight.text.options import TextOptions
  from hindsight.text.trace import write_traces
  from hindsight.worlds import world
  from hindsight.worlds.server import running_world

  root = tmp_path_factory.mktemp("text_model")
  prompts = root / "prompts.jsonl"
  write_traces(str(prompts), world.prompt_traces(0, 96))
  with running_world() as url:
    job = LabelJob(f"text:{prompts}", 96, LabelConfig(num_rollouts=8), chunk_size=32,
                   options=TextOptions(endpoint=url, model=world.MODEL_NAME))  # fmt: skip
    labels = run_label_job(job, str(root / "labels"), progress=False)
  workdir = str(root / "model")
  got = run_cli("train", "--config", "text:smoke", "--labels", labels, "--workdir", workdir,
                "--config.train.steps=150", "--config.train.eval_every=50")  # fmt: skip
  assert got.returncode == 0, got.stderr
  return {"root": root, "labels": labels, "workdir": workdir}


@pytest.fixture(scope="module")
def tool_url():
  """The tool world's scripted agent served on loopback (`text-world serve --tools`)."""
  from hindsight.worlds.server import running_world

  with running_world(tools=True) as url:
    yield url


@pytest.fixture(scope="module")
def played(tmp_path_factory):
  """Whole traces of the tool world's scripted agent, results as steps of role `tool`."""
  from hindsight.text.trace import write_traces
  from hindsight.worlds import tool_world as tw

  path = tmp_path_factory.mktemp("tools") / "played.jsonl"
  write_traces(str(path), tw.sample_traces(1, 4))
  return str(path)
