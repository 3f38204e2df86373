"""rejax's PPO on a gymnax environment, warm: the RL benchmark's outside reference.

  PYTHON_WITH_REJAX eval/rejax_reference.py [--env CartPole-v1] [--seeds 4]

Runs in an environment that has rejax (rejax 0.1.3 needs gymnax 0.0.9, which the project
does not pin, so `eval/bench_rl.py --rejax-python PATH` calls this file with that Python).
Prints one JSON line: env steps per second over all seeds (the second call of the jitted,
seed-vmapped `PPO.train`; the first compiles) and the final evaluation return.
"""

import argparse
import json
import time

import jax
import numpy as np
import rejax

p = argparse.ArgumentParser()
p.add_argument("--env", default="CartPole-v1")
p.add_argument("--seeds", type=int, default=4)
p.add_argument("--num-envs", type=int, default=16)
p.add_argument("--num-steps", type=int, default=128)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--minibatches", type=int, default=4)
p.add_argument("--timesteps", type=int, default=200_000)
a = p.parse_args()
algo = rejax.PPO.create(
  env=a.env,
  num_envs=a.num_envs,
  num_steps=a.num_steps,
  num_epochs=a.epochs,
  num_minibatches=a.minibatches,
  total_timesteps=a.timesteps,
  eval_freq=a.timesteps,
)
train = jax.jit(jax.vmap(rejax.PPO.train, in_axes=(None, 0)))
keys = jax.random.split(jax.random.key(0), a.seeds)
jax.block_until_ready(train(algo, keys))
tic = time.perf_counter()
_, (_, returns) = jax.block_until_ready(train(algo, keys))
seconds = time.perf_counter() - tic
final = float(np.asarray(returns)[:, -1].mean())
rate = a.seeds * a.timesteps / seconds
print(json.dumps({"steps_per_second": rate, "final_return": final, "seconds": seconds}))
