"""Start-up: the persistent compilation cache and lazy imports (what every CLI run pays)."""

import subprocess
import sys

import pytest
from conftest import ROOT

from hindsight import compile_cache


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  monkeypatch.delenv(compile_cache.ENV_VAR, raising=False)
  assert compile_cache.cache_dir() == str(tmp_path / "xdg" / "hindsight" / "jax")
  monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / "moved"))
  assert compile_cache.cache_dir() == str(tmp_path / "moved")
  for off in ("", "0", "off", "OFF"):
    monkeypatch.setenv(compile_cache.ENV_VAR, off)
    assert compile_cache.cache_dir() is None
    assert compile_cache.enable_compilation_cache() is None


@pytest.mark.parametrize("module", ["hindsight", "hindsight.cli", "hindsight.labeling.job"])
def test_the_label_path_imports_neither_tfds_nor_matplotlib(module):
  code = (
    f"import sys, {module}\n"
    "heavy = [m for m in ('tensorflow_datasets', 'matplotlib', 'orbax', 'scipy.stats') "
    "if m in sys.modules]\n"
    "print(','.join(heavy))"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
  )
  assert out.stdout.strip() == "", out.stdout


def test_the_flat_api_resolves_every_name():
  import hindsight

  for name in hindsight.__all__:
    assert getattr(hindsight, name) is not None, name
  with pytest.raises(AttributeError):
    _ = hindsight.no_such_name
