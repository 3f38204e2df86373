"""Small file helpers every writer and reader shares: checksums and atomic writes."""

from __future__ import annotations

import hashlib
import os
import tempfile


def sha256_file(path: str) -> str:
  """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def atomic_write_text(path: str, text: str) -> None:
  """Writes `text` to `path` through a temporary file in the same directory and a rename,
  flushed to disk first: a reader (or a killed writer) never sees half a file."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make reports private to their writer
  with os.fdopen(fd, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def json_safe(x):
  """NaN and inf (a correlation of a constant prediction) become null, NumPy scalars and
  arrays plain Python: the result is strict JSON."""
  import numpy as np

  if isinstance(x, dict):
    return {str(k): json_safe(v) for k, v in x.items()}
  if isinstance(x, list | tuple):
    return [json_safe(v) for v in x]
  if isinstance(x, np.ndarray):
    return json_safe(x.tolist())
  if isinstance(x, bool | np.bool_):
    return bool(x)
  if isinstance(x, int | np.integer):
    return int(x)
  if isinstance(x, float | np.floating):
    return float(x) if np.isfinite(x) else None
  return x


def write_json(path: str, obj) -> None:
  """`obj` as indented strict JSON (see json_safe), written atomically."""
  import json

  atomic_write_text(path, json.dumps(json_safe(obj), indent=1, sort_keys=True, allow_nan=False))
