"""RL's drift tests: does a source's model still describe the policy that now samples?

Both questions are asked per tag (a signed mean over all steps lets opposite drifts cancel:
the answer over-credited, decorative steps under-credited) with the audit's confidence
sequences (`metrics.sequential`): each tag's confidence sequence of its mean gap g =
prediction - reference credit over the point's steps, in the order they were sampled. A run
asks again at every evaluation point, so the error budget is spent over the repeated tests
(`spent_alpha`: alpha / ((i + 1) (i + 2)) for the i-th), and each question's false-alarm
probability over a whole run is at most alpha, however many points it has and whenever it is
read:

  gap_test    does the model describe this policy's credit? Fires when some tag's sequence
              lies entirely outside [-tolerance, +tolerance] (the audits of sources kept
              current, `rl.sources.refresh`, and every evaluation point's `drift.audit`).
  shift_test  has the gap moved since update 0? Fires when some tag's sequence now and its
              sequence at update 0 are further apart than the tolerance (half of alpha for
              update 0's, the other half spent over the later points): a model that never fit
              a tag has the same gap before and after, so only a change fires. Its firing is
              the `credit_drift` warning.

The sequence (`eval.boundary`): "asymptotic" (the default), the Gaussian-mixture sequence
whose width follows the gaps' spread; or "bounded", the empirical-Bernstein sequence in the
range every gap of the tag can take (the point's own predictions, known before any label,
widened by the environment's return bounds), exact whatever the gaps' distribution but, with
a return range far wider than the gaps (key_to_door's), blind to every drift RL produces
(docs/rl.md, "Hack detection"). Both assume independent draws; a point's steps come in whole
episodes, whose steps are correlated, as the fixed-sample z-tests these replace assumed too.
"""

from __future__ import annotations

import numpy as np

from hindsight.metrics.sequential import SliceBounds, slice_sequences, spent_alpha


def tag_slices(env, labels) -> tuple[np.ndarray, tuple[str, ...]]:
  """(slice index per step [E, H], slice names): the environment's tags, or one slice
  "all" when it has none."""
  if env.tag_names:
    return np.asarray(labels["tags"]), tuple(env.tag_names)
  return np.zeros(np.shape(labels["credit"]), int), ("all",)


def gap_ranges(pred: np.ndarray, width: np.ndarray, slices: np.ndarray, m: int) -> np.ndarray:
  """[m, 2]: the range every gap of each slice can take, pred - credit with |credit| <= the
  step's return range width (a difference of two returns in it): [min pred - W, max pred + W]
  over the slice's steps, W their largest width. pred, width, slices: [n] flat steps."""
  out = np.zeros((m, 2))
  for j in range(m):
    sel = slices == j
    if sel.any():
      w = float(np.max(width[sel]))
      out[j] = float(np.min(pred[sel])) - w, float(np.max(pred[sel])) + w
  return out


def bounded_ranges(
  boundary: str, labeler, traj, pred: np.ndarray, valid: np.ndarray, slices, m: int
) -> tuple[np.ndarray | None, bool]:
  """(ranges, testable) of the tests on `traj`'s steps `valid` (bool [E, H]; pred and slices
  [n] over those steps, in order): the "bounded" sequences' `gap_ranges`, from the labeler's
  return bounds (testable False where a step has none: no test); None for the asymptotic
  ones, which need no range."""
  if boundary != "bounded":
    return None, True
  import jax

  _, bounds = jax.device_get(labeler.step_info(traj))
  width = (bounds[..., 1] - bounds[..., 0])[valid]
  if not np.isfinite(width).all():
    return None, False
  return gap_ranges(pred, width, slices, m), True


def gap_test(
  gaps: np.ndarray, slices: np.ndarray, names, ranges: np.ndarray | None, tolerance: float,
  alpha: float, index: int, boundary: str = "asymptotic",
) -> dict:  # fmt: skip
  """The gap test of the module docstring at the index-th read of the run: {fired, slice (the
  worst tag), gap (its mean), lower, upper (its sequence), tags (every tag's [mean, lower,
  upper, count])}. ranges: `gap_ranges` (read by the "bounded" sequence only)."""
  bounds = slice_sequences(
    gaps, slices, names, ranges, spent_alpha(alpha, index), boundary=boundary
  )
  excess = np.maximum(bounds.lower - tolerance, -tolerance - bounds.upper)
  out = {"fired": False, "slice": "", "gap": 0.0, "lower": None, "upper": None,
         "tags": bounds.as_dict()}  # fmt: skip
  if len(bounds.names):
    j = int(np.argmax(excess))
    out.update(fired=bool(excess[j] > 0), slice=bounds.names[j], gap=float(bounds.mean[j]),
               lower=float(bounds.lower[j]), upper=float(bounds.upper[j]))  # fmt: skip
  return out


def shift_test(now: SliceBounds, before: SliceBounds, tolerance: float) -> dict:
  """The shift test of the module docstring over the tags both points have: {fired, slice
  (the worst), gap (now), before (at update 0), apart (the sequences' distance)}."""
  out = {"fired": False, "slice": "", "gap": 0.0, "before": 0.0, "apart": 0.0}
  worst = -np.inf
  for j, name in enumerate(now.names):
    if name not in before.names:
      continue
    i = before.names.index(name)
    apart = max(now.lower[j] - before.upper[i], before.lower[i] - now.upper[j])
    if apart - tolerance > worst:
      worst = apart - tolerance
      out.update(fired=bool(apart > tolerance), slice=name, gap=float(now.mean[j]),
                 before=float(before.mean[i]), apart=float(apart))  # fmt: skip
  return out


def shift_alpha(alpha: float, index: int) -> float:
  """The budget of one point's tag sequences in the shift test: alpha / 2 for update 0's
  (index 0), the other half spent over the later points (index 1, 2, ...)."""
  return alpha / 2 if index == 0 else spent_alpha(alpha / 2, index - 1)
