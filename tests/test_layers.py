"""The import contracts `make test` checks (pyproject.toml's [tool.importlinter]) break when
the house does: `lint-imports` on a copy of the package with one import added fails, naming
the contract, where it passes on the package as it is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")


@pytest.fixture(scope="module")
def house(tmp_path_factory):
  """A copy of hindsight/ and the contracts, and `lint(module, line)`: lint-imports' (exit
  code, output) on the copy with `line` added to `module` (a path under hindsight/; None:
  as it is)."""
  where = tmp_path_factory.mktemp("house")
  shutil.copytree(os.path.join(ROOT, "hindsight"), where / "hindsight",
                  ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
  shutil.copy(os.path.join(ROOT, "pyproject.toml"), where / "pyproject.toml")

  def lint(module: str | None = None, line: str = ""):
    path = where / "hindsight" / (module or "__init__.py")
    before = path.read_text()
    if module is not None:
      path.write_text(before + f"\n{line}\n")
    try:
      # The copy first on the path: grimp reads the package it imports.
      env = dict(os.environ, PYTHONPATH=str(where))
      done = subprocess.run([LINT, "--no-cache"], cwd=where, env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    finally:
      path.write_text(before)
    return done.returncode, done.stdout + done.stderr

  return lint


def test_the_contracts_hold_on_the_package_as_it_is(house):
  code, out = house()
  assert code == 0, out
  assert "BROKEN" not in out and "Contracts: 5 kept, 0 broken." in out


def test_the_text_library_importing_the_agent_package_breaks_the_layers(house):
  code, out = house("text/estimate.py", "import hindsight.agentic.tools  # noqa")
  assert code == 1
  assert "hindsight's layers BROKEN" in out
  assert "hindsight.text.estimate -> hindsight.agentic.tools" in out


def test_a_circle_inside_a_package_breaks_the_acyclic_contract(house):
  """envs.adapters importing envs.families closes a circle (families makes the adapters'
  environments): the layers contract cannot see it, the acyclic one does."""
  code, out = house("envs/adapters.py", "from hindsight.envs import families  # noqa")
  assert code == 1
  assert "no circle among the modules of any package BROKEN" in out
  assert "hindsight's layers KEPT" in out
  assert "No cycles are allowed in hindsight.envs." in out
