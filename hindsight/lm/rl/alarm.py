"""The training alarm: does a learned source's model still describe the policy it trains?

An evaluation point's reference (`rl.measure`: eval.reference fresh traces every eval.every
updates) has little power: 16 traces give per-class confidence sequences 0.3 to 2.8 wide.
The alarm reads the steps a run labels anyway, every update, and pools them over updates:

  pp_credit     the steps it labels (z_t = 1), thinned to a uniform sample (each kept with
                probability p_min / p_t: every step checked with probability pp.p_min, so a
                class's mean gap is not tilted by the allocation): the head's f_t - D_t, at
                no extra cost;
  prm, shaped   `alarm.steps` steps drawn uniformly from each update's training steps, their
                Monte Carlo credit D_t (K = label.num_rollouts, `rl.credit`) bought for the
                alarm and charged to the run's credit; the gap is the PRM's increment
                p(x_{t+1}) - p(x_t) minus D_t.

Each update u records its gaps g and their sentence classes (`check_record`). The test
(`alarm_test`) is `rl.refresh.shift_test` between two sets of per-class confidence sequences
of the mean gap (`metrics.sequential.slice_sequences`: the Gaussian-mixture asymptotic
sequence, the family's alpha split over the classes present, each class tested once both
hold MIN_DRAWS of its gaps):

  baseline  the gaps of updates 0 .. B-1 (B = alarm.baseline), at alpha / 2;
  window    at each update u >= B + W - 1, the gaps of updates u-W+1 .. u (W = alarm.window),
            the i-th such test at spent_alpha(alpha / 2, i) = alpha / 2 / ((i + 1)(i + 2)),

and fires when some class's two sequences are further apart than eval.tolerance: its gap has
moved since the start of training. By the union bound the probability that it ever fires
while the model's gap per class stays where it was is at most alpha (eval.alpha), however
long the run. A model that never fit a class has the same gap before and after: only a
change fires. The window (rather than every update since the baseline) keeps a late move
from being diluted by the updates before it. The first firing is the run's `training_alarm`
warning.
"""

from __future__ import annotations

import numpy as np

from hindsight.metrics.sequential import slice_sequences, spent_alpha
from hindsight.rl.refresh import shift_test

# A class is tested once the baseline and the window each hold this many of its gaps: the
# asymptotic sequence's coverage rests on their central limit, and a sample sd of two or
# three gaps can be near 0 (tested on two gaps a class, it fired in most runs of no drift).
MIN_DRAWS = 10


def check_record(checks: dict | None, tags: list[list[str]]) -> dict | None:
  """An update's alarm record {"gap": [n], "tag": [n]} from a signal's checks (trace and step
  indices, pred and ref per checked step; steps with no finite ref are left out) and every
  trace's step classes; None when the source checks nothing."""
  if checks is None:
    return None
  gap, tag = [], []
  for i, t, p, r in zip(checks["trace"], checks["step"], checks["pred"], checks["ref"],
                        strict=True):  # fmt: skip
    if np.isfinite(r) and np.isfinite(p):
      gap.append(float(p - r))
      tag.append(tags[int(i)][int(t)])
  return {"gap": gap, "tag": tag}


def _pooled(records: list[dict | None], names) -> tuple[np.ndarray, np.ndarray]:
  gap = [g for r in records if r for g in r["gap"]]
  tag = [names.index(t) for r in records if r for t in r["tag"]]
  return np.asarray(gap, np.float64), np.asarray(tag, np.int64)


def alarm_test(records: list[dict | None], names, baseline: int, window: int, tolerance: float,
               alpha: float) -> dict | None:  # fmt: skip
  """The test at the last update of `records` (one per update, 0 .. u: `check_record`'s) over
  the classes `names` (module docstring): {fired, slice, gap (the window's), before (the
  baseline's), apart, update}; None before update B + W - 1 or when no update checked."""
  u = len(records) - 1
  first = baseline + window - 1
  if u < first or not any(records):
    return None
  before = slice_sequences(*_pooled(records[:baseline], names), names, None, alpha / 2,
                           MIN_DRAWS, "asymptotic")  # fmt: skip
  now = slice_sequences(*_pooled(records[u - window + 1 :], names), names, None,
                        spent_alpha(alpha / 2, u - first), MIN_DRAWS, "asymptotic")  # fmt: skip
  return {**shift_test(now, before, tolerance), "update": u}


def alarm_message(test: dict, tolerance: float, alpha: float) -> str:
  """The `training_alarm` warning of a test that fired."""
  return (
    f"at update {test['update']} the model's gap on '{test['slice']}' training steps moved "
    f"from {test['before']:+.3f} to {test['gap']:+.3f} against their Monte Carlo credit, "
    f"its confidence sequences {test['apart']:.3f} apart (tolerance {tolerance:g}, alpha "
    f"{alpha:g} over the run): the policy has left the model's support"
  )
