"""Benchmark: credit-model training steps per second and steps scored per second.

Uses the model and optimizer of a config (the same jitted programs as `hindsight.training`,
`hindsight.model.programs`) on random batches shaped like that config's data: the DataSpec
of a finished run's model (the step it scored) when `--workdir` is given, else a
reasoning-shaped spec (float obs [7], 10 actions, 20 steps).
Programs are compiled and warmed up first; the best of `--repeats` timings is reported.
Achieved FLOP/s = XLA's FLOP count of the compiled program (`cost_analysis`, one device's
program under SPMD, times the devices) x calls per second; with `--peak-tflops` (one
device's peak for the dtype in use) also the model FLOP utilisation (MFU) over all devices,
so an accelerator run has a number to report; in bf16 on a known accelerator the peak is its
dense bf16 peak (`model.programs.peak_bf16_tflops`) unless given.

  make bench
  python eval/bench_model.py --config configs/reasoning.py --workdir runs/demo
  python eval/bench_model.py --set model.compute_dtype=bfloat16 --score-batch 4096  # bf16
"""

from __future__ import annotations

import argparse
import json
import os
import time

# One XLA CPU device per core, set before JAX starts, as `hindsight label` and training do.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count() or 1}")

import jax
import numpy as np
from flax import nnx

from hindsight.config_io import load_config
from hindsight.model.encoders import DiscreteEncoder, VectorEncoder
from hindsight.model.predictor import Predictor
from hindsight.model.programs import peak_bf16_tflops, program_flops, train_programs
from hindsight.model.sharding import devices_for_batch, global_batch, make_mesh
from hindsight.model.spec import DataSpec


def random_batch(spec: DataSpec, batch: int, length: int, rng: np.random.Generator) -> dict:
  enc = spec.encoder
  if isinstance(enc, VectorEncoder):
    obs = rng.normal(size=(batch, length, enc.dim)).astype(np.float32)
  elif isinstance(enc, DiscreteEncoder):
    obs = rng.integers(0, enc.num_ids, (batch, length)).astype(np.int32)
  else:
    raise SystemExit(f"bench_model times models of discrete or vector observations, not {enc.kind}")
  lengths = rng.integers(length // 2, length + 1, batch)
  mask = np.arange(length)[None] < lengths[:, None]
  return {
    "observations": obs,
    "actions": rng.integers(0, spec.num_actions, (batch, length)).astype(np.int32),
    "rewards": rng.random((batch, length)).astype(np.float32),
    "credit": rng.normal(size=(batch, length)).astype(np.float32),
    "credit_stderr": np.full((batch, length), 0.05, np.float32),
    "progress": rng.random((batch, length)).astype(np.float32),
    "klass": rng.integers(0, spec.num_classes, (batch, length)).astype(np.int32),
    "mask": mask,
    "label_mask": mask,
    "success": rng.random(batch).astype(np.float32),
  }


def _best_rate(fn, count: int, repeats: int) -> float:
  best = float("inf")
  for _ in range(repeats):
    tic = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - tic)
  return count / best


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/reasoning.py")
  p.add_argument("--workdir", default="", help="a finished run: use its model's DataSpec")
  p.add_argument("--score-batch", type=int, default=512, help="episodes per forward pass")
  p.add_argument("--steps", type=int, default=50, help="train steps per timing")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument(
    "--peak-tflops", type=float, default=0.0,
    help="one device's peak TFLOP/s: report MFU (default: a known accelerator's bf16 peak)",
  )  # fmt: skip
  p.add_argument(
    "--set", action="append", default=[], metavar="KEY=VALUE",
    help="a config override, e.g. model.compute_dtype=bfloat16 (repeatable)",
  )  # fmt: skip
  args = p.parse_args()

  config = load_config(args.config, args.set)
  # The known peaks are bf16's: a float32 run reports MFU only against a peak it is given.
  bf16 = str(config.model.get("compute_dtype", "")) == "bfloat16"
  peak = args.peak_tflops or (peak_bf16_tflops() if bf16 else None) or 0.0
  if args.workdir:
    spec = Predictor.load(args.workdir).spec
  else:
    spec = DataSpec(VectorEncoder(7, (0.0,) * 7, (1.0,) * 7), 10, 20, 4, 1.0)
  length = spec.max_length
  mesh = make_mesh(-1, 1, devices_for_batch(config.data.batch_size))
  count = mesh.size
  programs = train_programs(config, spec, mesh)
  state = programs.init(jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = global_batch(random_batch(spec, config.data.batch_size, length, rng), mesh)
  key = jax.random.key(1)

  def train():
    nonlocal state
    for i in range(args.steps):
      state, metrics = programs.train_step(state, batch, jax.random.fold_in(key, i))
    jax.block_until_ready(metrics)

  graphdef = programs.graphdef

  @jax.jit
  def score(state, batch):
    return nnx.merge(graphdef, state)["model"](batch)["mu"]

  big = global_batch(
    random_batch(spec, args.score_batch - args.score_batch % count, length, rng), mesh
  )
  train()  # compile + warm up
  jax.block_until_ready(score(state, big))
  train_rate = _best_rate(train, args.steps, args.repeats)
  real_steps = int(np.asarray(big["mask"]).sum())
  score_rate = _best_rate(
    lambda: jax.block_until_ready(score(state, big)), real_steps, args.repeats
  )
  train_flops = program_flops(programs.train_step, state, batch, key)
  score_flops = program_flops(score, state, big)
  model = nnx.merge(graphdef, state)["model"]
  params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  result = {
    "backend": jax.default_backend(),
    "device": str(jax.devices()[0].device_kind),
    "compute_dtype": str(config.model.get("compute_dtype", "")) or "float32",
    "devices": count,
    "model_params": int(params),
    "spec": {"obs": spec.encoder.describe(), "actions": spec.num_actions, "T": length},
    "train_batch_episodes": config.data.batch_size,
    "train_steps_per_s": round(train_rate, 1),
    "train_env_steps_per_s": round(train_rate * int(np.asarray(batch["mask"]).sum()), 0),
    "scored_env_steps_per_s": round(score_rate, 0),
  }
  rates = {"train": (train_flops, train_rate), "score": (score_flops, score_rate / real_steps)}
  for name, (flops, calls_per_s) in rates.items():
    if flops is None:
      continue
    achieved = flops * count * calls_per_s
    result[f"{name}_gflops_per_call"] = round(flops * count / 1e9, 4)
    result[f"{name}_achieved_tflops"] = round(achieved / 1e12, 4)
    if peak > 0:
      result[f"{name}_mfu"] = round(achieved / (peak * count * 1e12), 5)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
