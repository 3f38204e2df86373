"""Random draws that JAX computes slowly on a CPU, computed on the host to the same bits."""

from __future__ import annotations

import jax
import numpy as np


def distinct_integers(key, n: int, count: int) -> np.ndarray:
  """`jax.random.choice(key, n, (count,), replace=False)`, bit for bit: int [count], distinct
  values in [0, n).

  JAX draws it as a permutation of all n values (`jax.random._shuffle`): r rounds, r =
  ceil(3 ln n / ln(2^32 - 1)) (2 at n = 10^6), each a stable sort of the order so far by 32
  fresh random bits per position, split off the key. XLA's sort of 10^6 pairs on a CPU takes
  about a second; here each round sorts the unique 64-bit keys bits << 32 | position on the
  host (NumPy's vectorised sort, ~10 ms), which orders ties by position as a stable sort
  does, and the same bits give the same permutation."""
  n, count = int(n), int(count)
  if not 0 <= count <= n < 2**32:
    raise ValueError(f"distinct_integers: need 0 <= count <= n < 2^32, got count {count}, n {n}")
  rounds = int(np.ceil(3 * np.log(max(1, n)) / np.log(np.iinfo(np.uint32).max)))
  order = np.arange(n, dtype=np.int64)
  position = np.arange(n, dtype=np.uint64)
  for _ in range(rounds):
    key, sub = jax.random.split(key)
    bits = np.asarray(jax.random.bits(sub, (n,), np.uint32)).astype(np.uint64)
    sorted_keys = np.sort((bits << np.uint64(32)) | position)
    order = order[(sorted_keys & np.uint64(0xFFFFFFFF)).astype(np.int64)]
  # JAX's default integer: int32 unless x64 is on.
  return order[:count].astype(jax.dtypes.canonicalize_dtype(np.int64))
