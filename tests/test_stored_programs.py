"""The labeling job's unit program kept as a jax.export artifact (hindsight.labeling.stored):
reused only where it is the program a trace would give, and giving the same bits."""

import importlib.metadata
import os

import jax
import numpy as np
import pytest

from hindsight.envs import TabularEnv, random_mdp
from hindsight.labeling import LabelConfig, Labeler, stored, to_numpy
from hindsight.policies import TabularPolicy


def _labels(labeler: Labeler, seed: int = 3):
  program = labeler.unit_program()
  idx = np.arange(labeler.chunk_multiple(), dtype=np.int32)
  return jax.tree.leaves(to_numpy(program(np.uint32(seed), idx)))


def _same(a, b) -> bool:
  return len(a) == len(b) and all(
    np.array_equal(x, y, equal_nan=x.dtype.kind == "f") for x, y in zip(a, b, strict=True)
  )


def _labeler(mdp, directory, rollouts=4, policy=None):
  env = TabularEnv(mdp)
  return Labeler(
    env, policy or TabularPolicy(mdp.pi), LabelConfig(num_rollouts=rollouts), program_dir=directory
  )


def _files(directory) -> set[str]:
  return set(os.listdir(directory)) if os.path.isdir(directory) else set()


def test_a_stored_program_is_reused_only_for_the_program_a_trace_would_give(tmp_path, monkeypatch):
  directory = str(tmp_path / "programs")
  mdp = random_mdp(1, num_states=5, num_actions=3, horizon=6)
  traced = _labeler(mdp, None)
  want = _labels(traced)
  assert traced.program_source == "traced" and not _files(directory)

  first = _labeler(mdp, directory)
  assert _same(_labels(first), want) and first.program_source == "exported"
  (name,) = _files(directory)
  second = _labeler(mdp, directory)
  assert _same(_labels(second), want) and second.program_source == "loaded"

  # Another environment of the same shapes (the tables are constants of the program).
  other = random_mdp(2, num_states=5, num_actions=3, horizon=6)
  changed = _labeler(other, directory)
  assert changed.program_source is None  # made on first use
  got = _labels(changed)
  assert changed.program_source == "exported" and len(_files(directory)) == 2
  assert _same(got, _labels(_labeler(other, None))) and not _same(got, want)

  # Another config, another source tree, another jax: never the stored program.
  assert _labeler(mdp, directory, rollouts=8).unit_program() and len(_files(directory)) == 3
  monkeypatch.setattr(stored, "package_digest", lambda: "edited")
  edited = _labeler(mdp, directory)
  assert _same(_labels(edited), want) and edited.program_source == "exported"
  monkeypatch.undo()
  # Each package whose code is traced (scipy's constants too), and a jax option outside the
  # six the key once named (one that changes categorical sampling), is part of the key.
  real = importlib.metadata.version
  for package in ("jax", "scipy"):
    bumped = lambda name, p=package: real(name) + (".dev0" if name == p else "")  # noqa: E731
    monkeypatch.setattr(importlib.metadata, "version", bumped)
    upgraded = _labeler(mdp, directory)
    upgraded.unit_program()
    assert upgraded.program_source == "exported", package
    monkeypatch.undo()
  before = stored.traced_options()
  jax.config.update("jax_high_dynamic_range_gumbel", True)
  try:
    assert stored.traced_options() != before
    gumbel = _labeler(mdp, directory)
    gumbel.unit_program()
    assert gumbel.program_source == "exported"
  finally:
    jax.config.update("jax_high_dynamic_range_gumbel", False)
  assert len(_files(directory)) == 7

  # A damaged file is traced again and replaced.
  path = os.path.join(directory, name)
  with open(path, "r+b") as f:
    f.seek(100)
    f.write(b"\xff" * 64)
  damaged = _labeler(mdp, directory)
  assert _same(_labels(damaged), want) and damaged.program_source == "exported"
  again = _labeler(mdp, directory)
  assert _same(_labels(again), want) and again.program_source == "loaded"


class _OutsidePolicy(TabularPolicy):
  """A policy class whose code the key cannot cover (defined outside the package)."""


def test_code_from_outside_the_package_is_traced_every_time(tmp_path):
  directory = str(tmp_path / "programs")
  mdp = random_mdp(1, num_states=5, num_actions=3, horizon=6)
  labeler = _labeler(mdp, directory, policy=_OutsidePolicy(mdp.pi))
  labeler.unit_program()
  assert labeler.program_source == "traced" and not _files(directory)


def test_fingerprints_follow_values_not_identities():
  a = random_mdp(1, num_states=5, num_actions=3, horizon=6)
  b = random_mdp(1, num_states=5, num_actions=3, horizon=6)
  assert stored.fingerprint(TabularEnv(a)) == stored.fingerprint(TabularEnv(b))
  pi = np.array(a.pi)
  pi[0, 0] = np.nextafter(pi[0, 0], 1.0)  # one ulp
  assert stored.fingerprint(TabularPolicy(pi)) != stored.fingerprint(TabularPolicy(a.pi))
  assert stored.fingerprint(LabelConfig(num_rollouts=4)) != stored.fingerprint(
    LabelConfig(num_rollouts=5)
  )
  # Classes by qualified name: two of the package never share a fingerprint.
  assert stored.fingerprint(TabularEnv) != stored.fingerprint(TabularPolicy)
  with pytest.raises(stored.Unfingerprintable):
    stored.fingerprint({"fn": lambda x: x})
  with pytest.raises(stored.Unfingerprintable):
    stored.fingerprint(object())


def test_a_second_hindsight_label_loads_the_program_the_first_stored(tmp_path, mdp_file):
  from conftest import run_cli

  from hindsight.data.labels import open_labels

  env = {"HINDSIGHT_COMPILATION_CACHE": str(tmp_path / "cache")}
  programs = tmp_path / "cache" / "programs"
  args = ("label", "--env", f"tabular:{mdp_file}", "--episodes", 5, "--rollouts", 4)
  first = run_cli(*args, "--out", tmp_path / "a", env=env)
  assert first.returncode == 0, first.stderr
  (stored_file,) = programs.iterdir()
  written = stored_file.stat().st_mtime_ns
  second = run_cli(*args, "--out", tmp_path / "b", env=env)
  assert second.returncode == 0, second.stderr
  assert list(programs.iterdir()) == [stored_file] and stored_file.stat().st_mtime_ns == written
  a, b = (open_labels(str(tmp_path / d)).source for d in "ab")
  for i in range(len(a)):
    for name, value in a[i].items():
      x, y = np.asarray(value), np.asarray(b[i][name])
      assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
