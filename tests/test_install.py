"""The package as a new user gets it: the wheel built from the checkout's package files,
installed into a fresh virtual environment and used from a directory outside the checkout.
It runs the README's Python example, `hindsight rl` with docs/rl.md's config of a gymnax
environment, and `hindsight eval` on the example's run."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib

import pytest
from conftest import FAST_COMPILE, ROOT, page_file


def _pyproject() -> dict:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


def test_pyproject_lists_every_package():
  """The wheel's packages are listed by hand (configs/ is installed as hindsight.configs):
  a package folder missing from the list would be missing from every install."""
  setuptools = _pyproject()["tool"]["setuptools"]
  folders = {
    os.path.relpath(d, ROOT).replace(os.sep, ".")
    for d, _, files in os.walk(os.path.join(ROOT, "hindsight"))
    if "__init__.py" in files
  }
  assert set(setuptools["packages"]) == folders | {"hindsight.configs"}
  assert setuptools["package-dir"] == {"hindsight.configs": "configs"}


def _readme_example() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  start = text.index("```python", text.index("## In Python"))
  return text[start + len("```python") : text.index("```", start + 3)]


def _install(tmp_path) -> str:
  """A fresh venv with the wheel installed (no index, no downloads: its dependencies are
  this interpreter's, reached through a .pth line that does not run the editable install's
  own .pth); returns its bin directory."""
  src = _mkdir(tmp_path / "src")
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(ROOT, name), src / name)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for name in ("hindsight", "configs"):
    shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
  wheels = tmp_path / "wheels"
  subprocess.run(
    [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
     "-q", "-w", str(wheels), str(src)],
    check=True, capture_output=True, timeout=300,
  )  # fmt: skip
  (wheel,) = wheels.glob("hindsight-*.whl")
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
  python = venv / "bin" / "python"
  purelib = subprocess.run(
    [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
    check=True, capture_output=True, text=True,
  ).stdout.strip()  # fmt: skip
  with open(os.path.join(purelib, "dependencies.pth"), "w") as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")
  subprocess.run(
    [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
    check=True, capture_output=True, timeout=300,
  )  # fmt: skip
  return str(venv / "bin")


def _mkdir(path):
  path.mkdir(parents=True)
  return path


@pytest.mark.slow
def test_the_installed_package_runs_the_examples(tmp_path):
  bin_dir = _install(tmp_path)
  user = _mkdir(tmp_path / "user")  # outside the checkout: no data/, configs/ or train/
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", XLA_FLAGS=FAST_COMPILE)

  def run(*argv, timeout=600):
    proc = subprocess.run([str(a) for a in argv], cwd=user, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, (argv, proc.stderr[-3000:])
    return proc

  # The package is the installed one, and its shipped configs load by name.
  where = run("python", "-c", "import hindsight, hindsight.configs as c; "
              "print(hindsight.__file__); print(c.__file__)").stdout  # fmt: skip
  # (by path: a temporary directory may share the checkout's name as a prefix, /tmp/x_tmp)
  files = where.split()
  assert not any(f.startswith(ROOT + os.sep) for f in files), where
  assert all(f.startswith(bin_dir.rsplit(os.sep, 1)[0] + os.sep) for f in files), where
  run(
    "python",
    "-c",
    "from hindsight.config_io import load_config as L; "
    "[L(n) for n in ('reasoning:smoke', 'rl_reasoning:smoke', 'rl_cartpole', 'tabular', "
    "'rl_text')]",
  )

  # The README's Python example as written, at smoke size.
  code = _readme_example()
  for big, small in (("episodes=2048", "episodes=64"), ("num_rollouts=64", "num_rollouts=8"),
                     ("generic_config()", 'generic_config("smoke")')):  # fmt: skip
    assert big in code, big
    code = code.replace(big, small)
  code += (
    "\nassert len(scores) == 8\n"
    "for i, sc in enumerate(scores):\n"
    "  n = len(episodes[i])\n"
    "  assert sc['credit'].shape == (n,)\n"
    "  assert abs(float(out['credit'][i, :n].sum()) - float(sc['credit'].sum())) < 1e-4\n"
  )
  (user / "example.py").write_text(code)
  run("python", "example.py")

  # `hindsight eval` on the example's run: its 7 test episodes, the gradient table of its
  # own MDP (key_corridor, on 128 episodes), baselines sized to its 51 training episodes.
  proc = run("hindsight", "eval", "--run", "runs/corridor", "--no-progress",
             "--gradient-episodes", "128", "--bootstrap", "200")  # fmt: skip
  assert "Spearman vs reference" in proc.stdout
  report = json.loads((user / "runs" / "corridor" / "drift" / "report.json").read_text())
  assert report["reference"]["kind"] == "exact DP" and report["steps"] > 0
  assert report["gradient"]["env"] == "key_corridor"

  # `hindsight rl` on docs/rl.md's config of gymnax's Catch, from a file of the user's own.
  (user / "my_catch.py").write_text(page_file("docs/rl.md", "my_catch.py"))
  proc = run("hindsight", "rl", "--config", "my_catch.py:smoke", "--workdir", "runs/catch",
             "--config.source=mc_credit")  # fmt: skip
  assert "horizon 9, the longest of 1024 episodes" in proc.stderr, proc.stderr
  results = json.loads((user / "runs" / "catch" / "results.json").read_text())
  assert results["env"] == "gymnax:Catch-bsuite" and results["horizon"] == 9
  assert len(results["seeds"]) == 2 and all(s["cut_share"] == 0.0 for s in results["seeds"])
  assert results["seeds"][0]["credit_env_steps"] > 0

  # `hindsight rl --config rl_text`: GRPO of a language model on MC credit, from the installed
  # package (a smaller LM than the smoke config's: the run, not the model, is tested here).
  run("hindsight", "rl", "--config", "rl_text:smoke", "--workdir", "runs/lm_rl",
      "--config.source=mc_credit", "--config.num_seeds=1", "--config.lm_train.steps=30",
      "--config.lm_train.traces=64")  # fmt: skip
  results = json.loads((user / "runs" / "lm_rl" / "results.json").read_text())
  assert results["kind"] == "lm" and results["source"] == "mc_credit"
  assert len(results["seeds"]) == 1 and results["seeds"][0]["credit_env_steps"] > 0
