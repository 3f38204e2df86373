"""A `Mesh` over all devices (axes `data`, `fsdp`, `tp`) and the shardings that go with it.

Batches are split along their first (episode) axis over `data` and `fsdp` (and repeated over
`tp`); parameters and optimizer state are replicated (fsdp = tp = 1) or split: an array that
names its own axes (a language model's, from Tunix's annotations: `fsdp` and `tp`) is cut
as it says, over the mesh axes that divide it; any other array big enough is cut FSDP-style
along its largest axis that the fsdp size divides. XLA gathers what a layer needs whole.
With several processes (`jax.distributed`), each process builds its rows of every global batch
and `global_batch` assembles the global array without moving data between hosts.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hindsight.errors import HindsightError

AXES = ("data", "fsdp", "tp")
BATCH_AXES = ("data", "fsdp")


def make_mesh(data: int, fsdp: int, devices=None, tp: int = 1) -> Mesh:
  """A (data, fsdp, tp) mesh over `devices` (default: all); data = -1 takes what fsdp and tp
  leave."""
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if fsdp < 1 or tp < 1 or n % (fsdp * tp):
    raise HindsightError(f"mesh fsdp={fsdp} x tp={tp} does not divide the {n} devices")
  data = n // (fsdp * tp) if data == -1 else data
  if data < 1 or data * fsdp * tp != n:
    raise HindsightError(f"mesh data={data} x fsdp={fsdp} x tp={tp} does not match the {n} devices")
  return Mesh(np.asarray(devices, dtype=object).reshape(data, fsdp, tp), AXES)


def devices_for_batch(batch_size: int, devices=None) -> list:
  """All devices, or in a single process the most that split `batch_size` evenly (a 6-core
  CPU host and a batch of 32 trains on 4). With several processes all devices are kept:
  each process needs its own."""
  devices = list(jax.devices() if devices is None else devices)
  if jax.process_count() > 1:
    return devices
  count = len(devices)
  while batch_size % count:
    count -= 1
  return devices[:count]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (episode) axis over the data and fsdp axes (the same rows on every tp device)."""
  return NamedSharding(mesh, P(BATCH_AXES))


def batch_devices(mesh: Mesh) -> int:
  """How many row shards a batch is cut into (data x fsdp)."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def state_shardings(abstract_state, mesh: Mesh, min_fsdp_size: int = 2**14, specs=None):
  """Shardings for a pytree of ShapeDtypeStructs: an array's own PartitionSpec in `specs` (a
  tree of the same structure, `nnx.get_partition_spec`; P() where it names none), its axes
  kept where the mesh has them and they divide the array; else replicated, or FSDP over its
  largest axis divisible by the fsdp size for arrays of at least `min_fsdp_size` elements."""
  fsdp = mesh.shape["fsdp"]

  def named(leaf, spec):
    out = []
    for size, axis in zip(leaf.shape, tuple(spec) + (None,) * (leaf.ndim - len(spec)),
                          strict=True):  # fmt: skip
      axes = axis if isinstance(axis, tuple) else (axis,)
      ok = all(a in mesh.shape and mesh.shape[a] > 1 for a in axes if a is not None)
      width = int(np.prod([mesh.shape[a] for a in axes if a is not None]))
      out.append(axis if axis is not None and ok and size % width == 0 else None)
    return NamedSharding(mesh, P(*out))

  def rule(leaf, spec=None):
    if spec is not None and any(a is not None for a in spec):
      return named(leaf, spec)
    if fsdp == 1 or leaf.size < min_fsdp_size:
      return replicated(mesh)
    axes = [i for i in np.argsort(leaf.shape)[::-1] if leaf.shape[i] % fsdp == 0]
    if not axes:
      return replicated(mesh)
    spec = [None] * len(leaf.shape)
    spec[axes[0]] = "fsdp"
    return NamedSharding(mesh, P(*spec))

  if specs is None:
    return jax.tree.map(rule, abstract_state)
  return jax.tree.map(rule, abstract_state, specs)


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """This process's rows [B / processes, ...] -> global jax.Arrays [B, ...] sharded on `mesh`."""
  sharding = batch_sharding(mesh)
  local_devices = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
  local_devices //= mesh.shape["tp"]  # rows repeat over tp
  for name, x in local_batch.items():
    if x.shape[0] % local_devices:
      raise HindsightError(
        f"batch field {name}: {x.shape[0]} rows per process do not split over "
        f"{local_devices} local devices (make the batch size a multiple of the device count)"
      )
  return {
    name: jax.make_array_from_process_local_data(sharding, x) for name, x in local_batch.items()
  }
