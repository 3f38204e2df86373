"""Benchmark: env steps simulated per second by the JAX labeler vs a NumPy-vectorised twin.

Both implement the same estimator (DESIGN section 1: keep / replace / phi arms sharing
continuation random numbers, K branches per step, paired means and standard errors) on the
same tabular MDP and the same sampled episodes, in the same process. "Env steps" counts only
steps taken inside an episode (a branch that has ended costs nothing in the count, though
both implementations still spend lock-step work on it). The JAX program is compiled and
warmed up first; the best of `--repeats` runs is reported for each.

Then the variance the stratified estimator saves (LabelConfig.stratify; the replace arm
never redraws a_t) at equal K, on the same episodes: the mean squared error of each
estimator's credit against the exact DP credit, and the median per-step ratio of their
squared stderrs, on the benchmark MDP and on the same MDP with a peaked policy (0.96 on one
action per state).

  make bench            # defaults below; prints both rates and the ratio
  python eval/bench_labeler.py --episodes 64 --rollouts 64 --states 64 --actions 4 --horizon 32
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# One XLA CPU device per core, set before JAX starts, as `hindsight label` does.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count() or 1}")

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from hindsight.envs import TabularEnv, random_mdp
from hindsight.envs.tabular import cdf_table, with_peaked_policy
from hindsight.labeling import LabelConfig, Labeler, to_numpy
from hindsight.policies import TabularPolicy


def numpy_label(mdp, traj, num_rollouts: int, seed: int):
  """The labeler's MC estimator in NumPy, vectorised over every branch of every episode.

  Replacement = policy, stratified (a' ~ pi restricted to a' != a_t, credit scaled by
  1 - pi(a_t)). Returns (credit [E, H], credit_stderr [E, H], env_steps).
  """
  rng = np.random.default_rng(seed)
  P_cdf, pi_cdf = cdf_table(mdp.P), cdf_table(mdp.pi)
  r, terminal, H = mdp.r.astype(np.float32), mdp.terminal, mdp.horizon
  s_traj = np.asarray(traj.states.s)[:, :H]  # [E, H] (states[:, H] is the final state)
  a_traj = np.asarray(traj.actions)
  mask = np.asarray(traj.mask)
  E, K = s_traj.shape[0], num_rollouts
  shape = (E, H, K)
  # Branch starts, [E, H, K] per arm; arms: keep, replace (a' ~ pi_-), phi (a'' ~ pi).
  s0 = np.broadcast_to(s_traj[:, :, None], shape).reshape(-1)
  t0 = np.broadcast_to(np.arange(H)[None, :, None], shape).reshape(-1)
  alive0 = np.broadcast_to(mask[:, :, None], shape).reshape(-1)
  keep = np.broadcast_to(a_traj[:, :, None], shape).reshape(-1)
  others = np.where(np.arange(mdp.num_actions) == keep[:, None], 0.0, mdp.pi[s0])
  others_cdf = np.cumsum(others, -1) / others.sum(-1, keepdims=True)
  first = np.stack(
    [
      keep,
      np.minimum((rng.random(keep.shape)[:, None] > others_cdf).sum(1), mdp.num_actions - 1),
      (rng.random(keep.shape)[:, None] > pi_cdf[s0]).sum(1),
    ]
  )  # [3, N]
  n = s0.size
  s = np.broadcast_to(s0, (3, n)).copy()
  t = np.broadcast_to(t0, (3, n)).copy()
  alive = np.broadcast_to(alive0, (3, n)).copy()
  G = np.zeros((3, n), np.float32)
  steps = 0
  for j in range(H):
    u = rng.random((2, n))  # shared by the three arms: common random numbers
    a = first if j == 0 else (u[0][None, :, None] > pi_cdf[s]).sum(-1)
    a = np.minimum(a, mdp.num_actions - 1)
    s_next = np.minimum((u[1][None, :, None] > P_cdf[s, a]).sum(-1), mdp.num_states - 1)
    G += np.where(alive, r[s, a], 0.0)
    steps += int(alive.sum())
    t = t + 1
    done = terminal[s_next] | (t >= H)
    s = np.where(alive, s_next, s)
    alive &= ~done
    if not alive.any():
      break
  d = (G[0] - G[1]).reshape(E, H, K)
  scale = 1.0 - np.take_along_axis(mdp.pi[s_traj], a_traj[..., None], -1)[..., 0]
  credit = scale * d.mean(-1)
  stderr = scale * d.std(-1, ddof=1) / np.sqrt(K)
  return np.where(mask, credit, np.nan), np.where(mask, stderr, np.nan), steps


def best_of(fn, repeats):
  best, out = float("inf"), None
  for _ in range(repeats):
    start = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - start)
  return best, out


def variance_saving(mdp, episodes: int, rollouts: int, seed: int) -> dict[str, float]:
  """MSE against the exact credit, stratified over plain, and the median per-step ratio of
  their squared sample stderrs (over the steps where neither is under the tie bound)."""
  env, policy = TabularEnv(mdp), TabularPolicy(mdp.pi)
  idx = jnp.arange(episodes)

  def label(**config):
    return to_numpy(Labeler(env, policy, LabelConfig(**config)).sample_and_label(seed, idx))

  traj, exact = label(num_rollouts=2, replacement="policy", exact=True)
  m = traj.mask
  out = {}
  for name, stratify in (("stratified", True), ("plain", False)):
    _, lab = label(num_rollouts=rollouts, replacement="policy", stratify=stratify)
    out[name + "_mse"] = float(np.mean((lab["credit"][m] - exact["credit"][m]) ** 2))
    # Steps under the tie bound have no sample variance to compare.
    out[name + "_se2"] = np.where(lab["credit_bounded"][m], 0.0, lab["credit_stderr"][m] ** 2)
  both = (out["stratified_se2"] > 0) & (out["plain_se2"] > 0)
  out["median_se2_ratio"] = float(np.median(out["stratified_se2"][both] / out["plain_se2"][both]))
  out["mse_ratio"] = out["stratified_mse"] / out["plain_mse"]
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--episodes", type=int, default=64)
  p.add_argument("--rollouts", type=int, default=64)
  p.add_argument("--states", type=int, default=64)
  p.add_argument("--actions", type=int, default=4)
  p.add_argument("--horizon", type=int, default=32)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)

  mdp = random_mdp(args.seed, args.states, args.actions, args.horizon, num_terminal=2, branching=4)
  env, policy = TabularEnv(mdp), TabularPolicy(mdp.pi)
  labeler = Labeler(env, policy, LabelConfig(num_rollouts=args.rollouts, replacement="policy"))
  multiple = labeler.chunk_multiple()  # whole micro-batches on every device
  if args.episodes % multiple:
    args.episodes = -(-args.episodes // multiple) * multiple
    print(f"(--episodes rounded up to {args.episodes}, a multiple of {multiple})")
  idx = jnp.arange(args.episodes)
  chunk = labeler.chunk_program(args.episodes)
  # The path labeling jobs take: sharded over devices, micro-batched per device.
  run_chunk = chunk.lower(args.seed, idx).compile()
  branches = args.episodes * args.horizon * args.rollouts * 3
  print(
    f"MDP S={args.states} A={args.actions} H={args.horizon}; {args.episodes} episodes x "
    f"{args.horizon} steps x {args.rollouts} branches x 3 arms = {branches:,} branch rollouts"
  )
  micro = labeler.micro_batch()
  print(f"JAX: {len(jax.devices())} CPU devices (one per core), micro-batch {micro} episodes")

  jax_time, (traj, labels) = best_of(lambda: to_numpy(run_chunk(args.seed, idx)), args.repeats)
  jax_steps = int(labels["rollout_steps"].sum())
  np_traj = traj
  np_time, (credit_np, se_np, np_steps) = best_of(
    lambda: numpy_label(mdp, np_traj, args.rollouts, args.seed), args.repeats
  )

  # Same estimator, independent random numbers: the two estimates must agree within noise.
  # (Only where the JAX stderr is a sample stderr: the twin has no tie bound.)
  m = np_traj.mask
  diff = labels["credit"][m] - credit_np[m]
  se = np.sqrt(labels["credit_stderr"][m] ** 2 + se_np[m] ** 2)
  ok = (se > 0) & ~labels["credit_bounded"][m]
  z_rms = float(np.sqrt(np.mean((diff[ok] / se[ok]) ** 2)))

  jax_rate, np_rate = jax_steps / jax_time, np_steps / np_time
  print(
    f"jax   : {jax_steps:>12,} env steps in {jax_time:7.3f} s = {jax_rate / 1e6:8.2f} M steps/s"
  )
  print(f"numpy : {np_steps:>12,} env steps in {np_time:7.3f} s = {np_rate / 1e6:8.2f} M steps/s")
  print(f"ratio : {jax_rate / np_rate:.1f}x  (target >= 10x)")
  print(f"check : RMS z of (jax - numpy) credit over {ok.sum()} steps = {z_rms:.3f} (expect ~1)")

  print(f"variance at K={args.rollouts}, replacement policy, stratified / plain (same episodes):")
  for name, case in (("bench MDP", mdp), ("peaked pi", with_peaked_policy(mdp, 0.96))):
    v = variance_saving(case, args.episodes, args.rollouts, args.seed)
    print(
      f"  {name:9s}: MSE vs exact {v['stratified_mse']:.2e} / {v['plain_mse']:.2e} = "
      f"{v['mse_ratio']:.3f}; median per-step stderr^2 ratio {v['median_se2_ratio']:.3f}"
    )


if __name__ == "__main__":
  main()
