"""Start-up: the persistent compilation cache, lazy imports (what every CLI run pays) and the
Threefry lowering that compiles the labeler sooner with the same bits."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
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


def test_building_the_cli_parser_imports_no_jax():
  """`hindsight --help` and every usage error come from the parser alone: building it must
  not start JAX (its import was 1 s of the 1.3 s a `--help` took)."""
  code = "import sys\nfrom hindsight.cli import _parser\n_parser()\nprint('jax' in sys.modules)"
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
  )
  assert out.stdout.strip() == "False", out.stdout


def test_the_flat_api_resolves_every_name():
  import importlib

  import hindsight

  assert sorted(hindsight.__all__) == sorted(hindsight._HOMES)
  for name in hindsight.__all__:
    # Each flat name is its home module's own object (or the module itself).
    home = importlib.import_module(hindsight._HOMES[name])
    want = home if home.__name__ == f"hindsight.{name}" else getattr(home, name)
    assert getattr(hindsight, name) is want, name
  with pytest.raises(AttributeError):
    _ = hindsight.no_such_name


@pytest.mark.parametrize("pairs", [1, 2, 4, 7])
def test_threefry_pairs_are_jax_threefry_both_ways(pairs):
  """The labeler's own Threefry (unrolled or rolled) and JAX's, under the CPU lowering the
  labeler installs, give the bits of jax.extend.random.threefry_2x32."""
  from jax.extend.random import threefry_2x32

  from hindsight.labeling.rollout import threefry_pairs
  from hindsight.labeling.xla import unroll_threefry_on_cpu

  unroll_threefry_on_cpu()
  rng = np.random.default_rng(pairs)
  key = rng.integers(0, 2**32, 2, dtype=np.uint32)
  counts = rng.integers(0, 2**32, 2 * pairs, dtype=np.uint32)
  expected = _threefry_by_hand(key, counts)
  np.testing.assert_array_equal(np.asarray(jax.jit(threefry_2x32)(key, counts)), expected)
  for rolled in (False, True):
    y = jax.jit(lambda k, a, b, r=rolled: jnp.concatenate(threefry_pairs(k, a, b, r)))(
      key, counts[:pairs], counts[pairs:]
    )
    np.testing.assert_array_equal(np.asarray(y), expected)


def _threefry_by_hand(key, counts):
  """Threefry-2x32, 20 rounds, in Python integers (Salmon et al. 2011, as JAX uses it)."""
  mask, rot = 0xFFFFFFFF, ((13, 15, 26, 6), (17, 29, 16, 24))
  ks = [int(key[0]), int(key[1]), int(key[0]) ^ int(key[1]) ^ 0x1BD11BDA]
  m = len(counts) // 2
  out = np.zeros(2 * m, np.uint32)
  for j in range(m):
    x0, x1 = (int(counts[j]) + ks[0]) & mask, (int(counts[m + j]) + ks[1]) & mask
    for i in range(5):
      for r in rot[i % 2]:
        x0 = (x0 + x1) & mask
        x1 = (((x1 << r) | (x1 >> (32 - r))) & mask) ^ x0
      x0 = (x0 + ks[(i + 1) % 3]) & mask
      x1 = (x1 + ks[(i + 2) % 3] + i + 1) & mask
    out[j], out[m + j] = x0, x1
  return out
