"""How the labeling programs are compiled: XLA options and the CPU lowering of Threefry.

Both change compile time only, never a bit of the labels (tests/test_startup.py checks the
Threefry lowering bitwise; every label field of the bundled environments was compared).
"""

from __future__ import annotations

import jax


def unroll_threefry_on_cpu() -> None:
  """Lowers JAX's Threefry-2x32 on CPU as JAX does on accelerators: the 20 rounds as
  straight-line code, not JAX's CPU default of a 5-step while loop at every call site.

  The same bits (the same uint32 arithmetic), in less compile time: the `jax.random` keys of
  the episode sampler and the branch starts are 11 call sites of the labeling program of
  eval/bench_labeler.py, which (with `rollout.hash_words` unrolled too) compiled in
  1.48-1.52 s instead of 1.79-1.90 s on 2 cores, at the same steady state. Process-wide and
  idempotent; it reaches into JAX's lowering registry, so on a JAX without it nothing
  changes but the compile time.
  """
  global _THREEFRY_UNROLLED
  if _THREEFRY_UNROLLED:
    return
  try:
    from jax._src.interpreters import mlir
    from jax._src.random import threefry2x32 as threefry

    mlir.register_lowering(
      threefry.threefry2x32_p, threefry._threefry2x32_lowering_rule, platform="cpu", inline=False
    )
  except (ImportError, AttributeError, TypeError):
    pass
  _THREEFRY_UNROLLED = True


_THREEFRY_UNROLLED = False


def compiler_options() -> dict | None:
  """XLA options of the labeling programs. On CPU the classic elemental fusion emitters:
  with the newer MLIR fusion emitters the tabular job of eval/bench_labeler.py compiled in
  2.1-2.3 s on 2 cores, with the classic ones in 1.4 s, and ran as fast."""
  return {"xla_cpu_use_fusion_emitters": False} if jax.default_backend() == "cpu" else None


def jit(fn, **kwargs):
  """`jax.jit` with the labeling programs' compiler options."""
  return jax.jit(fn, compiler_options=compiler_options(), **kwargs)
