"""Labeling for stateful Python environments (Gymnasium, dm_env): the same estimator as the
JAX engine (keep / replace / phi arms, K branches per step, common random numbers), with
branches restored by deepcopy or replay, run over a process pool.

Random numbers: episode e's root is the key data of `episode_key(seed, e)` (the JAX key of
the JAX engine); every draw comes from a NumPy generator seeded with (root, stream, t, k),
so labels do not depend on the number of workers or on chunking. The three arms of branch
(t, k) get the same continuation generator and an identical copy of the environment whose
own random state is reseeded from (root, t, k) (`PyEnv.reseed`): common random numbers
within a branch, independent noise across branches. (Without the reseed every branch of a
step replayed the same environment noise: on slippery FrozenLake the labels' z-scores
against the DP had RMS 2.2.)

Stratification (LabelConfig.stratify) needs q(a_t), which is known here only when q is
uniform: the `uniform` replacement, or `policy` under the default uniform policy. A
`--policy MODULE:FN` is a black box, so `policy` then draws a' ~ pi as it is (unstratified),
and only the tie bound guards its ties.

Return range for the tie bound: `--return-range LO:HI` (PyJob.return_range) when given;
otherwise the range of every branch return of the episode, which is only what the data show
(infinite when nothing in the episode varied: such ties get an infinite stderr).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import multiprocessing

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.credit.estimators import tie_upper_rates, z_value
from hindsight.credit.fields import continuation_totals, step_fields
from hindsight.credit.replacement import check_replacement
from hindsight.envs.adapters import PyEnv, python_policy
from hindsight.envs.families import make_py_env
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig, LabelJob
from hindsight.labeling.engine import episode_key
from hindsight.labeling.label_source import SourceInfo

TRAJ, REPLACE, PHI, CONTINUE, ENV_NOISE = range(5)  # random streams
log = logging.getLogger(__name__)
_WARNED_NO_RESEED: set[str] = set()
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
  return_range: tuple[float, float] | None = None


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


def _uniform_q(job: PyJob) -> bool:
  """q is uniform over the actions: `uniform`, or `policy` under the default uniform policy."""
  return job.config.replacement == "uniform" or (
    job.config.replacement == "policy" and not job.policy
  )


def _replacement(kind, policy, obs, a_t, rng, num_actions, stratified):
  """a' ~ q(. | s_t, a_t) (q uniform and `stratified`: a' != a_t), or None where undefined."""
  if stratified:
    a = int(rng.integers(num_actions - 1))
    return a + (a >= a_t)
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
    _CACHE[key] = (env, python_policy(job.policy, env.num_actions))
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
      raise HindsightError(f"policy returned action {a}, outside [0, {A})")
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
    fresh, seen = replay(env, reset_seed, actions[:t])
    for i, (got, want) in enumerate(zip(seen, observations[: t + 1], strict=True)):
      if got.shape != want.shape or not np.array_equal(got, want):
        raise HindsightError(
          f"env {job.env}: episode {episode} cannot be branched at step {t}: replaying it "
          f"(deepcopy failed) diverged from the recording at step {i}, so the environment is "
          "not deterministic under reset(seed)"
        )
    return fresh

  G = np.zeros((H, K, 3), np.float32)
  undefined = np.zeros(H, bool)
  stratified = cfg.stratify and _uniform_q(job) and A > 1
  keep_share = np.full(H, 1.0 / A if stratified else 0.0, np.float32)
  env_steps = 0
  for t in range(T):
    for k in range(K):
      a_rep = _replacement(
        cfg.replacement,
        policy,
        observations[t],
        actions[t],
        _rng(root, REPLACE, t, k),
        A,
        stratified,
      )
      if a_rep is None:
        undefined[t] = True
        a_rep = actions[t]
      a_phi = int(policy(observations[t], _rng(root, PHI, t, k)))
      noise = int(_rng(root, ENV_NOISE, t, k).integers(2**63))
      for arm, first in enumerate((actions[t], a_rep, a_phi)):
        branch = restore(t)
        if not branch.reseed(noise) and job.env not in _WARNED_NO_RESEED:
          _WARNED_NO_RESEED.add(job.env)
          log.warning(
            "%s keeps no random state hindsight can reseed (np_random, _rng, ...): every "
            "branch of a step replays the same environment noise, so stochastic dynamics "
            "are under-sampled and stderrs too small",
            job.env,
          )
        ret, n = _roll_discounted(branch, first, policy, _rng(root, CONTINUE, t, k), cfg.gamma)
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
    keep_share=jnp.asarray(keep_share),
    bounds=jnp.asarray(_return_bounds(job.return_range, G[:T], H, T)),
    upper_rates=jnp.asarray(tie_upper_rates(K, cfg.confidence)),
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


def _return_bounds(declared, G, H: int, T: int) -> np.ndarray:
  """(lo, hi) of G_t per step t = 0..H, [H + 1, 2]: the declared range, else the episode's
  own branch returns G [T, K, arms] (infinite if they never differ); (0, 0) from T on."""
  if declared is not None:
    lo, hi = declared
  else:
    lo, hi = float(G.min()), float(G.max())
    if hi <= lo:
      lo, hi = -np.inf, np.inf
  bounds = np.zeros((H + 1, 2), np.float32)
  bounds[:T] = lo, hi
  return bounds


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


class PySource:
  """Chunks from Gymnasium / dm_env environments over a process pool (a
  `hindsight.labeling.label_source.LabelSource`)."""

  def __init__(self, job: LabelJob):
    env = make_py_env(job.env, job.horizon)
    python_policy(job.policy, env.num_actions)  # fail early on a bad policy
    check_replacement(job.config.replacement, None, env.spec, has_action_classes=False)
    if job.config.exact:
      raise HindsightError(
        "exact needs a tabular MDP (Gymnasium and dm_env are labeled by resampling)"
      )
    self.py_job = PyJob(
      job.env, job.policy, job.horizon, job.config, job.seed, return_range=job.return_range
    )
    self.workers = job.workers
    self.info = SourceInfo(
      env_name=env.name,
      policy=job.policy or "uniform",
      horizon=env.horizon,
      num_actions=env.num_actions,
      null_action=None,
      success_threshold=self.py_job.success_threshold,
      success_from_return=True,  # adapters: success is return > success_threshold
      tag_names=tuple(f"a{i}" for i in range(env.num_actions)),
      obs_shape=(env.reset(0).size,),
      obs_dtype=np.float32,
    )

  def chunk_multiple(self) -> int:
    return 1

  def label(self, seed: int, start: int, stop: int, bar) -> dict:
    job = dataclasses.replace(self.py_job, seed=seed)
    return label_episodes(job, range(start, stop), self.workers, lambda: bar.update(1))

  def finish(self, chunk_paths: list[str]) -> dict:
    del chunk_paths
    return {}
