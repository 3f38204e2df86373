"""The policy-gradient table: every credit source's gradient against the exact one.

On a tabular MDP (`--gradient-env`, default the bundled key corridor) N episodes are sampled
once (their keys do not depend on how they are labeled) and labeled exactly and by Monte
Carlo under every replacement the environment supports; each credit source becomes the
per-episode estimator sum_t C_t grad log pi(a_t | s_t) and is scored by
`hindsight.credit.policy_gradient.gradient_stats` against the DP gradient.
"""

from __future__ import annotations

import jax
import numpy as np

from hindsight.credit.policy_gradient import episode_gradients, exact_gradient, gradient_stats
from hindsight.credit.replacement import REPLACEMENTS
from hindsight.envs import make
from hindsight.envs.tabular import TabularEnv
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.engine import Labeler
from hindsight.labeling.trajectories import sample_and_label

# Replacements of the table (policy_no_repeat needs action content classes; tabular has none).
GRADIENT_REPLACEMENTS = tuple(r for r in REPLACEMENTS if r != "policy_no_repeat")


def gradient_table(
  env_spec: str,
  episodes: int = 2000,
  rollouts: int = 16,
  seed: int = 0,
  progress: bool = True,
  extra_sources=None,
) -> dict:
  """{"env", "episodes", "rollouts", "exact_norm", "rows": {source: stats}}.

  extra_sources: optional fn(trajectory, labels) -> {name: credit [N, H]} (a learned model
  scored on the same episodes, when its environment is this one).
  """
  env, policy = make(env_spec)
  if not isinstance(env, TabularEnv):
    raise HindsightError(f"gradient_env {env_spec}: the gradient table needs a tabular MDP")
  mdp = env.mdp
  g_star = exact_gradient(mdp).reshape(-1)
  credits, traj, policy_labels = {}, None, None
  for q in GRADIENT_REPLACEMENTS:
    if q == "null" and env.null_action is None:
      continue
    for exact in (True, False):
      cfg = LabelConfig(num_rollouts=1 if exact else rollouts, replacement=q, exact=exact)
      t, labels = sample_and_label(
        Labeler(env, policy, cfg),
        seed,
        episodes,
        progress=progress,
        desc=f"gradient {'exact' if exact else f'K={rollouts}'} {q}",
      )
      traj = t if traj is None else traj
      credits[f"{'exact' if exact else 'mc'} {q}"] = labels["credit"]
      if q == "policy" and not exact:
        policy_labels = labels
  mask = np.asarray(traj.mask)
  rewards = np.where(mask, traj.rewards, 0.0)
  states_t = jax.tree.map(lambda x: x[:, : env.horizon], traj.states)
  states = np.asarray(jax.vmap(jax.vmap(env.state_index))(states_t))
  returns_to_go = np.flip(np.cumsum(np.flip(rewards, 1), 1), 1)
  sources = {
    "return G_t (REINFORCE)": returns_to_go,
    "outcome R": np.broadcast_to(rewards.sum(1, keepdims=True), rewards.shape),
    "mc progress (soft)": policy_labels["progress"],
    "mc phi_hard": policy_labels["phi_hard"],
    **credits,
  }
  if extra_sources is not None:
    sources.update(extra_sources(traj, policy_labels))
  rows = {}
  for name, credit in sources.items():
    g = episode_gradients(states, np.asarray(traj.actions), mask, np.asarray(credit), mdp.pi)
    rows[name] = gradient_stats(g, g_star)
  return {
    "env": env_spec,
    "episodes": episodes,
    "rollouts": rollouts,
    "exact_norm": float(np.linalg.norm(g_star)),
    "rows": rows,
  }
