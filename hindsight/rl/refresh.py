"""Keeping a credit model current while the policy it describes learns (`learned_current`).

At every evaluation point each seed audits its own model: `refresh.episodes` fresh
episodes of the current policy are labeled with K = `refresh.rollouts` (charged to the
run), and the model's gaps g = prediction - label are tested per tag, because a signed
mean over all steps lets opposite drifts cancel (the answer over-credited, decorative steps
under-credited). For each of the m tags with >= 2 steps, a two-sided z-test at alpha / m
(Bonferroni, so one audit's false-alarm probability is at most alpha):

  fire  iff  |mean_tag g| > tolerance + z_{1 - alpha / 2m} sd_tag(g) / sqrt(n_tag)

sd includes the labels' own noise, so a noisier label widens the test instead of firing
it. This is a fixed-sample test per audit, not an anytime-valid sequence across audits:
over a run of A audits the false alarms add up to at most A alpha, and each one costs only
a fine-tune. When it fires, the model is fine-tuned from its current parameters on the
audited labels (`model.fit.fit_credit_model(init=...)`) and its new state replaces the old
one in the running update (an argument of the compiled chunk: nothing recompiles).
"""

from __future__ import annotations

import jax
import numpy as np
from scipy import stats

from hindsight.model.fit import fit_credit_model
from hindsight.rl.sources import credit_arm_steps


def sliced_gap_test(
  gaps: np.ndarray, slices: np.ndarray, names, tolerance: float, alpha: float
) -> dict:
  """The per-slice test of the module docstring: {fired, slice (the worst), gap, bound}."""
  present = [s for s in np.unique(slices) if np.sum(slices == s) >= 2]
  z = stats.norm.ppf(1 - alpha / (2 * max(len(present), 1)))
  worst = {"fired": False, "slice": "", "gap": 0.0, "excess": -np.inf}
  for s in present:
    g = gaps[slices == s]
    bound = tolerance + z * g.std(ddof=1) / np.sqrt(g.size)
    excess = abs(g.mean()) - bound
    if excess > worst["excess"]:
      worst = {"fired": bool(excess > 0), "slice": names[int(s)], "gap": float(g.mean()),
               "excess": float(excess)}  # fmt: skip
  return worst


def audit_and_refresh(sampler, params, keys, score, model_state, predictor, config, seed: int):
  """(new model state, record) for one seed: the audit's labels, test and, when it fires, a
  fine-tune. record: {fired, slice, gap, env_steps (charged), fine_tuned}."""
  traj, labels, batch = jax.device_get(sampler(params, keys))
  mask = np.asarray(traj.mask)
  credit = np.asarray(labels["credit"])
  ok = mask & np.isfinite(credit)
  pred = np.asarray(score(model_state, batch)["mean"])
  arms = np.asarray(labels["arm_steps"])
  names = sampler.task.env.tag_names
  slices = np.asarray(labels["tags"]) if names else np.zeros(mask.shape, int)
  record = sliced_gap_test(
    (pred - credit)[ok],
    slices[ok],
    names or ("all",),
    float(config.refresh.tolerance),
    float(config.refresh.alpha),
  )
  record["env_steps"] = int(mask.sum() + credit_arm_steps(arms))
  record.pop("excess")
  if record["fired"]:
    fitted = fit_credit_model(
      batch,
      predictor.spec,
      predictor.model_config,
      int(config.refresh.steps),
      seed=seed,
      init=model_state,
    )
    model_state = fitted.state
  record["fine_tuned"] = record["fired"]
  return model_state, record
