"""How a chunk of episodes is spread over devices and calls: micro-batches, the device mesh,
and back-to-back dispatch of one compiled unit program.

Labels are a function of (seed, episode index) only; what this module decides is which
episodes share a call. Keeping that a function of the configuration alone (never of the
chunk size) is what makes labels bitwise identical for any chunk size: every episode runs
through the same compiled program at the same position (XLA may round a*b+c differently in
differently shaped programs).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np

from hindsight.labeling.xla import jit

# Target number of branch rollouts in one micro-batch: larger blocks of work per call keep
# both devices busy between the calls of a chunk.
LANES_PER_MICRO_BATCH = 131072
MAX_MICRO_BATCH = 16


def micro_batch_size(rollouts_per_episode: int) -> int:
  """Episodes labeled together on one device: about LANES_PER_MICRO_BATCH branch rollouts
  in one work queue, a power of two, at most MAX_MICRO_BATCH.

  rollouts_per_episode = H K n_arms, the branches one episode starts.
  """
  micro = min(MAX_MICRO_BATCH, max(1, LANES_PER_MICRO_BATCH // rollouts_per_episode))
  return 1 << (micro.bit_length() - 1)


def sharded_over_local_devices(fn: Callable, n_shared: int, n_split: int) -> Callable:
  """fn(*shared [n_shared], *per_episode [n_split]) jitted over a 1-D `data` mesh of the
  local devices: shared arguments replicated, per-episode ones (and every output) split on
  their leading axis."""
  return jit(shard_over_local_devices(fn, n_shared, n_split))


def _local_mesh() -> jax.sharding.Mesh:
  """The 1-D `data` mesh of this process's devices."""
  return jax.sharding.Mesh(np.array(jax.local_devices()), ("data",))


def local_mesh_shardings(n_shared: int, n_split: int):
  """(in_shardings, out_sharding) of `shard_over_local_devices`'s arguments and outputs, as
  NamedShardings of its mesh (for `jax.jit` and `jax.export`)."""
  mesh = _local_mesh()
  P, named = jax.sharding.PartitionSpec, jax.sharding.NamedSharding
  split = named(mesh, P("data"))
  return (named(mesh, P()),) * n_shared + (split,) * n_split, split


def shard_over_local_devices(fn: Callable, n_shared: int, n_split: int) -> Callable:
  """`sharded_over_local_devices` before the jit: the shard_map alone."""
  spec = jax.sharding.PartitionSpec("data")
  return jax.shard_map(
    fn,
    mesh=_local_mesh(),
    in_specs=(jax.sharding.PartitionSpec(),) * n_shared + (spec,) * n_split,
    out_specs=spec,
    # Episodes never communicate; skipping the varying-axis checks keeps the scans of the
    # environment code free of pcast annotations.
    check_vma=False,
  )


def in_blocks(unit: Callable, chunk_size: int, block: int, n_shared: int) -> Callable:
  """fn(*shared, *per_episode) over a chunk: per-episode arguments (leading axis chunk_size)
  cut into blocks of `block`, each run by `unit`; outputs concatenated as NumPy.

  The calls are dispatched back to back (asynchronously) and gathered at the end.
  """
  if chunk_size % block:
    raise ValueError(f"chunk_size {chunk_size} is not a multiple of {block}")

  def run(*args):
    shared, per_episode = args[:n_shared], args[n_shared:]
    outs = [
      unit(*shared, *jax.tree.map(lambda x, lo=lo: x[lo : lo + block], per_episode))
      for lo in range(0, chunk_size, block)
    ]
    return jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *outs)

  return run
