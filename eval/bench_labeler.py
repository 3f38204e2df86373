"""Benchmark: the labeler's start-up and its env steps per second against a NumPy twin.

1. Start-up, each in a fresh process: a small `hindsight label` job cold (an empty
   persistent compilation cache) and warm (the cache a first run filled, with and without
   its stored unit program), beside python + jax's own start and `hindsight --help`.
2. Steady state on a tabular job (default: S=16, A=4, H=40, one terminal state, K=64,
   `uniform` replacement): the compiled JAX program against a NumPy twin of the same
   estimator (keep / replace / phi arms sharing continuation random numbers, K branches per
   step, stratified paired means and standard errors) on the same episodes, in the same
   process. The twin is a good NumPy labeler: every branch of a chunk in lock-step, one
   vectorised step per time index, the ended branches compacted away after each step.
   "Env steps" count only steps inside an episode. Best of `--repeats` each.
3. Env steps per second of the JAX labeler on `reasoning` and `key_to_door`, and on gymnax's
   CartPole-v1 against the Gymnasium adapter's CartPole-v1 (deepcopy branches).
4. The variance the stratified estimator saves (LabelConfig.stratify; the replace arm never
   redraws a_t) at equal K, on the same episodes: the mean squared error of each
   estimator's credit against the exact DP credit, and the median per-step ratio of their
   squared stderrs, on a random MDP (S=64, A=4, H=32) and on it with a peaked policy (0.96 on
   one action per state).

  make bench                                   # defaults below
  python eval/bench_labeler.py --episodes 1536 --states 16 --horizon 40 --rollouts 64
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

# One XLA CPU device per core, set before JAX starts, as `hindsight label` does.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count() or 1}")

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.envs import TabularEnv, make, random_mdp
from hindsight.envs.tabular import cdf_table, with_peaked_policy
from hindsight.labeling import LabelConfig, Labeler, to_numpy
from hindsight.labeling.trajectories import sample_and_label
from hindsight.policies import TabularPolicy


def numpy_label(mdp, traj, num_rollouts: int, seed: int, chunk: int = 64, compact=True):
  """The labeler's MC estimator in NumPy, lock-step over every branch of a chunk of episodes.

  Replacement = the uniform distribution over a' != a_t, stratified (credit scaled by
  1 - 1/A), as `--replacement uniform`. Every branch of `chunk` episodes, all three arms
  (keep, replace, phi), advances one vectorised step per time index; the branches still
  alive are compacted after each step (boolean indexing), so work follows the useful env
  steps (`compact=False`: they stay, masked, until every branch has ended). The arms of a
  branch share each step's two uniforms (common random numbers), drawn for all branches of
  the chunk at once. Returns (credit [E, H], credit_stderr [E, H], env_steps).
  """
  rng = np.random.default_rng(seed)
  S, A, H = mdp.num_states, mdp.num_actions, mdp.horizon
  P_cdf = cdf_table(mdp.P).reshape(S * A, S)  # row s * A + a
  pi_cdf = cdf_table(mdp.pi)
  r, terminal = mdp.r.astype(np.float32).reshape(-1), mdp.terminal
  s_all = np.asarray(traj.states.s)[:, :H]  # [E, H] (states[:, H] is the final state)
  a_all, mask_all = np.asarray(traj.actions), np.asarray(traj.mask)
  E, K = s_all.shape[0], num_rollouts
  credit = np.full((E, H), np.nan, np.float32)
  stderr = np.full((E, H), np.nan, np.float32)
  steps = 0
  for lo in range(0, E, chunk):
    s_ep, a_ep, m_ep = s_all[lo : lo + chunk], a_all[lo : lo + chunk], mask_all[lo : lo + chunk]
    e_idx, t_idx = np.nonzero(m_ep)  # the steps that happened
    n = e_idx.size * K  # branches (each with three arms)
    s0 = np.repeat(s_ep[e_idx, t_idx], K)
    t0 = np.repeat(t_idx, K).astype(np.int32)
    keep = np.repeat(a_ep[e_idx, t_idx], K)
    # Uniform over a' != a_t: draw from A - 1 actions and skip a_t.
    other = rng.integers(0, A - 1, n)
    other += other >= keep
    phi = (rng.random(n)[:, None] > pi_cdf[s0]).sum(1)
    first = np.concatenate([keep, other, np.minimum(phi, A - 1)])
    lane = np.arange(3 * n)  # arm * n + branch
    s = np.tile(s0, 3)
    t = np.tile(t0, 3)
    G = np.zeros(3 * n, np.float32)
    running = np.ones(3 * n, bool)
    a = first
    while lane.size:
      u = rng.random((2, n), np.float32)[:, lane % n]  # one pair per branch, shared by arms
      if a is None:
        a = np.minimum((u[0][:, None] > pi_cdf[s]).sum(1), A - 1)
      row = s * A + a
      s_next = np.minimum((u[1][:, None] > P_cdf[row]).sum(1), S - 1)
      G[lane] += r[row]
      steps += lane.size
      t += 1
      alive = ~(terminal[s_next] | (t >= H))
      if compact:
        lane, s, t, a = lane[alive], s_next[alive], t[alive], None
      else:  # every lane steps until the last has ended; the ended ones add nothing
        steps -= lane.size - int(running.sum())
        G[lane] -= np.where(running, 0.0, r[row])
        running &= alive
        s, a = s_next, None
        if not running.any():
          break
    d = (G[:n] - G[n : 2 * n]).reshape(-1, K)
    scale = 1.0 - 1.0 / A
    credit[lo + e_idx, t_idx] = scale * d.mean(-1)
    stderr[lo + e_idx, t_idx] = scale * d.std(-1, ddof=1) / np.sqrt(K)
  return credit, stderr, steps


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


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


def _tabular_labeler(args) -> Labeler:
  mdp = random_mdp(
    args.seed, args.states, args.actions, args.horizon, num_terminal=args.terminal, branching=4
  )
  config = LabelConfig(num_rollouts=args.rollouts, replacement="uniform")
  return Labeler(TabularEnv(mdp), TabularPolicy(mdp.pi), config)


def _seconds(cmd: list[str], env: dict) -> float:
  start = time.perf_counter()
  subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
  return time.perf_counter() - start


def cli_startup(repeats: int) -> dict[str, float]:
  """Seconds of small `hindsight` commands, each in a fresh process (median of `repeats`):

  python_jax   python, import jax, one jnp op (the floor every command pays);
  help         `hindsight --help`;
  cold         `hindsight label --env tabular:M.npz --episodes 10 --rollouts 16` (S=12, A=4,
               H=30) with an empty compilation cache;
  warm_traced  the same with the compiled program cached but the stored unit program
               (`labeling.stored`) removed first: traced and lowered again;
  warm         the same on the cache a first run filled: nothing traced, nothing compiled.
  """
  median = lambda xs: float(np.median(xs))  # noqa: E731
  hindsight = [sys.executable, "-m", "hindsight.cli"]
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    mdp = os.path.join(tmp, "M.npz")
    random_mdp(0, num_states=12, num_actions=4, horizon=30).save(mdp)
    jax_op = "import jax, jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
    out["python_jax"] = median(
      [_seconds([sys.executable, "-c", jax_op], os.environ) for _ in range(repeats)]
    )
    out["help"] = median([_seconds([*hindsight, "--help"], os.environ) for _ in range(repeats)])

    def label(cache: str, run: str) -> tuple[list[str], dict]:
      """The command and environment of one run writing --out run with cache `cache`."""
      env = dict(os.environ, HINDSIGHT_COMPILATION_CACHE=cache)
      cmd = [*hindsight, "label", "--env", f"tabular:{mdp}", "--episodes", "10", "--rollouts",
             "16", "--out", os.path.join(tmp, run), "--no-progress"]  # fmt: skip
      return cmd, env

    out["cold"] = median(
      [_seconds(*label(os.path.join(tmp, f"cold{i}"), f"cold{i}")) for i in range(repeats)]
    )
    cache = os.path.join(tmp, "cold0")
    traced = []
    for i in range(repeats):
      shutil.rmtree(os.path.join(cache, "programs"), ignore_errors=True)
      traced.append(_seconds(*label(cache, f"traced{i}")))
    out["warm_traced"] = median(traced)
    stored = _stored_files(cache)
    out["warm"] = median([_seconds(*label(cache, f"warm{i}")) for i in range(repeats)])
    # A warm run loads the stored program: it rewrites none (each export writes its file).
    after = _stored_files(cache)
    out["stored"], out["rewritten"] = len(stored), sum(after[k] != v for k, v in stored.items())
    out["rewritten"] += len(set(after) - set(stored))
  return out


def _stored_files(cache: str) -> dict[str, int]:
  """{file: mtime_ns} of the stored unit programs in a compilation cache."""
  root = os.path.join(cache, "programs")
  names = os.listdir(root) if os.path.isdir(root) else []
  return {n: os.stat(os.path.join(root, n)).st_mtime_ns for n in names}


def end_to_end(args, labeler: Labeler) -> dict[str, float]:
  """`hindsight label` on the steady-state job (labeler's MDP) with `--episodes
  args.e2e_episodes`, in its own process on a warm cache (every field, the dataset written),
  against the compacting NumPy twin's credit on the same episodes (in this process;
  sampling not counted)."""
  mdp, n = labeler.env.mdp, args.e2e_episodes
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "M.npz")
    mdp.save(path)
    cmd = [sys.executable, "-m", "hindsight.cli", "label", "--env", f"tabular:{path}",
           "--episodes", str(n), "--rollouts", str(args.rollouts), "--replacement", "uniform",
           "--seed", str(args.seed), "--no-progress", "--out"]  # fmt: skip
    _seconds([*cmd, os.path.join(tmp, "warmup")], os.environ)  # fills the caches
    runs = range(args.repeats)
    cli = min(_seconds([*cmd, os.path.join(tmp, f"run{i}")], os.environ) for i in runs)
  traj, _ = sample_and_label(labeler, args.seed, n, progress=False)
  twin, _ = best_of(lambda: numpy_label(mdp, traj, args.rollouts, args.seed), args.repeats)
  return {"cli_s": cli, "numpy_s": twin}


def time_labeling(labeler: Labeler, episodes: int, seed: int, repeats: int):
  """(seconds, (Trajectory, labels)) of sampling and labeling episodes 0..N-1 as a job does
  (`labeling.trajectories.sample_and_label`: the chunk program; compiled and warmed up
  first, best of `repeats`)."""
  run = lambda n: sample_and_label(labeler, seed, n, progress=False)  # noqa: E731
  run(labeler.chunk_multiple())  # compile, warm up
  return best_of(lambda: run(episodes), repeats)


def cartpole(args) -> None:
  """CartPole-v1 two ways: gymnax inside the jitted labeler, and the Gymnasium adapter
  (deepcopy branches, one process), uniform policy, K=8, H=100 (same estimator)."""
  try:
    import gymnasium  # noqa: F401
    import gymnax  # noqa: F401
  except ImportError:
    print("CartPole-v1: skipped (needs gymnax and gymnasium: pip install -e .[adapters])")
    return
  from hindsight.envs.gymnax_env import make_gymnax
  from hindsight.labeling.py_labeler import PyJob, label_episodes

  config = LabelConfig(num_rollouts=8, replacement="uniform")
  env, policy = make_gymnax("gymnax:CartPole-v1", horizon=100)
  labeler = Labeler(env, policy, config)
  n = _round_up(args.env_episodes, labeler.chunk_multiple())
  seconds, (_, lab) = time_labeling(labeler, n, args.seed, args.repeats)
  fast = int(lab["rollout_steps"].sum()) / seconds
  job = PyJob("gymnasium:CartPole-v1", None, 100, config, args.seed)
  episodes = max(1, args.env_episodes // 64)
  start = time.perf_counter()
  slow = int(label_episodes(job, range(episodes))["rollout_steps"].sum())
  slow /= time.perf_counter() - start
  print(
    f"CartPole-v1 (uniform policy, K=8, H=100): gymnax in the labeler {fast / 1e6:.2f} M "
    f"steps/s ({n} episodes), Gymnasium adapter {slow / 1e3:.1f} k steps/s ({episodes} "
    f"episodes): {fast / slow:.0f}x"
  )


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--episodes", type=int, default=512)
  p.add_argument("--rollouts", type=int, default=64)
  p.add_argument("--states", type=int, default=16)
  p.add_argument("--actions", type=int, default=4)
  p.add_argument("--horizon", type=int, default=40)
  p.add_argument("--terminal", type=int, default=1, help="terminal states of the MDP")
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--env-episodes", type=int, default=256, help="episodes of the other envs")
  p.add_argument("--e2e-episodes", type=int, default=1500, help="episodes of the end-to-end job")
  p.add_argument("--startup-repeats", type=int, default=3, help="fresh processes per figure")
  p.add_argument(
    "--quick", action="store_true", help="the JAX labeler's env steps/s only (device_check.sh)"
  )
  args = p.parse_args(argv)

  labeler = _tabular_labeler(args)
  multiple = labeler.chunk_multiple()  # whole micro-batches on every device
  if args.episodes % multiple:
    args.episodes = _round_up(args.episodes, multiple)
    print(f"(--episodes rounded up to {args.episodes}: whole blocks of {multiple} episodes)")
  mdp = labeler.env.mdp
  print(
    f"tabular MDP S={args.states} A={args.actions} H={args.horizon} "
    f"({args.terminal} terminal), K={args.rollouts}, uniform replacement; "
    f"{args.episodes} episodes; {len(jax.devices())} {jax.default_backend()} devices, micro-batch "
    f"{labeler.micro_batch()} episodes"
  )

  if args.quick:
    seconds, (_, lab) = time_labeling(labeler, args.episodes, args.seed, args.repeats)
    steps = int(lab["rollout_steps"].sum())
    print(f"labeler ({jax.default_backend()}, {jax.devices()[0].device_kind}): {steps:,} env "
          f"steps in {seconds:.3f} s = {steps / seconds / 1e6:.2f} M env steps/s")  # fmt: skip
    return

  t = cli_startup(args.startup_repeats)
  floor = t["python_jax"]
  print(
    f"start-up, fresh processes, median of {args.startup_repeats} (hindsight label --env "
    "tabular:M.npz --episodes 10 --rollouts 16; S=12 A=4 H=30):"
  )
  print(f"  python + import jax + one op : {floor:5.2f} s")
  print(f"  hindsight --help             : {t['help']:5.2f} s")
  for name, what in (
    ("cold", "empty compilation cache"),
    ("warm_traced", "compiled program cached, unit program traced"),
    ("warm", "compiled and stored programs cached"),
  ):
    print(f"  label, {what:45s}: {t[name]:5.2f} s = {t[name] / floor:.1f}x python + jax")
  how = "loaded" if t["stored"] and not t["rewritten"] else "traced again"
  print(f"  warm runs: {t['rewritten']} of {t['stored']} stored programs rewritten ({how})")

  jax_time, (traj, labels) = time_labeling(labeler, args.episodes, args.seed, args.repeats)
  jax_steps = int(labels["rollout_steps"].sum())
  np_time, (credit_np, se_np, np_steps) = best_of(
    lambda: numpy_label(mdp, traj, args.rollouts, args.seed), args.repeats
  )
  lock_time, (_, _, lock_steps) = best_of(
    lambda: numpy_label(mdp, traj, args.rollouts, args.seed, compact=False), args.repeats
  )

  # Same estimator, independent random numbers: the two estimates must agree within noise.
  # (Only where the JAX stderr is a sample stderr: the twin has no tie bound.)
  m = traj.mask
  diff = labels["credit"][m] - credit_np[m]
  se = np.sqrt(labels["credit_stderr"][m] ** 2 + se_np[m] ** 2)
  ok = (se > 0) & ~labels["credit_bounded"][m]
  z_rms = float(np.sqrt(np.mean((diff[ok] / se[ok]) ** 2)))

  jax_rate, np_rate = jax_steps / jax_time, np_steps / np_time
  print(f"steady state (compiled, best of {args.repeats}):")
  print(f"  jax   : {jax_steps:>12,} env steps in {jax_time:7.3f} s = {jax_rate / 1e6:7.2f} M/s")
  print(f"  numpy : {np_steps:>12,} env steps in {np_time:7.3f} s = {np_rate / 1e6:7.2f} M/s")
  lock_rate = lock_steps / lock_time
  print(
    f"  numpy, no compaction: {lock_steps:>12,} env steps in {lock_time:7.3f} s = "
    f"{lock_rate / 1e6:7.2f} M/s"
  )
  print(
    f"  ratio : {jax_rate / np_rate:.1f}x the compacting twin, {jax_rate / lock_rate:.1f}x the "
    "lock-step one without compaction"
  )
  print(f"  check : RMS z of (jax - numpy) credit over {ok.sum()} steps = {z_rms:.3f} (expect ~1)")
  e2e = end_to_end(args, labeler)
  print(
    f"end to end, {args.e2e_episodes} episodes: hindsight label (own process, warm cache, every "
    f"field, dataset written) {e2e['cli_s']:.2f} s; compacting numpy twin (credit only) "
    f"{e2e['numpy_s']:.2f} s: {e2e['numpy_s'] / e2e['cli_s']:.2f}x"
  )
  print(
    f"goals: steady state {jax_rate / np_rate:.1f}x the compacting twin (goal >= 10x); end to "
    f"end {e2e['numpy_s'] / e2e['cli_s']:.2f}x its credit-only time (goal >= 3x)"
  )

  print(f"other environments (JAX, K={args.rollouts}, policy replacement, steady state):")
  for spec in ("reasoning", "key_to_door"):
    env, policy = make(spec)
    other = Labeler(env, policy, LabelConfig(num_rollouts=args.rollouts))
    n = _round_up(args.env_episodes, other.chunk_multiple())
    seconds, (_, lab) = time_labeling(other, n, args.seed, args.repeats)
    steps = int(lab["rollout_steps"].sum())
    print(
      f"  {spec:11s}: {steps:>12,} env steps in {seconds:7.3f} s = {steps / seconds / 1e6:7.2f} "
      f"M/s ({n} episodes, H={env.horizon})"
    )

  cartpole(args)

  variance_mdp = random_mdp(args.seed, 64, 4, 32, num_terminal=2, branching=4)
  print(f"variance at K={args.rollouts}, replacement policy, stratified / plain (same episodes):")
  for name, case in (
    ("S=64 MDP", variance_mdp),
    ("peaked pi", with_peaked_policy(variance_mdp, 0.96)),
  ):
    v = variance_saving(case, 64, args.rollouts, args.seed)
    print(
      f"  {name:9s}: MSE vs exact {v['stratified_mse']:.2e} / {v['plain_mse']:.2e} = "
      f"{v['mse_ratio']:.3f}; median per-step stderr^2 ratio {v['median_se2_ratio']:.3f}"
    )


if __name__ == "__main__":
  main()
