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
  with os.fdopen(fd, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
