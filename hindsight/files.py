"""Small file helpers every writer and reader shares: checksums and atomic writes."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w"):
  """A file object whose contents appear at `path` only when the block ends without an
  error: written to a temporary file in the same directory, flushed to disk, renamed. A
  reader (or a killed writer) never sees half a file; a failed block leaves nothing."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make reports private to their writer
  try:
    with os.fdopen(fd, mode) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def atomic_write_text(path: str, text: str) -> None:
  """Writes `text` to `path` atomically (`atomic_open`)."""
  with atomic_open(path) as f:
    f.write(text)


def atomic_savez(path: str, arrays: dict) -> None:
  """np.savez of `arrays` to `path` atomically (`atomic_open`)."""
  import numpy as np

  with atomic_open(path, "wb") as f:
    np.savez(f, **arrays)


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


# Beside a finished report: the digest of everything it was made from (written last).
INPUTS_FILE = "report.inputs"


def finished_report(directory: str, inputs: str) -> dict | None:
  """DIRECTORY/report.json if DIRECTORY/INPUTS_FILE holds `inputs` (a finished run of the
  same inputs), else None. A program that finds it has nothing left to compute."""
  import json

  try:
    with open(os.path.join(directory, INPUTS_FILE)) as f:
      if f.read() != inputs:
        return None
    with open(os.path.join(directory, "report.json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def mark_finished(directory: str, inputs: str) -> None:
  """Records that DIRECTORY's report (and whatever was written before it) is finished and
  made from `inputs`: call it last."""
  atomic_write_text(os.path.join(directory, INPUTS_FILE), inputs)
