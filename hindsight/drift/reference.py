"""Reference credit: what "true credit" means in every evaluation (docs/design.md, section 2).

Tabular environments: the exact dynamic programme (stderr 0). Otherwise the *same*
trajectories relabeled with a large K and keys independent of the training labels' keys.

Relabeling needs each step's full state, which a dataset does not store: the trajectories are
regenerated from their seeds (`labeling.trajectories`, the regeneration contract).

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

from hindsight.labeling.config import LabelConfig
from hindsight.labeling.engine import episode_key

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
