"""The labeling job's unit program kept between processes as a `jax.export` artifact, so a
warm `hindsight label` neither traces nor lowers it.

JAX's persistent compilation cache skips XLA's compile, but its key is the lowered module,
so every process still traces and lowers the program first: about a second for the tabular
job of eval/bench_labeler.py, more than the rest of a small job. An exported program is the
lowered module itself; loaded, it is only wrapped in a call and compiled (a hit in the
persistent cache).

A stored program may only be reused when it is the program this process would trace. The
key (`program_key`) is a SHA-256 of everything the trace reads:

  - the source of the whole `hindsight` package (any change to any module is a new key);
  - the installed versions of the packages whose code a trace runs or bakes in (jax, jaxlib,
    flax, numpy, ml_dtypes, and scipy, whose z_value and tie-bound constants are traced in),
    the backend, the local devices, XLA_FLAGS, and every jax config option but those that
    only place caches, logs and dumps (so any JAX_* setting that can change a trace);
  - the environment, the policy, their parameters and the label config, by value: every
    attribute, array bytes included, and classes by qualified name (`fingerprint`);
  - the arguments' shapes and dtypes.

Objects that cannot be fingerprinted by value (a class or a function from outside
`hindsight`, whose source the key does not cover: gymnax environments, `--policy
MODULE:FN`) are never stored: their program is traced every time, as without this module.
A stored file that does not load is traced again and replaced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import os
import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from hindsight.files import atomic_open
from hindsight.labeling.xla import jit

_SUFFIX = ".jaxexport"
# Every jax config option is keyed (any may change what a trace produces, and JAX_* variables
# set them) but those that only say where caches, logs and dumps go or how errors print.
_UNKEYED_OPTIONS = (
  "jax_compilation_cache",
  "jax_enable_compilation_cache",
  "jax_persistent_cache",
  "jax_raise_persistent_cache_errors",
  "jax_explain_cache_misses",
  "jax_log",
  "jax_debug_log_modules",
  "jax_compiler_detailed_logging",
  "jax_dump_ir",
  "jax_include_debug_info_in_dumps",
  "jax_include_full_tracebacks",
  "jax_traceback",
  "jax_tracer_error",
  "jax_source_url_schema",
  "jax_pprint_use_color",
  "jax_hlo_source_file_canonicalization",
)
# Packages whose code a labeling trace runs or bakes in (scipy: z_value and the tie-bound
# constants), by installed version.
_TRACED_PACKAGES = ("jax", "jaxlib", "flax", "numpy", "scipy", "ml_dtypes")


def traced_options() -> dict[str, str]:
  """The jax config options a stored program is keyed by (`_UNKEYED_OPTIONS` aside)."""
  values = jax.config.values
  return {k: str(values[k]) for k in sorted(values) if not k.startswith(_UNKEYED_OPTIONS)}


def traced_versions() -> dict[str, str]:
  """The installed versions of `_TRACED_PACKAGES` (no import)."""
  from importlib.metadata import PackageNotFoundError, version

  out = {}
  for name in _TRACED_PACKAGES:
    try:
      out[name] = version(name)
    except PackageNotFoundError:
      out[name] = ""
  return out


class Unfingerprintable(Exception):
  """An object whose value the key cannot cover (its code lives outside `hindsight`)."""


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
  """SHA-256 of every .py file of the `hindsight` package (relative path and bytes)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  h = hashlib.sha256()
  for folder, dirs, files in os.walk(root):
    dirs.sort()
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(folder, name)
      h.update(os.path.relpath(path, root).encode() + b"\0")
      with open(path, "rb") as f:
        h.update(f.read())
  return h.hexdigest()


def _ours(module: str) -> bool:
  """Whether `module` is in the package (so its source is in `package_digest`)."""
  return module == "hindsight" or module.startswith("hindsight.")


def _update(h, obj: Any, depth: int = 0) -> None:
  """Feeds obj's value into h; raises Unfingerprintable where it cannot."""
  if depth > 32:
    raise Unfingerprintable("nested too deep")
  kind = type(obj)
  h.update(f"<{kind.__module__}.{kind.__qualname__}>".encode())
  if obj is None or isinstance(obj, bool | int | float | complex | str | bytes):
    h.update(repr(obj).encode())
  elif isinstance(obj, enum.Enum):
    h.update(repr(obj.value).encode())
  elif isinstance(obj, np.ndarray | np.generic | jax.Array):
    if isinstance(obj, jax.Array) and jax.dtypes.issubdtype(obj.dtype, jax.dtypes.prng_key):
      obj = jax.random.key_data(obj)
    a = np.asarray(obj)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
  elif isinstance(obj, list | tuple):
    h.update(str(len(obj)).encode())
    for x in obj:
      _update(h, x, depth + 1)
  elif isinstance(obj, dict):
    items = sorted(obj.items(), key=lambda kv: repr(kv[0]))
    h.update(str(len(items)).encode())
    for k, v in items:
      _update(h, k, depth + 1)
      _update(h, v, depth + 1)
  elif isinstance(obj, functools.partial):
    _update(h, (obj.func, obj.args, obj.keywords), depth + 1)
  elif callable(obj) and hasattr(obj, "__qualname__") and not isinstance(obj, type):
    # A function is its name: its code is in the package digest, if it is ours. Closures
    # carry values the name does not say.
    module = getattr(obj, "__module__", "") or ""
    if not _ours(module):
      raise Unfingerprintable(f"function {module}.{obj.__qualname__}")
    if getattr(obj, "__closure__", None) or "<locals>" in obj.__qualname__:
      raise Unfingerprintable(f"closure {obj.__qualname__}")
    h.update(f"{module}.{obj.__qualname__}".encode())
    if getattr(obj, "__self__", None) is not None:  # a bound method: its object's value too
      _update(h, obj.__self__, depth + 1)
  elif isinstance(obj, type):
    # A class is its qualified name (its source is in the package digest, if it is ours).
    if not _ours(obj.__module__) or "<locals>" in obj.__qualname__:
      raise Unfingerprintable(f"class {obj.__module__}.{obj.__qualname__}")
    h.update(f"{obj.__module__}.{obj.__qualname__}".encode())
  elif _ours(kind.__module__) and (dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__")):
    fields = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    if dataclasses.is_dataclass(obj):
      fields.update({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    _update(h, fields, depth + 1)
  else:
    raise Unfingerprintable(f"{kind.__module__}.{kind.__qualname__}")


def fingerprint(obj: Any) -> str:
  """SHA-256 of obj's value: scalars, strings, arrays (dtype, shape, bytes), containers, and
  objects of `hindsight` classes attribute by attribute. Raises Unfingerprintable for
  anything else."""
  h = hashlib.sha256()
  _update(h, obj)
  return h.hexdigest()


def program_key(what: str, parts: Any, avals: Sequence[jax.ShapeDtypeStruct]) -> str | None:
  """The key of a stored program (see the module docstring), or None when `parts` (the
  environment, policy, parameters and config) cannot be fingerprinted by value."""
  try:
    value = fingerprint(parts)
  except Unfingerprintable:
    return None
  devices = [(d.platform, d.device_kind) for d in jax.local_devices()]
  context = {
    "what": what,
    "package": package_digest(),
    "versions": traced_versions(),
    "python": sys.version_info[:2],
    "backend": jax.default_backend(),
    "devices": devices,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
    "options": traced_options(),
    "avals": [(str(a.dtype), tuple(a.shape)) for a in avals],
    "value": value,
  }
  return fingerprint(repr(context))


def _pack(exported, tree) -> bytes:
  tree_bytes = pickle.dumps(tree)
  return struct.pack("<Q", len(tree_bytes)) + tree_bytes + bytes(exported.serialize())


def _unpack(data: bytes):
  (n,) = struct.unpack_from("<Q", data)
  tree = pickle.loads(data[8 : 8 + n])  # our own cache directory, written by _pack
  return jax.export.deserialize(bytearray(data[8 + n :])), tree


def stored_program(
  fn: Callable,
  avals: Sequence[jax.ShapeDtypeStruct],
  in_shardings: Sequence[jax.sharding.NamedSharding],
  out_sharding: jax.sharding.NamedSharding,
  path: str,
) -> tuple[Callable, str]:
  """fn (not jitted; outputs split like out_sharding) as a compiled program read from
  `path` if it holds one, else exported there. Returns (program, "loaded" | "exported").

  Both ways run the same exported module, so a cold and a warm process give the same bits.
  The program is jitted with the labeling programs' compiler options.
  """
  mesh = out_sharding.mesh
  exported = tree = None
  if os.path.exists(path):
    try:
      with open(path, "rb") as f:
        exported, tree = _unpack(f.read())
      if exported.nr_devices != mesh.size or len(exported.in_avals) != len(avals):
        exported = None
    except Exception:  # a damaged or foreign file: trace again and replace it
      exported = None
  how = "loaded"
  if exported is None:
    box = {}

    def flat(*args):
      leaves, box["tree"] = jax.tree.flatten(fn(*args))
      return tuple(leaves)

    traced = jax.jit(flat, in_shardings=tuple(in_shardings), out_shardings=out_sharding)
    exported, how = jax.export.export(traced)(*avals), "exported"
    tree = box["tree"]
    # A read-only cache: this process still runs the exported program.
    with contextlib.suppress(OSError):
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with atomic_open(path, "wb") as f:
        f.write(_pack(exported, tree))
  in_shardings = exported.in_shardings_jax(mesh)
  call = jit(
    exported.call, in_shardings=in_shardings, out_shardings=exported.out_shardings_jax(mesh)
  )

  def program(*args):
    # Placed first: under jax.distributed, jit refuses host arrays with a split sharding
    # (the mesh is this process's devices alone, so every shard is addressable here).
    placed = [jax.device_put(x, sh) for x, sh in zip(args, in_shardings, strict=True)]
    return jax.tree.unflatten(tree, call(*placed))

  return program, how


def program_path(directory: str, key: str) -> str:
  return os.path.join(directory, key + _SUFFIX)
