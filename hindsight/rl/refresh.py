"""Keeping a source's model current while the policy it describes learns
(`learned_current`, `credit_cv_current`).

At every evaluation point each seed audits its own model: fresh episodes of the current
policy are labeled (`CreditSource.audit_size`: refresh.episodes at K = refresh.rollouts
unless the source says otherwise; charged to the run), and the model's gaps g =
prediction - label are tested per tag, because a signed mean over all steps lets opposite
drifts cancel (the answer over-credited, decorative steps under-credited). For each of the
m tags with >= 2 steps, a two-sided z-test at alpha / m (Bonferroni, so one audit's
false-alarm probability is at most alpha):

  fire  iff  |mean_tag g| > tolerance + z_{1 - alpha / 2m} sd_tag(g) / sqrt(n_tag)

sd includes the labels' own noise, so a noisier label widens the test instead of firing
it. This is a fixed-sample test per audit, not an anytime-valid sequence across audits:
over a run of A audits the false alarms add up to at most A alpha, and each one costs only
a refit. When it fires, the model is fitted again from its current parameters on the
audited labels (`CreditSource.refit`; the credit model through
`model.fit.fit_credit_model(init=...)`), and its new state replaces the old one in the
running update (an argument of the compiled chunk: nothing recompiles).
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def tag_slices(env, labels) -> tuple[np.ndarray, tuple[str, ...]]:
  """(slice index per step [E, H], slice names): the environment's tags, or one slice
  "all" when it has none."""
  if env.tag_names:
    return np.asarray(labels["tags"]), tuple(env.tag_names)
  return np.zeros(np.shape(labels["credit"]), int), ("all",)


def slice_stats(gaps: np.ndarray, slices: np.ndarray, names) -> dict:
  """name -> [mean, sd (ddof 1), n] of the gaps of each slice with >= 2 of them."""
  out = {}
  for s in np.unique(slices):
    g = gaps[slices == s]
    if g.size >= 2:
      out[names[int(s)]] = [float(g.mean()), float(g.std(ddof=1)), int(g.size)]
  return out


def _worst(effects: dict, tolerance: float, alpha: float) -> dict:
  """{fired, slice, excess} of the slice whose |effect| most exceeds tolerance + z se, over
  effects {name: (effect, se)}, z at alpha / 2m for the m slices (Bonferroni)."""
  z = stats.norm.ppf(1 - alpha / (2 * max(len(effects), 1)))
  worst = {"fired": False, "slice": "", "excess": -np.inf}
  for name, (effect, se) in effects.items():
    excess = abs(effect) - (tolerance + z * se)
    if excess > worst["excess"]:
      worst = {"fired": bool(excess > 0), "slice": name, "excess": float(excess)}
  return worst


def sliced_gap_test(
  gaps: np.ndarray, slices: np.ndarray, names, tolerance: float, alpha: float
) -> dict:
  """The per-slice test of the module docstring: {fired, slice (the worst), gap, excess}."""
  per = slice_stats(gaps, slices, names)
  worst = _worst({k: (m, sd / np.sqrt(n)) for k, (m, sd, n) in per.items()}, tolerance, alpha)
  worst["gap"] = per[worst["slice"]][0] if worst["slice"] else 0.0
  return worst


def sliced_shift_test(now: dict, before: dict, tolerance: float, alpha: float) -> dict:
  """Has the gap moved? Per slice present in both `slice_stats`, a two-sample z-test of
  the change in mean gap, Bonferroni over the m slices at alpha:

    fire  iff  |mean_now - mean_before| > tolerance + z_{1 - alpha / 2m}
                                                     sqrt(sd_now^2 / n_now + sd_before^2 / n_before)

  A model that never fit some slice has the same gap before and after, so only a change
  fires: the policy has moved where the model describes it otherwise. {fired, slice (the
  worst), gap (now), before (its gap then), excess}."""
  shared = [k for k in now if k in before]
  effects = {}
  for k in shared:
    (m1, s1, n1), (m0, s0, n0) = now[k], before[k]
    effects[k] = (m1 - m0, float(np.sqrt(s1**2 / n1 + s0**2 / n0)))
  worst = _worst(effects, tolerance, alpha)
  k = worst["slice"]
  worst["gap"], worst["before"] = (now[k][0], before[k][0]) if k else (0.0, 0.0)
  return worst
