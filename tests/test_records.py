"""The label dataset's own record writer against TFDS's: the same examples read back."""

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.proto import tf_feature_pb2

from hindsight.credit.fields import STEP_FIELDS
from hindsight.data import labels as label_io
from hindsight.data.metadata import LabelMetadata
from hindsight.data.records import encode_example, feature_encoders, varints


def test_varints_are_protobufs_own_int64_encoding():
  values = [0, 1, 127, 128, 300, 2**31, 2**63 - 1, -1, -(2**63), -300]
  for chunk in (values, [0, 5, 127], []):
    want = tf_feature_pb2.Int64List(value=chunk).SerializeToString()
    packed = varints(np.array(chunk, np.int64))
    assert (b"\x0a" + bytes([len(packed)]) + packed if packed else b"") == want


def _features():
  """Every option of `build_features`: vector observations, states, three agents with their
  coalitions, a partial audit's `labeled` flag, and text."""
  return label_io.build_features(
    (3,), np.float32, with_states=True, num_agents=3, partial=True, texts=True
  )


def _example(rng, i: int) -> dict:
  T = int(rng.integers(1, 9))
  fields = {name: rng.normal(size=T).astype(np.float32) for name in STEP_FIELDS}
  fields.update({name: rng.normal(size=T) for name in label_io.AUX_STEP_FIELDS})
  fields["credit"][0] = np.nan  # an undefined step's credit
  fields.update(
    episode=i * 1_000_003,  # past one varint byte
    length=T,
    success=bool(i % 2),
    actions=rng.integers(0, 5, T),
    rewards=rng.normal(size=T),
    observations=rng.normal(size=(T, 3)).astype(np.float32),
    states=rng.integers(-2, 300, T),  # negative and multi-byte varints
    tags=[f"tag{j}" for j in rng.integers(0, 3, T)],
    klass=rng.integers(0, 4, T),
    undefined=rng.random(T) < 0.2,
    credit_bounded=rng.random(T) < 0.5,
    agent=rng.integers(0, 3, T),
    labeled=rng.random(T) < 0.5,
    agent_shapley=rng.normal(size=3),
    agent_shapley_stderr=rng.random(3),
    agent_interaction=rng.normal(size=(3, 3)),
    agent_interaction_stderr=rng.random((3, 3)),
    coalition_values=rng.normal(size=8),
    coalition_stderr=rng.random(8),
    prompt="What is 2 + 2? \u00e9",
    trace_id=f"trace-{i}",
    step_text=[f"step {j}: \u2211" for j in range(T)],
  )
  fields["return"] = np.float32(fields["rewards"].sum())
  return label_io.make_example(fields)


def _assert_same(got: dict, want: dict) -> None:
  assert got.keys() == want.keys()
  for name in want:
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)
    assert np.asarray(got[name]).dtype == np.asarray(want[name]).dtype, name


def test_records_decode_as_tfds_own_serialisation_does():
  features = _features()
  encoders = feature_encoders(features)
  rng = np.random.default_rng(0)
  for i in range(20):
    example = _example(rng, i)
    theirs = features.serialize_example(features.encode_example(example))
    mine = encode_example(example, encoders)
    _assert_same(features.deserialize_example_np(mine), features.deserialize_example_np(theirs))
  with pytest.raises(ValueError, match="has no credit"):
    encode_example({k: v for k, v in example.items() if k != "credit"}, encoders)


def test_written_dataset_reads_back_through_plain_tfds_in_order(tmp_path):
  features = _features()
  rng = np.random.default_rng(1)
  examples = [_example(rng, i) for i in range(12)]
  metadata = LabelMetadata(env="test", horizon=8)
  path = label_io.write_dataset(str(tmp_path), features, metadata, iter(examples))
  assert path == label_io.dataset_dir(str(tmp_path)) and label_io.is_complete(str(tmp_path))
  builder = tfds.builder_from_directory(path)
  source = builder.as_data_source(split="train")
  assert len(source) == 12 and dict(builder.info.metadata) == metadata.to_dict()
  for i, example in enumerate(examples):
    want = features.deserialize_example_np(
      features.serialize_example(features.encode_example(example))
    )
    _assert_same(source[i], want)
  assert len(label_io.open_labels(str(tmp_path))) == 12  # checksums verified


def test_an_interrupted_write_leaves_no_dataset_that_looks_finished(tmp_path):
  features = _features()
  rng = np.random.default_rng(2)

  def examples():
    yield _example(rng, 0)
    raise KeyboardInterrupt  # the job killed mid-write

  with pytest.raises(KeyboardInterrupt):
    label_io.write_dataset(str(tmp_path), features, LabelMetadata(), examples())
  assert not label_io.is_complete(str(tmp_path))
  assert not (tmp_path / "hindsight_labels" / "1.0.0").exists()
  # The next write replaces the leftover and finishes.
  label_io.write_dataset(str(tmp_path), features, LabelMetadata(), iter([_example(rng, 1)]))
  assert label_io.is_complete(str(tmp_path))
  assert [p.name for p in (tmp_path / "hindsight_labels").iterdir()] == ["1.0.0"]
