"""RL trainer throughput per credit source, warm, side by side in one run.

  python eval/bench_rl.py [--config configs/rl_reasoning.py] [--sources outcome,learned,mc_credit]
      [--updates 10]

For each source: the compiled update chunk (`hindsight.rl.ppo`) on the config's batch shape
and seeds, timed on its second call (the first compiles), as the policy's env steps per
second (all seeds) and the credit env steps each policy step costs. Ratios are to the first
source. Models a source needs are trained first and not timed.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/rl_reasoning.py")
  p.add_argument("--sources", default="outcome,gae,learned,mc_credit")
  p.add_argument("--updates", type=int, default=10, help="updates per timed chunk")
  args = p.parse_args(argv)
  from hindsight.devices import use_all_cpu_cores

  use_all_cpu_cores()
  import jax
  import numpy as np

  from hindsight.compile_cache import enable_compilation_cache
  from hindsight.config_io import load_config
  from hindsight.rl.ppo import Programs
  from hindsight.rl.sources import prepare
  from hindsight.rl.task import make_task
  from hindsight.rl.trainer import seed_keys

  enable_compilation_cache()
  rows = []
  for name in args.sources.split(","):
    config = load_config(args.config, [f"source={name}", "progress=False"])
    task = make_task(config)
    source = prepare(task, config)
    programs = Programs(source, config)
    n = int(config.num_seeds)
    aux = None
    if source.aux is not None:
      aux = programs.place(jax.tree.map(lambda x, n=n: jax.numpy.stack([x] * n), source.aux))
    ts = programs.place(programs.init(seed_keys(config)))
    ts, m = programs.chunk(ts, aux, args.updates)  # compiles
    jax.block_until_ready(m)
    tic = time.perf_counter()
    ts, m = programs.chunk(ts, aux, args.updates)
    m = jax.device_get(m)
    seconds = time.perf_counter() - tic
    policy = float(np.sum(m["policy_steps"], dtype=np.int64))
    credit = float(np.sum(m["credit_steps"], dtype=np.int64))
    rows.append((name, policy / seconds, credit / max(policy, 1), seconds))
  base = rows[0][1]
  device = f"{jax.device_count()} {jax.devices()[0].platform} device(s)"
  print(
    f"{args.config}: {args.updates} updates x {config.ppo.episodes} episodes x "
    f"{config.num_seeds} seeds, warm, on {device}"
  )
  print(f"{'source':<16}{'policy steps/s':>16}{'ratio':>8}{'credit steps per policy step':>30}")
  for name, rate, per, _ in rows:
    print(f"{name:<16}{rate:>16.4g}{rate / base:>8.2f}{per:>30.4g}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
