"""JAX's persistent compilation cache: a second run of the same shapes skips XLA.

On by default for the `hindsight` CLI and the training program (`enable_compilation_cache`
is called before their first compilation). Programs compiled once, by any command, are
stored under

  $HINDSIGHT_COMPILATION_CACHE          when set ("" / "0" / "off": no cache), else
  $XDG_CACHE_HOME/hindsight/jax         (default ~/.cache/hindsight/jax)

and loaded, not recompiled, by every later process on this machine with the same jax,
jaxlib and XLA flags (the cache key covers them, so a stale entry is never used). Beside
them, in `programs/`, `hindsight label` keeps its traced and lowered unit programs
(`labeling.stored`, keyed by the package's source, the versions, the environment and the
config). Delete the directory to clear both.
"""

from __future__ import annotations

import os

ENV_VAR = "HINDSIGHT_COMPILATION_CACHE"
_OFF = ("", "0", "off", "false", "no")

# Programs that compile faster than this are not worth a file (and a read) each.
_MIN_COMPILE_SECONDS = 0.1


def cache_dir() -> str | None:
  """Where compiled programs are kept (None: the cache is off)."""
  value = os.environ.get(ENV_VAR)
  if value is not None:
    return None if value.strip().lower() in _OFF else os.path.expanduser(value)
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "hindsight", "jax")


def program_dir() -> str | None:
  """Where `labeling.stored` keeps exported programs (None: the cache is off)."""
  path = cache_dir()
  return None if path is None else os.path.join(path, "programs")


def enable_compilation_cache() -> str | None:
  """Turns the persistent cache on for this process (see the module docstring); its
  directory, or None when it is off. A directory that cannot be created turns it off."""
  path = cache_dir()
  if path is None:
    return None
  try:
    os.makedirs(path, exist_ok=True)
  except OSError:
    return None  # a read-only home: run uncached rather than fail
  import jax

  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_COMPILE_SECONDS)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
