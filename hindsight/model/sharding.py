"""A `Mesh` over all devices (axes `data`, `fsdp`) and the shardings that go with it.

Batches are split along their first (episode) axis over both axes; parameters and optimizer
state are replicated (fsdp = 1) or split FSDP-style: each array big enough is cut along its
largest axis that the fsdp size divides, and XLA gathers it where a layer needs it whole.
With several processes (`jax.distributed`), each process builds its rows of every global batch
and `global_batch` assembles the global array without moving data between hosts.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hindsight.errors import HindsightError

AXES = ("data", "fsdp")


def make_mesh(data: int, fsdp: int, devices=None) -> Mesh:
  """A (data, fsdp) mesh over `devices` (default: all); data = -1 takes what fsdp leaves."""
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if fsdp < 1 or n % fsdp:
    raise HindsightError(f"mesh fsdp={fsdp} does not divide the {n} devices")
  data = n // fsdp if data == -1 else data
  if data < 1 or data * fsdp != n:
    raise HindsightError(f"mesh data={data} x fsdp={fsdp} does not match the {n} devices")
  return Mesh(np.asarray(devices, dtype=object).reshape(data, fsdp), AXES)


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
  """Leading (episode) axis over every device of the mesh."""
  return NamedSharding(mesh, P(AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def state_shardings(abstract_state, mesh: Mesh, min_fsdp_size: int = 2**14):
  """Shardings for a pytree of ShapeDtypeStructs: replicated, or FSDP over its largest axis
  divisible by the fsdp size for arrays of at least `min_fsdp_size` elements."""
  fsdp = mesh.shape["fsdp"]

  def rule(leaf):
    if fsdp == 1 or leaf.size < min_fsdp_size:
      return replicated(mesh)
    axes = [i for i in np.argsort(leaf.shape)[::-1] if leaf.shape[i] % fsdp == 0]
    if not axes:
      return replicated(mesh)
    spec = [None] * len(leaf.shape)
    spec[axes[0]] = "fsdp"
    return NamedSharding(mesh, P(*spec))

  return jax.tree.map(rule, abstract_state)


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """This process's rows [B / processes, ...] -> global jax.Arrays [B, ...] sharded on `mesh`."""
  sharding = batch_sharding(mesh)
  local_devices = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
  for name, x in local_batch.items():
    if x.shape[0] % local_devices:
      raise HindsightError(
        f"batch field {name}: {x.shape[0]} rows per process do not split over "
        f"{local_devices} local devices (make the batch size a multiple of the device count)"
      )
  return {
    name: jax.make_array_from_process_local_data(sharding, x) for name, x in local_batch.items()
  }
