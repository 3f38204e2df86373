"""Labeling for stateful Python environments (Gymnasium, dm_env): the same estimator as the
JAX engine (keep / replace / phi arms, K branches per step, common random numbers), with
branches restored by deepcopy or replay, run over a process pool.

Random numbers: episode e's root is the key data of `episode_key(seed, e)` (the JAX key of
the JAX engine); every draw comes from a NumPy generator seeded with (root, stream, t, k),
so labels do not depend on the number of workers or on chunking. The three arms of branch
(t, k) get the same continuation generator and an identical copy of the environment (whose
own random state deepcopy carries along): common random numbers.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.credit.estimators import z_value
from hindsight.credit.fields import continuation_totals, step_fields
from hindsight.envs.adapters import PyEnv, load_policy, make_py_env
from hindsight.errors import HindsightError
from hindsight.labeling.engine import LabelConfig, episode_key

TRAJ, REPLACE, PHI, CONTINUE = range(4)  # random streams
_REJECTION_TRIES = 64  # policy_other: draws before calling q undefined


@dataclasses.dataclass(frozen=True)
class PyJob:
  """What a worker needs to label one episode (picklable)."""

  env: str
  policy: str | None
  horizon: int | None
  config: LabelConfig
  seed: int
  success_threshold: float = 0.0


def episode_root(seed: int, episode: int) -> list[int]:
  return [int(x) for x in np.asarray(jax.random.key_data(episode_key(seed, episode)))]


def _rng(root, *path) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([*root, *path]))


def replay(env: PyEnv, reset_seed: int, actions) -> tuple[PyEnv, list[np.ndarray]]:
  """Fresh environment, reset, replay `actions`; returns it and the observations seen."""
  fresh = make_py_env(env.spec, env.horizon)
  observations = [fresh.reset(reset_seed)]
  for a in actions:
    observations.append(fresh.step(a)[0])
  return fresh, observations


def _roll_discounted(env, first, policy, rng, gamma):
  """G of `first` then the policy until the episode ends, and the steps taken."""
  ret, steps, action, discount = 0.0, 0, first, 1.0
  while True:
    obs, reward, done = env.step(action)
    ret += discount * reward
    discount *= gamma
    steps += 1
    if done:
      return ret, steps
    action = policy(obs, rng)


def _replacement(kind, policy, obs, a_t, rng, num_actions):
  """a' ~ q(. | s_t, a_t), or None where q is undefined."""
  if kind == "policy":
    return int(policy(obs, rng))
  if kind == "uniform":
    return int(rng.integers(num_actions))
  if kind == "policy_other":
    # Rejection sampling draws exactly from pi restricted to a' != a_t, renormalised.
    for _ in range(_REJECTION_TRIES):
      a = int(policy(obs, rng))
      if a != a_t:
        return a
    return None
  raise HindsightError(f"replacement '{kind}' is not available for Gymnasium/dm_env adapters")


_CACHE: dict = {}


def label_episode(job: PyJob, episode: int) -> dict[str, np.ndarray]:
  """All label fields of one episode, padded to the horizon H (same layout as the JAX job)."""
  key = (job.env, job.policy, job.horizon)
  if key not in _CACHE:
    env = make_py_env(job.env, job.horizon)
    _CACHE[key] = (env, load_policy(job.policy, env.num_actions))
  template, policy = _CACHE[key]
  cfg, H, A = job.config, template.horizon, template.num_actions
  K = cfg.num_rollouts
  root = episode_root(job.seed, episode)
  reset_seed = root[0]

  env = make_py_env(job.env, job.horizon)
  obs = env.reset(reset_seed)
  traj_rng = _rng(root, TRAJ)
  snapshots, observations, actions, rewards = [], [], [], []
  for _ in range(H):
    snapshots.append(env.clone())
    a = int(policy(obs, traj_rng))
    if not 0 <= a < A:
      raise HindsightError(f"--policy returned action {a}, outside [0, {A})")
    observations.append(obs)
    obs, r, done = env.step(a)
    actions.append(a)
    rewards.append(r)
    if done:
      break
  T = len(actions)

  def restore(t):
    snap = snapshots[t]
    if snap is not None:
      clone = snap.clone()
      if clone is not None:
        return clone
    return replay(env, reset_seed, actions[:t])[0]

  G = np.zeros((H, K, 3), np.float32)
  undefined = np.zeros(H, bool)
  env_steps = 0
  for t in range(T):
    for k in range(K):
      a_rep = _replacement(
        cfg.replacement, policy, observations[t], actions[t], _rng(root, REPLACE, t, k), A
      )
      if a_rep is None:
        undefined[t] = True
        a_rep = actions[t]
      a_phi = int(policy(observations[t], _rng(root, PHI, t, k)))
      for arm, first in enumerate((actions[t], a_rep, a_phi)):
        ret, n = _roll_discounted(restore(t), first, policy, _rng(root, CONTINUE, t, k), cfg.gamma)
        G[t, k, arm] = ret
        env_steps += n

  r = np.zeros(H, np.float32)
  r[:T] = rewards
  mask = np.arange(H) < T
  success = np.asarray(continuation_totals(jnp.asarray(G[..., -1]), r, cfg.gamma)) > (
    job.success_threshold
  )
  fields = step_fields(
    jnp.asarray(G),
    jnp.asarray(r),
    jnp.asarray(mask),
    jnp.asarray(success),
    jnp.asarray(undefined),
    gamma=cfg.gamma,
    tolerance=cfg.decorative_tolerance,
    z=z_value(cfg.confidence),
  )
  out = {k: np.asarray(v) for k, v in fields.items()}
  out["success"] = np.asarray(out["return"] > job.success_threshold)
  obs_dim = observations[0].size
  obs_arr = np.zeros((H, obs_dim), np.float32)
  obs_arr[:T] = np.stack(observations)
  act = np.zeros(H, np.int32)
  act[:T] = actions
  out.update(
    actions=act,
    rewards=r,
    mask=mask,
    observations=obs_arr,
    tags=act.copy(),
    rollout_steps=np.int64(env_steps),
    episode=np.int64(episode),
  )
  return out


def label_episodes(
  job: PyJob, episodes: range, workers: int = 1, on_episode=None
) -> dict[str, np.ndarray]:
  """Labels `episodes` (in order) on `workers` processes; arrays stacked [n, H, ...].

  on_episode(): called as each episode finishes (in order), for progress bars.
  """
  results = []
  if workers <= 1:
    stream = (label_episode(job, e) for e in episodes)
    pool = None
  else:
    ctx = multiprocessing.get_context("spawn")  # JAX and fork do not mix
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx)
    stream = pool.map(label_episode, [job] * len(episodes), episodes)
  try:
    for result in stream:
      results.append(result)
      if on_episode is not None:
        on_episode()
  finally:
    if pool is not None:
      pool.shutdown(cancel_futures=True)
  return {k: np.stack([r[k] for r in results]) for k in results[0]}
