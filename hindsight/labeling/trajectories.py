"""Labeling drivers over in-memory trajectories: sample them, regenerate a dataset's,
label given ones, and turn them into arrays and `Episode`s.

The labeling job (`labeling.job`) writes datasets; these are for everything that labels or
scores trajectories without one: the drift harness's reference, the audit's pools, the
policy-gradient table, benchmarks and notebooks.

Regeneration contract. A label dataset stores observations, not the full environment state
(the reasoning environment's latent competence is never observed). Episode i of a dataset
labeled with seed S was sampled from the key `fold_in(episode_key(S, i), 0)`
(labeling.engine), so `Labeler.sample` regenerates its full state trajectory bit for bit;
`regenerate` does so and refuses (one line) when the actions or rewards differ from the
stored ones (a dataset from another hindsight version or machine).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.credit.names import KLASS_NAMES
from hindsight.data.episode import Episode
from hindsight.errors import HindsightError
from hindsight.labeling.engine import Labeler, episode_key, to_numpy
from hindsight.labeling.rollout import Trajectory, episode_length
from hindsight.model.encoders import DiscreteEncoder, VectorEncoder
from hindsight.model.spec import DataSpec, value_scale
from hindsight.progress import CompileAwareBar


def sample_trajectories(labeler: Labeler, seed: int, indices: np.ndarray) -> Trajectory:
  """The full-state trajectories of episodes `indices` of `seed` (NumPy leaves [E, ...]):
  the same keys the labeling job samples them from."""
  keys = jax.vmap(episode_key, (None, 0))(seed, np.asarray(indices, np.int32))
  return to_numpy(labeler.sample(keys))


def episode_lengths(env, policy, seed: int, episodes: int, batch: int = 4096) -> np.ndarray:
  """int32 [episodes], T_i of episodes 0..episodes-1 of `seed` (the keys the labeling job
  samples them from) at the environment's horizon. No states are kept, so a declared horizon
  far above the episodes' lengths costs only the steps that happen."""
  params, policy_params = env.default_params(), policy.default_params()

  def length(i):
    key = jax.random.fold_in(episode_key(seed, i), 0)  # as Labeler.sample
    return episode_length(env, policy, params, policy_params, key)

  lengths = jax.jit(jax.vmap(length))
  return np.concatenate(
    [
      np.asarray(lengths(np.arange(lo, min(lo + batch, episodes), dtype=np.int32)))
      for lo in range(0, episodes, batch)
    ]
  )


def mismatched_rows(traj: Trajectory, actions: Sequence, rewards: Sequence) -> list[int]:
  """Rows of `traj` (leaves [E, ...]) whose actions, length or rewards differ from the
  given per-episode ones (lists of [T_i] arrays)."""
  bad = []
  for row, (a, r) in enumerate(zip(actions, rewards, strict=True)):
    a, r = np.asarray(a), np.asarray(r)
    n = a.size
    same = int(traj.mask[row].sum()) == n and np.array_equal(traj.actions[row, :n], a)
    if not same or not np.allclose(traj.rewards[row, :n], r):
      bad.append(row)
  return bad


def regenerate(
  labeler: Labeler, seed: int, indices: np.ndarray, actions: Sequence, rewards: Sequence
) -> Trajectory:
  """The full-state trajectories of dataset episodes `indices` (leaves [E, H + 1, ...]),
  checked against their stored actions and rewards (module docstring)."""
  traj = sample_trajectories(labeler, seed, indices)
  bad = mismatched_rows(traj, actions, rewards)
  if bad:
    raise HindsightError(
      f"episode {int(indices[bad[0]])} does not regenerate from its seed (labeled by another "
      "hindsight version or machine?): its reference cannot be computed; relabel the dataset"
    )
  return traj


def _chunked(labeler: Labeler, n: int) -> int:
  """Episodes per program call: a device multiple, at most 4 multiples."""
  multiple = labeler.chunk_multiple()
  return multiple * max(1, min(4, math.ceil(n / multiple)))


def label_trajectories(
  labeler: Labeler, traj: Trajectory, keys: jax.Array, progress: bool = True, desc: str = ""
) -> dict:
  """Labels of given trajectories (leaves [E, ...]) with the labeler's K, in sharded,
  micro-batched chunks (Labeler.relabel_program); NumPy fields [E, H] (and rollout_steps
  [E]). The last chunk is padded by repeating its last episode, whose copies are dropped."""
  E = int(traj.actions.shape[0])
  chunk = _chunked(labeler, E)
  program = labeler.relabel_program(chunk)
  out: dict[str, list] = {}
  bar = CompileAwareBar(total=E, desc=desc or "reference", unit="ep", disable=not progress)
  with bar:
    for start in range(0, E, chunk):
      stop = min(start + chunk, E)
      take = np.minimum(np.arange(start, start + chunk), stop - 1)
      part = jax.tree.map(lambda x, take=take: x[take], (traj, keys))
      labels = to_numpy(program(*part))
      for k, v in labels.items():
        out.setdefault(k, []).append(np.asarray(v)[: stop - start])
      bar.update(stop - start)
  return {k: np.concatenate(v) for k, v in out.items()}


def sample_and_label(
  labeler: Labeler, seed: int, num_episodes: int, progress: bool = True, desc: str = ""
) -> tuple[Trajectory, dict]:
  """Episodes 0..n-1 of `seed` sampled and labeled (the labeling job's sharded chunk
  program, without the dataset): (Trajectory, labels), NumPy leaves [n, ...]."""
  chunk = _chunked(labeler, num_episodes)
  program = labeler.chunk_program(chunk)
  trajs, labels = [], []
  bar = CompileAwareBar(total=num_episodes, desc=desc or "sample", unit="ep", disable=not progress)
  with bar:
    for start in range(0, num_episodes, chunk):
      n = min(chunk, num_episodes - start)
      t, lab = to_numpy(program(np.uint32(seed), np.arange(start, start + chunk, dtype=np.int32)))
      trajs.append(jax.tree.map(lambda x, n=n: x[:n], t))
      labels.append({k: v[:n] for k, v in lab.items()})
      bar.update(n)
  cat = lambda *xs: np.concatenate(xs)  # noqa: E731
  return jax.tree.map(cat, *trajs), jax.tree.map(cat, *labels)


def trajectory_arrays(env, traj: Trajectory, with_tags: bool = True) -> dict:
  """What is kept of trajectories (leaves [n, H + 1, ...]) outside the engine, NumPy:
  observations [n, H, ...], actions, rewards, mask [n, H], success [n], tag_ids [n, H]
  (with_tags), and states [n, H] (the discrete state ids, where the environment has them)."""
  states = jax.tree.map(lambda x: x[:, : env.horizon], traj.states)
  params = env.default_params()
  obs = jax.vmap(jax.vmap(env.observation, (0, None)), (0, None))(states, params)
  out = {
    "observations": np.asarray(obs),
    "actions": np.asarray(traj.actions),
    "rewards": np.asarray(traj.rewards),
    "mask": np.asarray(traj.mask),
    "success": np.asarray(traj.success, bool),
  }
  if with_tags:
    tag = jax.vmap(jax.vmap(env.tag, (0, 0, None)), (0, 0, None))
    out["tag_ids"] = np.asarray(tag(states, traj.actions, params))
  if env.state_index(jax.tree.map(lambda x: x[0, 0], states)) is not None:
    out["states"] = np.asarray(jax.vmap(jax.vmap(env.state_index))(states))
  return out


def episodes_from_arrays(env, arrays: dict) -> list[Episode]:
  """The episodes of `trajectory_arrays` (each cut to its length), carrying the
  trajectory's own success and the environment's tag names."""
  out = []
  for i in range(arrays["actions"].shape[0]):
    n = int(arrays["mask"][i].sum())
    out.append(
      Episode(
        observations=arrays["observations"][i, :n],
        actions=arrays["actions"][i, :n].astype(np.int32),
        rewards=arrays["rewards"][i, :n].astype(np.float32),
        success=bool(arrays["success"][i]),
        tags=tuple(env.tag_names[int(t)] for t in arrays["tag_ids"][i, :n]),
      )
    )
  return out


def episodes_from_trajectories(env, traj: Trajectory) -> list[Episode]:
  """`Episode`s of sampled trajectories (leaves [n, H + 1, ...])."""
  return episodes_from_arrays(env, trajectory_arrays(env, traj))


def trajectory_batch(env, traj: Trajectory, labels: dict | None = None, env_params=None) -> dict:
  """The credit model's batch (`model.batching.episodes_batch` layout) of trajectories with
  leaves [E, H + 1, ...], as JAX arrays: traceable, so an RL update scores its own rollouts
  with `Predictor.credit_fn` inside its jit. Every field [E, H] unless noted: observations
  [E, H, D] (or [E, H] ids), actions, rewards, mask, success [E] (float); with `labels` (the
  labeler's output for these trajectories) also credit, credit_stderr, credit_noise,
  progress, klass, label_mask (valid steps with a finite credit) and class_mask, so it trains
  a model too."""
  params = env.default_params() if env_params is None else env_params
  states = jax.tree.map(lambda x: x[:, : env.horizon], traj.states)
  obs = jax.vmap(jax.vmap(env.observation, (0, None)), (0, None))(states, params)
  batch = {
    "observations": obs if jnp.issubdtype(obs.dtype, jnp.integer) else obs.astype(jnp.float32),
    "actions": traj.actions,
    "rewards": traj.rewards,
    "mask": traj.mask,
    "success": traj.success.astype(jnp.float32),
  }
  if labels is not None:
    finite = jnp.isfinite(labels["credit"]) & jnp.isfinite(labels["credit_stderr"])
    batch["credit"] = jnp.where(finite, labels["credit"], 0.0)
    batch["credit_stderr"] = jnp.where(finite, labels["credit_stderr"], 0.0)
    # The label's noise level (`model.batching`'s credit_noise): its sample stderr if carried.
    sample = labels.get("credit_sample_stderr", labels["credit_stderr"])
    noise = jnp.where(jnp.isfinite(sample), sample, labels["credit_stderr"])
    batch["credit_noise"] = jnp.where(finite, noise, 0.0)
    batch["progress"] = jnp.where(jnp.isfinite(labels["progress"]), labels["progress"], 0.0)
    batch["klass"] = labels["klass"]
    batch["label_mask"] = finite & traj.mask
    batch["class_mask"] = traj.mask
  return batch


def batch_spec(env, batch: dict, config=None) -> DataSpec:
  """The DataSpec of a model trained on `trajectory_batch(..., labels)` (host arrays):
  observation statistics over the valid steps and the labeled credits' spread as value
  scale (the rules of a dataset's spec, `model.spec`), the environment's horizon as
  max_length, the label config's class rule (`config`)."""
  mask = np.asarray(batch["mask"], bool)
  obs = np.asarray(batch["observations"])
  if np.issubdtype(obs.dtype, np.integer):
    encoder = DiscreteEncoder(int(env.num_states))
  else:
    encoder = VectorEncoder.of_observations(obs[mask])
  # trajectory_batch writes an undefined credit as 0 outside label_mask: leave those out.
  labeled = np.asarray(batch.get("label_mask", np.zeros(mask.shape, bool)), bool)
  scale = value_scale(np.asarray(batch.get("credit", np.zeros(mask.shape)))[labeled])
  return DataSpec(
    encoder=encoder,
    num_actions=env.num_actions,
    max_length=env.horizon,
    num_classes=len(KLASS_NAMES),
    value_scale=scale,
    decorative_tolerance=getattr(config, "decorative_tolerance", 0.05),
    confidence=getattr(config, "confidence", 0.95),
    success_threshold=float(env.success_threshold),
    success_from_return=env.success_from_return,
  )
