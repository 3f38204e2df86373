"""Label examples as serialized `tf.train.Example` records, without TFDS's per-field machinery.

TFDS serializes an example by walking its FeatureConnectors and building a protobuf message
field by field (~0.2 ms per episode of the label datasets). The label features are all flat
(`labels.build_features`: scalars, [T] or [T, d] tensors, fixed-shape tensors, text and
sequences of text), so each one is one `Feature` of a `tf.train.Example`:

  float32                     float_list, packed little-endian floats (the array's bytes)
  int32 / int64 / bool        int64_list, packed varints (two's complement for negatives)
  text / sequence of text     bytes_list, UTF-8

and the record is the protobuf wire encoding of {name: Feature}, written here with NumPy
(`encode_example`): what TFDS's reader (`tfds.data_source`, `features.decode_example_np`)
parses back to the same arrays. `labels.write_dataset` writes these records; a test decodes
these records and TFDS's own serialisation of the same examples and finds them equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# Wire tags, field << 3 | 2 (length delimited). tf.train.Feature's oneof: bytes_list = 1,
# float_list = 2, int64_list = 3.
_BYTES, _FLOAT, _INT64 = b"\x0a", b"\x12", b"\x1a"
# Field 1: Example.features, Features.feature (one map entry), an entry's key, a list's
# packed values, or one value of a BytesList.
_FIELD_1 = b"\x0a"
_ENTRY_VALUE = b"\x12"  # field 2 of a map entry: the Feature


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
  """The protobuf varint of a non-negative int."""
  if n < 0x80:
    return _ONE_BYTE[n]
  out = bytearray()
  while n > 0x7F:
    out.append((n & 0x7F) | 0x80)
    n >>= 7
  out.append(n)
  return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
  return tag + _varint(len(payload)) + payload


_SHIFTS = np.arange(10, dtype=np.uint64) * np.uint64(7)


def varints(values: np.ndarray) -> bytes:
  """The packed varints of int64 values (negatives as their 64-bit two's complement, ten
  bytes each, as protobuf writes int64)."""
  u = np.ascontiguousarray(values, dtype=np.int64).reshape(-1).view(np.uint64)
  if u.size == 0 or u.max() < 0x80:  # every value one byte (actions, classes, flags)
    return u.astype(np.uint8).tobytes()
  groups = (u[:, None] >> _SHIFTS) & np.uint64(0x7F)  # [n, 10], 7 bits each
  n_bytes = np.maximum((u[:, None] >> _SHIFTS != 0).sum(1), 1)
  k = np.arange(10)
  more = (k < (n_bytes - 1)[:, None]).astype(np.uint64) << np.uint64(7)
  return (groups | more)[k < n_bytes[:, None]].astype(np.uint8).tobytes()


def _float_feature(value) -> bytes:
  packed = np.ascontiguousarray(value, dtype="<f4").tobytes()
  return _delimited(_FLOAT, _delimited(_FIELD_1, packed) if packed else b"")


def _int64_feature(value) -> bytes:
  packed = varints(np.asarray(value))
  return _delimited(_INT64, _delimited(_FIELD_1, packed) if packed else b"")


def _bytes_feature(value) -> bytes:
  items = [value] if isinstance(value, str | bytes) else list(value)
  encoded = (v.encode() if isinstance(v, str) else bytes(v) for v in items)
  return _delimited(_BYTES, b"".join(_delimited(_FIELD_1, v) for v in encoded))


Encoder = tuple[str, bytes, Callable[[Any], bytes]]


def feature_encoders(features) -> list[Encoder]:
  """(name, its map entry's serialized key, fn(value) -> the serialized Feature) of every
  feature of a TFDS FeaturesDict of flat features (`labels.build_features`); a nested or
  ragged feature is refused (ValueError)."""
  from tensorflow_datasets.core.utils import flatten_nest_dict

  encoders = []
  for name, info in flatten_nest_dict(features.get_serialized_info()).items():
    dtype = np.dtype(info.np_dtype)
    if info.sequence_rank > 1 or "/" in name:
      raise ValueError(f"feature '{name}' is nested; encode_example writes flat features only")
    if dtype.kind == "O":
      encode = _bytes_feature
    elif dtype.kind == "f":
      encode = _float_feature
    elif dtype.kind in "biu":
      encode = _int64_feature
    else:
      raise ValueError(f"feature '{name}' has dtype {dtype}, which encode_example cannot write")
    encoders.append((name, _delimited(_FIELD_1, name.encode()), encode))
  return encoders


def encode_example(example: dict[str, Any], encoders: list[Encoder]) -> bytes:
  """The serialized `tf.train.Example` of one example (`labels.make_example`'s dict, values
  already of their stored dtypes) from `feature_encoders` of its features: a map entry
  (key, Feature) per feature. Every feature must be present, as TFDS's own writer needs."""
  missing = {name for name, _, _ in encoders} - example.keys()
  if missing:
    raise ValueError(f"the example has no {', '.join(sorted(missing))}")
  parts = []
  for name, key, encode in encoders:
    value = _delimited(_ENTRY_VALUE, encode(example[name]))
    parts += (_FIELD_1, _varint(len(key) + len(value)), key, value)
  return _delimited(_FIELD_1, b"".join(parts))
