"""Every label source honours the seed (`labeling.label_source.LabelSource.label`): the same seed
gives the same labels, built by a fresh source, and another seed other labels, for the JAX
engine, the Python adapters (Gymnasium) and the text labeler (the text world's endpoint)."""

from __future__ import annotations

import numpy as np
import pytest
from tqdm import tqdm

from hindsight.envs.families import family_of
from hindsight.labeling.config import LabelConfig, LabelJob
from hindsight.labeling.source import source_entry
from hindsight.text.options import TextOptions
from hindsight.text.trace import write_traces
from hindsight.worlds import world
from hindsight.worlds.server import running_world

# Fields drawn at random by every source: the credit from branch rollouts, and the episode
# itself where the source samples it (the JAX engine and the adapters; the text labeler
# samples each trace's continuation from the endpoint under the seed).
SAMPLED = ("credit", "credit_stderr")


def _label(job: LabelJob, out_dir, seed: int) -> dict[str, np.ndarray]:
  """Episodes 0..n-1 of `job` at `seed`, by a source built afresh (nothing carried over)."""
  out_dir.mkdir()
  source = source_entry(family_of(job.env)).make(job, str(out_dir))
  return source.label(seed, 0, job.episodes, tqdm(disable=True))


def _assert_seed_honoured(job: LabelJob, tmp_path):
  a = _label(job, tmp_path / "a", seed=3)
  b = _label(job, tmp_path / "b", seed=3)
  c = _label(job, tmp_path / "c", seed=4)
  assert a.keys() == b.keys()
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)
  for name in SAMPLED:
    assert not np.array_equal(a[name], c[name], equal_nan=True), f"{name}: seed ignored"


def test_the_jax_engine_honours_the_seed(tmp_path):
  _assert_seed_honoured(LabelJob("reasoning", 4, LabelConfig(num_rollouts=4)), tmp_path)


def test_the_python_adapters_honour_the_seed(tmp_path):
  # Uniform actions topple the pole within 30 steps: the branches' returns differ.
  job = LabelJob("gymnasium:CartPole-v1", 2, LabelConfig(num_rollouts=3, replacement="uniform"),
                 horizon=30)  # fmt: skip
  _assert_seed_honoured(job, tmp_path)


@pytest.mark.parametrize("tools", [False, True], ids=["text", "agent"])
def test_the_text_labeler_honours_the_seed(tmp_path, tools):
  """On traces whose steps are given (a trace sampled under the seed would differ by itself):
  only the branch pools can follow the seed, for text and for agent traces (tools run)."""
  from hindsight.worlds import tool_world

  traces = tool_world.sample_traces(0, 3) if tools else world.sample_traces(0, 3)
  path = tmp_path / "traces.jsonl"
  write_traces(str(path), traces)
  with running_world(tools=tools) as url:
    if tools:
      options = TextOptions(endpoint=url, model=tool_world.MODEL_NAME, tools="tool-world",
                            verifier="env")  # fmt: skip
    else:
      options = TextOptions(endpoint=url, model=world.MODEL_NAME)
    job = LabelJob(f"text:{path}", 3, LabelConfig(num_rollouts=4), options=options)
    _assert_seed_honoured(job, tmp_path)


@pytest.mark.parametrize("env", ["reasoning", "gymnasium:CartPole-v1"])
def test_labels_do_not_depend_on_the_chunk(env, tmp_path):
  """Episodes 2..3 labeled alone equal the same episodes labeled with 0..1 before them."""
  job = LabelJob(env, 4, LabelConfig(num_rollouts=3), horizon=10 if ":" in env else None)
  source = source_entry(family_of(env)).make(job, str(tmp_path))
  whole, part = source.label(5, 0, 4, tqdm(disable=True)), source.label(5, 2, 4, tqdm(disable=True))
  for name, value in part.items():
    if name == "episode":
      np.testing.assert_array_equal(value, [2, 3])
    else:
      np.testing.assert_array_equal(value, whole[name][2:4], err_msg=name)
