"""Reference credit: what "true credit" means in every evaluation (DESIGN section 2).

Tabular environments: the exact dynamic programme (stderr 0). Otherwise the *same*
trajectories relabeled with a large K and keys independent of the training labels' keys.

Regeneration contract (what relabeling needs). A label dataset stores observations, not the
full environment state (the reasoning environment's latent competence is never observed).
Episode i of a dataset labeled with seed S was sampled from the key
`fold_in(episode_key(S, i), 0)` (labeling.engine), so `Labeler.sample` regenerates its full
state trajectory bit for bit; `regenerate` does so and refuses (one line) when the actions or
rewards differ from the stored ones (a dataset from another hindsight version or machine).

Keys. The labels of episode i branch from `fold_in(episode_key(S, i), 1)`; reference pass p
branches from `fold_in(fold_in(episode_key(S, i), REFERENCE_SALT), p)`, a different stream,
so the reference shares no branch with the labels (relabeling at a higher K with the labels'
keys would reuse their first K branches and correlate the two).

Honesty check (`check_passes`): two independent passes over the same episodes;
var(c_1 - c_2) / mean(se_1^2 + se_2^2) is 1 when the reported stderrs are right (steps whose
stderr is a tie bound are left out: that bound is conservative by design).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os

import jax
import numpy as np
from scipy import stats

from hindsight.errors import HindsightError
from hindsight.labeling.engine import LabelConfig, Labeler, episode_key, to_numpy
from hindsight.labeling.rollout import Trajectory
from hindsight.progress import CompileAwareBar

REFERENCE_SALT = 0x2EF5A17  # folds the reference's keys off an episode's root key
# Per-step fields kept from a relabel (all [E, H]).
FIELDS = (
  "credit",
  "credit_stderr",
  "credit_bounded",
  "klass",
  "progress",
  "progress_stderr",
  "phi_hard",
)
MAX_REFERENCE_ROLLOUTS = 8192


def reference_keys(seed: int, indices: np.ndarray, pass_index: int = 0) -> jax.Array:
  """Keys [E] of reference pass `pass_index` for episodes `indices` of seed `seed`."""
  fold = lambda i: jax.random.fold_in(  # noqa: E731
    jax.random.fold_in(episode_key(seed, i), REFERENCE_SALT), pass_index
  )
  return jax.vmap(fold)(np.asarray(indices, np.int32))


def choose_rollouts(
  label_credit: np.ndarray,
  label_stderr: np.ndarray,
  label_rollouts: int,
  fraction: float,
  bounded: np.ndarray | None = None,
) -> int:
  """The K at which the reference's RMS stderr is about `fraction` of the credit spread.

  MC stderrs scale as 1/sqrt(K): from the labels' RMS stderr e at K_label and the spread s
  (std of the labels' credit, minus their noise), K = K_label (e / (fraction s))^2, rounded
  up to a power of two, at least 4 K_label, at most MAX_REFERENCE_ROLLOUTS. Steps whose
  stderr is a tie bound (`bounded`: every branch tied) are left out of e: the bound is a
  conservative interval, not a noise level (on key_to_door, 90% of steps, it would ask for
  the maximum K).
  """
  ok = np.isfinite(label_credit) & np.isfinite(label_stderr)
  noisy = ok if bounded is None else ok & ~np.asarray(bounded, bool)
  e2 = float(np.mean(np.square(label_stderr[noisy]))) if noisy.any() else 0.0
  signal = max(float(np.var(label_credit[ok])) - e2, 1e-12) if ok.any() else 1.0
  k = label_rollouts * e2 / (fraction**2 * signal)
  k = max(4 * label_rollouts, k)
  return int(min(MAX_REFERENCE_ROLLOUTS, 1 << math.ceil(math.log2(max(k, 2)))))


def sample_trajectories(labeler: Labeler, seed: int, indices: np.ndarray) -> Trajectory:
  """The full-state trajectories of episodes `indices` of `seed` (NumPy leaves [E, ...]):
  the same keys the labeling job samples them from."""
  keys = jax.vmap(episode_key, (None, 0))(seed, np.asarray(indices, np.int32))
  return to_numpy(labeler.sample(keys))


def regenerate(
  labeler: Labeler, seed: int, indices: np.ndarray, actions: list, rewards: list
) -> Trajectory:
  """The full-state trajectories of dataset episodes `indices` (leaves [E, H + 1, ...]),
  checked against their stored actions and rewards (module docstring)."""
  traj = sample_trajectories(labeler, seed, indices)
  for row, (i, a, r) in enumerate(zip(indices, actions, rewards, strict=True)):
    n = len(a)
    same = np.array_equal(traj.actions[row, :n], a) and int(traj.mask[row].sum()) == n
    if not same or not np.allclose(traj.rewards[row, :n], r):
      raise HindsightError(
        f"episode {int(i)} does not regenerate from its seed (labeled by another hindsight "
        "version or machine?): its reference cannot be computed; relabel the dataset"
      )
  return traj


def label_trajectories(
  labeler: Labeler, traj: Trajectory, keys: jax.Array, progress: bool = True, desc: str = ""
) -> dict:
  """Labels of given trajectories (leaves [E, ...]) with the labeler's K, in sharded,
  micro-batched chunks (Labeler.relabel_program); NumPy fields [E, H] (and rollout_steps
  [E]). The last chunk is padded by repeating its last episode, whose copies are dropped."""
  E = int(traj.actions.shape[0])
  multiple = labeler.chunk_multiple()
  chunk = multiple * max(1, min(4, math.ceil(E / multiple)))
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


def check_passes(a: dict, b: dict, mask: np.ndarray) -> dict:
  """Two independent passes over the same steps: how honest their stderrs are, and how far
  the reference's own noise caps a rank correlation against it.

  Returns {steps, variance_ratio = var(c_a - c_b) / mean(se_a^2 + se_b^2), z_rms} over the
  valid steps where both stderrs are sample stderrs (> 0, not a tie bound), and over every
  valid step rho_ab, the Spearman correlation of the two passes, and spearman_ceiling =
  sqrt(rho_ab): with a = c + e_a, b = c + e_b (independent, equal noise) corr(c, a) =
  sqrt(corr(a, b)), so even the true credit c scores about that against one pass (the
  attenuation formula, exact for Pearson, close for Spearman of continuous credits; where
  the credit takes few values and ties, it overstates: on the key corridor at K=64 the
  ceiling read 0.817 and the DP itself scored 0.754)."""
  both = mask & np.isfinite(a["credit"]) & np.isfinite(b["credit"])
  rho = float(stats.spearmanr(a["credit"][both], b["credit"][both])[0]) if both.sum() > 2 else 0.0
  ceiling = {"spearman_between_passes": rho, "spearman_ceiling": float(np.sqrt(max(rho, 0.0)))}
  sel = mask & (a["credit_stderr"] > 0) & (b["credit_stderr"] > 0)
  sel &= ~a["credit_bounded"] & ~b["credit_bounded"]
  sel &= np.isfinite(a["credit"]) & np.isfinite(b["credit"])
  diff = (a["credit"] - b["credit"])[sel]
  var = (np.square(a["credit_stderr"]) + np.square(b["credit_stderr"]))[sel]
  if diff.size < 2:
    return {"steps": int(diff.size), "variance_ratio": float("nan"), "z_rms": float("nan"),
            **ceiling}  # fmt: skip
  return {
    **ceiling,
    "steps": int(diff.size),
    "variance_ratio": float(np.mean(np.square(diff)) / np.mean(var)),
    "z_rms": float(np.sqrt(np.mean(np.square(diff) / var))),
  }


def check_against_exact(mc: dict, exact: dict, mask: np.ndarray) -> dict:
  """MC reference vs the DP on a tabular MDP: {steps, z_rms} over sample-stderr steps."""
  sel = mask & (mc["credit_stderr"] > 0) & ~mc["credit_bounded"] & np.isfinite(exact["credit"])
  z = ((mc["credit"] - exact["credit"]) / np.where(sel, mc["credit_stderr"], 1.0))[sel]
  return {"steps": int(z.size), "z_rms": float(np.sqrt(np.mean(np.square(z)))) if z.size else 0.0}


def cache_key(**parts) -> str:
  """A short digest naming a cached reference: everything it depends on."""
  text = json.dumps(parts, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_cached(path: str) -> dict | None:
  if not os.path.isfile(path):
    return None
  try:
    with np.load(path) as z:
      return {k: z[k] for k in z.files}
  except (OSError, ValueError):
    return None  # a damaged cache is recomputed, never trusted


def reference_config(base: LabelConfig, rollouts: int, exact: bool = False) -> LabelConfig:
  """The labels' config (replacement, gamma, tolerance, confidence, stratify) at K."""
  return dataclasses.replace(base, num_rollouts=rollouts, exact=exact)


def sample_and_label(
  labeler: Labeler, seed: int, num_episodes: int, progress: bool = True, desc: str = ""
) -> tuple[Trajectory, dict]:
  """Episodes 0..n-1 of `seed` sampled and labeled (the labeling job's sharded chunk
  program, without the dataset): (Trajectory, labels), NumPy leaves [n, ...]."""
  multiple = labeler.chunk_multiple()
  chunk = multiple * max(1, min(4, math.ceil(num_episodes / multiple)))
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


def trajectory_arrays(env, traj: Trajectory) -> dict:
  """What an evaluation keeps of trajectories (leaves [n, H + 1, ...]): observations,
  actions, rewards, mask and tag ids, NumPy [n, H, ...]."""
  states = jax.tree.map(lambda x: x[:, : env.horizon], traj.states)
  params = env.default_params()
  obs = jax.vmap(jax.vmap(env.observation, (0, None)), (0, None))(states, params)
  tags = jax.vmap(jax.vmap(env.tag, (0, 0, None)), (0, 0, None))(states, traj.actions, params)
  return {
    "observations": np.asarray(obs),
    "actions": np.asarray(traj.actions),
    "rewards": np.asarray(traj.rewards),
    "mask": np.asarray(traj.mask),
    "tag_ids": np.asarray(tags),
  }


def episodes_from_arrays(env, arrays: dict) -> list[dict]:
  """The episodes of `trajectory_arrays` as the dicts the model scores (observations,
  actions, rewards, success, tag names), each cut to its length."""
  out = []
  for i in range(arrays["actions"].shape[0]):
    n = int(arrays["mask"][i].sum())
    rewards = arrays["rewards"][i, :n]
    out.append(
      {
        "observations": arrays["observations"][i, :n],
        "actions": arrays["actions"][i, :n],
        "rewards": rewards,
        "success": bool(rewards.sum() > env.success_threshold),
        "tags": [env.tag_names[int(t)] for t in arrays["tag_ids"][i, :n]],
      }
    )
  return out
