"""The audited trajectories: a pool of steps the audit may branch from.

Branching needs each step's *full* state (docs/design.md, section 1), which a log of observations
does not hold (the reasoning environment's competence is never observed). The pool is
therefore made of trajectories hindsight can regenerate bit for bit from their key
(`labeling.trajectories`, the regeneration contract: episode i of seed S is sampled from
`fold_in(episode_key(S, i), 0)`):

  --env SPEC            fresh episodes 0..n-1 of the audit's seed, drawn from SPEC's policy;
  --trajectories DIR    a label dataset (`hindsight label --out DIR`): its env and seed;
  --trajectories FILE   JSON lines in the export format (observations, actions, rewards)
                        with "seed" and "episode" (the key an RL loop sampled the episode
                        with, `hindsight.episode_key(seed, episode)`) and optionally "env"
                        (default: the environment the model was trained on).

Regenerated actions and rewards are checked against the given ones: a trajectory that does
not regenerate gets a one-line error naming it.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from hindsight.data.episode import Episode
from hindsight.data.labels import open_labels
from hindsight.errors import HindsightError
from hindsight.labeling import trajectories as tr
from hindsight.labeling.engine import Labeler
from hindsight.labeling.rollout import Trajectory

AUDIT_SEED_OFFSET = 2_000_003  # --env pools use episodes of seed (--seed + this)


@dataclasses.dataclass
class Pool:
  """Trajectories (NumPy leaves [E, H + 1, ...]) and their episodes as the model scores
  them; `source` describes where they came from (for the report)."""

  traj: Trajectory
  episodes: list[Episode]
  source: dict

  @property
  def lengths(self) -> np.ndarray:
    return np.asarray(self.traj.mask).sum(1)


def _pool(labeler: Labeler, traj: Trajectory, source: dict) -> Pool:
  return Pool(traj=traj, episodes=tr.episodes_from_trajectories(labeler.env, traj), source=source)


def from_env(labeler: Labeler, spec: str, num_episodes: int, seed: int) -> Pool:
  """Fresh episodes 0..n-1 of seed (seed + AUDIT_SEED_OFFSET) of `spec`."""
  pool_seed = seed + AUDIT_SEED_OFFSET
  traj = tr.sample_trajectories(labeler, pool_seed, np.arange(num_episodes))
  return _pool(
    labeler, traj, {"kind": "env", "env": spec, "seed": pool_seed, "episodes": num_episodes}
  )


def read_trajectory_file(path: str, max_episodes: int) -> tuple[str | None, list[dict]]:
  """(env spec or None, episodes) of a JSON-lines file (module docstring); one-line errors."""
  episodes, envs = [], set()
  try:
    with open(path) as f:
      for n, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          ep = json.loads(line)
        except ValueError:
          raise HindsightError(f"{path}:{n}: not a JSON object") from None
        if not isinstance(ep, dict):
          raise HindsightError(f"{path}:{n}: not a JSON object")
        for field in ("actions", "rewards", "seed", "episode"):
          if field not in ep:
            why = (
              " (the key it was sampled with: docs/audit.md)"
              if field in ("seed", "episode")
              else ""
            )
            raise HindsightError(f"{path}:{n}: missing field '{field}'{why}")
        if not all(isinstance(ep[k], int) and ep[k] >= 0 for k in ("seed", "episode")):
          raise HindsightError(f"{path}:{n}: 'seed' and 'episode' must be integers >= 0")
        try:
          ep["actions"] = np.asarray(ep["actions"], np.int64).reshape(-1)
          ep["rewards"] = np.asarray(ep["rewards"], np.float64).reshape(-1)
        except (TypeError, ValueError):
          raise HindsightError(
            f"{path}:{n}: 'actions' and 'rewards' must be lists of numbers"
          ) from None
        ep["line"] = n
        envs.add(ep.get("env"))
        episodes.append(ep)
        if max_episodes and len(episodes) >= max_episodes:
          break
  except OSError as e:
    raise HindsightError(f"trajectories {path}: {e.strerror or e}") from None
  if not episodes:
    raise HindsightError(f"trajectories {path}: no trajectories in the file")
  if len(envs) > 1:
    raise HindsightError(f"trajectories {path}: trajectories of several environments")
  return envs.pop(), episodes


def from_file(labeler: Labeler, path: str, episodes: list[dict]) -> Pool:
  """The trajectories of a JSON-lines file, regenerated from their keys (one program call
  per seed) and checked against the file."""
  H = labeler.env.horizon
  for ep in episodes:
    if ep["actions"].size > H:
      raise HindsightError(
        f"{path}:{ep['line']}: {ep['actions'].size} steps, the environment's horizon is {H}"
      )
  by_seed: dict[int, list[int]] = {}
  for j, ep in enumerate(episodes):
    by_seed.setdefault(ep["seed"], []).append(j)
  rows: list = [None] * len(episodes)
  for seed, js in by_seed.items():
    group = [episodes[j] for j in js]
    ids = np.array([ep["episode"] for ep in group])
    traj = tr.sample_trajectories(labeler, seed, ids)
    bad = tr.mismatched_rows(traj, [ep["actions"] for ep in group], [ep["rewards"] for ep in group])
    if bad:
      ep = group[bad[0]]
      raise HindsightError(
        f"{path}:{ep['line']}: does not regenerate from seed {seed}, episode "
        f"{ep['episode']} (another environment, policy or hindsight version?)"
      )
    for row, j in enumerate(js):
      rows[j] = jax.tree.map(lambda x, row=row: x[row], traj)
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *rows)
  source = {"kind": "file", "path": os.path.abspath(path), "episodes": len(episodes)}
  return _pool(labeler, stacked, source)


def from_dataset(labeler: Labeler, labels, max_episodes: int) -> Pool:
  """The first episodes of a label dataset, regenerated from its seed."""
  n = min(len(labels), max_episodes) if max_episodes else len(labels)
  seed = labels.metadata.seed
  ids = np.arange(n)
  eps = [labels[int(i)] for i in ids]
  traj = tr.regenerate(
    labeler,
    seed,
    ids,
    [np.asarray(e["actions"]) for e in eps],
    [np.asarray(e["rewards"]) for e in eps],
  )
  return _pool(labeler, traj, {"kind": "dataset", "path": labels.path, "seed": seed, "episodes": n})


def dataset_env(path: str):
  """(Labels, env spec) when `path` is a label dataset directory, else None."""
  if not os.path.isdir(path):
    return None
  labels = open_labels(path)
  return labels, labels.metadata.env
