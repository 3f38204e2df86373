"""What an older hindsight wrote still reads: checkpoints saved before step encoders were modules
(format 2) load bit for bit and score as they did, and the label datasets' metadata reads as
today's typed metadata (tests/data/legacy/README.md)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from conftest import ROOT

from hindsight.data import open_labels
from hindsight.data.episode import Episode
from hindsight.data.metadata import LabelMetadata
from hindsight.model.predictor import MODEL_FILE, Predictor

LEGACY = os.path.join(ROOT, "tests", "data", "legacy")
KINDS = ("discrete", "vector", "agents", "text")


@pytest.fixture
def legacy(tmp_path):
  """A copy of one kind's files (the checkpoints are opened read-only, but a test never
  touches the checked-in ones)."""

  def copy(kind: str) -> str:
    shutil.copytree(os.path.join(LEGACY, kind), tmp_path / kind)
    return str(tmp_path / kind)

  return copy


@pytest.mark.parametrize("kind", KINDS)
def test_an_old_checkpoint_loads_and_scores_bit_for_bit(kind, legacy):
  root = legacy(kind)
  with open(os.path.join(root, "expected.json")) as f:
    expected = json.load(f)
  with open(os.path.join(root, "run", "checkpoints", str(expected["step"]), MODEL_FILE)) as f:
    assert json.load(f)["format"] == 2  # written before step encoders were modules
  predictor = Predictor.load(os.path.join(root, "run"))
  assert predictor.step == expected["step"]
  assert predictor.spec.encoder.kind == {"agents": "vector"}.get(kind, kind)
  if kind != "text":
    # The same parameters in the same order (the text encoder's moved in the tree).
    assert predictor.digest == expected["digest"]
  labels = open_labels(os.path.join(root, "labels"))
  episodes = [Episode.from_example(labels[i]) for i in range(8)]
  want = np.load(os.path.join(root, "scores.npz"))
  got = predictor.score(episodes, allow_longer=True)
  for i, scores in enumerate(got):
    _same_scores(scores, want, f"{i}_", episodes[i])
  if kind == "text":  # the same traces in the trace format
    raw = [{"steps": list(e.step_text), "outcome": float(e.rewards.sum())} for e in episodes]
    for i, scores in enumerate(predictor.score(raw)):
      _same_scores(scores, want, f"trace{i}_", episodes[i])


def _same_scores(scores: dict, want, prefix: str, episode: Episode) -> None:
  """Every score as stored: classes exactly, floats to float32 rounding. The parameters are
  held bit for bit (the digest); the arithmetic on them is XLA's, whose CPU code differs by
  an ulp between processors and releases."""
  for name, value in scores.items():
    if name == "steps":  # a text trace's steps, returned beside its scores
      assert value == list(episode.step_text)
      continue
    stored = want[f"{prefix}{name}"]
    if np.issubdtype(stored.dtype, np.floating):
      np.testing.assert_allclose(value, stored, rtol=1e-5, atol=1e-7, err_msg=f"{prefix}{name}")
    else:
      np.testing.assert_array_equal(value, stored, err_msg=f"{prefix}{name}")


@pytest.mark.parametrize("kind", KINDS)
def test_an_old_datasets_metadata_reads_typed_and_writes_back_the_same(kind):
  with open(os.path.join(LEGACY, kind, "expected.json")) as f:
    stored = json.load(f)["metadata"]
  labels = open_labels(os.path.join(LEGACY, kind, "labels"))
  meta = labels.metadata
  assert isinstance(meta, LabelMetadata) and meta.to_dict() == stored
  assert meta.rollouts == 4 and meta.seed == 5 and meta.job_description["episodes"] == 32
  assert (meta.completions is not None) == (kind == "text")


def test_an_audits_metadata_from_before_reads():
  """An audit's dataset wrote fewer keys than a job's (no job, no shapley_permutations), and
  an older dataset any subset: every key it lacks takes its default, every key it has keeps
  its value, and keys of other writers are kept."""
  audit = {"env": "key_corridor", "env_name": "tabular", "policy": "tabular",
           "replacement": "policy", "rollouts": 16, "exact": False, "seed": 3, "gamma": 1.0,
           "horizon": 20, "num_actions": 4, "null_action": 0, "success_threshold": 0.0,
           "success_from_return": True, "decorative_tolerance": 0.05, "confidence": 0.95,
           "stratify": True, "tag_names": ["a", "b"], "agent_names": [],
           "klass_names": ["decorative", "load_bearing", "harmful", "undetermined"],
           "partial": True, "audited_steps": 412, "someone_elses": {"x": 1}}  # fmt: skip
  meta = LabelMetadata.from_dict(audit)
  assert meta.partial is True and meta.audited_steps == 412 and meta.job == ""
  assert meta.tag_names == ("a", "b") and meta.shapley_permutations == 0
  assert meta.extra == {"someone_elses": {"x": 1}}
  back = meta.to_dict()
  assert {k: back[k] for k in audit} == audit
  assert LabelMetadata.from_dict({}) == LabelMetadata()
