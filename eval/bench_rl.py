"""RL trainer throughput per credit source, warm, side by side in one run.

  python eval/bench_rl.py [--config configs/rl_reasoning.py] [--sources outcome,credit_cv,...]
      [--updates 10] [--config.FIELD=VALUE ...] [--rejax-python PYTHON]

For each source: the compiled update chunk (`hindsight.rl.ppo`) on the config's batch shape
and seeds, timed on its second call (the first compiles), as the policy's env steps per
second (all seeds), updates per second, and the credit env steps each policy step costs.
Ratios are to the first source. Models a source needs are trained first and not timed.

With --rejax-python (a Python that has rejax; rejax 0.1.3 needs gymnax 0.0.9, which the
project does not pin), `eval/rejax_reference.py` runs rejax's PPO on the same gymnax
environment in that Python, 16 envs x 128 steps, 4 epochs x 4 minibatches, and its env
steps per second print beside the first source's:

  python eval/bench_rl.py --config configs/rl_cartpole.py --sources outcome \
      --config.horizon=128 --config.num_seeds=4 --config.ppo.epochs=4 \
      --config.ppo.minibatches=4 --rejax-python /path/to/rejax-env/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", default="configs/rl_reasoning.py")
  p.add_argument("--sources", default="outcome,gae,learned,credit_cv,shaped,mc_credit,pp_credit")
  p.add_argument("--updates", type=int, default=10, help="updates per timed chunk")
  p.add_argument("--rejax-python", default="", help="a Python with rejax: its PPO beside")
  args, rest = p.parse_known_args(argv)
  from hindsight.cli.options import config_overrides

  overrides = config_overrides(rest, "bench_rl")
  if overrides is None:
    return 2
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
    config = load_config(args.config, [*overrides, f"source={name}", "progress=False"])
    task = make_task(config)
    source = prepare(task, config)
    programs = Programs(source, config)
    n = int(config.num_seeds)
    aux = None
    if source.aux is not None:
      aux = programs.place(jax.tree.map(lambda x, n=n: jax.numpy.stack([x] * n), source.aux))
    keys = seed_keys(config)
    ts = programs.place(programs.init(keys))
    ts, m = programs.chunk(ts, aux, args.updates)  # compiles
    jax.block_until_ready(m)
    tic = time.perf_counter()
    ts, m = programs.chunk(ts, aux, args.updates)
    m = jax.device_get(m)
    seconds = time.perf_counter() - tic
    # What the source does between chunks with the chunk's records (pp_credit's refit on the
    # labels it bought) is part of its updates' cost: timed too, for every seed, warm.
    record = m.pop("record")
    if record:

      def between(i, record=record, aux=aux, ts=ts, keys=keys, source=source, config=config):
        a, params, r = jax.tree.map(lambda x: x[i], (aux, ts.params, record))
        source.between_chunks(a, params, keys[i], int(config.eval.every), seed=i, record=r)

      between(0)  # compiles the refit's programs
      tic = time.perf_counter()
      for i in range(n):
        between(i)
      seconds += time.perf_counter() - tic
    policy = float(np.sum(m["policy_steps"], dtype=np.int64))
    credit = float(np.sum(m["credit_steps"], dtype=np.int64))
    rows.append((name, policy / seconds, credit / max(policy, 1), args.updates / seconds))
  base = rows[0][1]
  device = f"{jax.device_count()} {jax.devices()[0].platform} device(s)"
  print(
    f"{args.config}: {args.updates} updates x {config.ppo.episodes} episodes x "
    f"{config.num_seeds} seeds, warm, on {device}"
  )
  # Every update computes on E x H padded steps whatever the episodes' lengths, so updates/s
  # compares sources whose policies run episodes of different lengths; env steps/s is what
  # a fixed env-step budget buys.
  print(f"{'source':<16}{'policy steps/s':>16}{'ratio':>8}{'updates/s':>11}{'ratio':>8}"
        f"{'credit steps per policy step':>30}")  # fmt: skip
  for name, rate, per, ups in rows:
    print(f"{name:<16}{rate:>16.4g}{rate / base:>8.2f}{ups:>11.3g}{ups / rows[0][3]:>8.2f}"
          f"{per:>30.4g}")  # fmt: skip
  ups = {name: u for name, _, _, u in rows}
  if "outcome" in ups and "mc_credit" in ups:
    print(f"goal: mc_credit at {ups['mc_credit'] / ups['outcome']:.2f}x the outcome trainer's "
          "updates/s (goal >= 0.3x)")  # fmt: skip
  if "outcome" in ups and "pp_credit" in ups:
    print(f"goal: pp_credit (pp.rho {config.pp.rho:g}) at "
          f"{ups['pp_credit'] / ups['outcome']:.2f}x the outcome trainer's updates/s, its "
          "between-chunk refit included (goal >= 0.5x)")  # fmt: skip
  if args.rejax_python:
    env_id = config.env.partition(":")[2]
    cmd = [args.rejax_python, os.path.join(os.path.dirname(__file__), "rejax_reference.py"),
           "--env", env_id, "--seeds", str(config.num_seeds)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
      print(f"rejax: failed ({proc.stderr.strip().splitlines()[-1:]})")
      return 1
    ref = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
      f"{'rejax PPO':<16}{ref['steps_per_second']:>16.4g}"
      f"{ref['steps_per_second'] / base:>8.2f}   (16 envs x 128 steps, 200k steps per seed, "
      f"final eval return {ref['final_return']:.1f}); {rows[0][0]} at "
      f"{base / ref['steps_per_second']:.2f}x rejax"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())
