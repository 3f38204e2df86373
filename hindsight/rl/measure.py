"""What an RL run is judged by, at every evaluation point: fresh episodes of the current
policy labeled by a reference labeler (K = eval.rollouts, keys of their own), never by the
signal being trained on.

Per seed: success rate, mean trace length, mean return, the share of the valid steps in
each reference class (KLASS_NAMES: decorative, load_bearing, harmful, undetermined, by the
labels' own rule at the labeler's tolerance and confidence) and in each environment tag
(on `reasoning` the tags are the planted roles), and, for sources with a model
(`CreditSource.probe`), its drift from the reference: mean gap (prediction - reference
credit), MAE and Spearman over the valid steps, the per-tag test of those gaps
(`rl.refresh.gap_test`: does the model describe this policy's credit?) and the per-tag test
of their change since update 0 (`rl.refresh.shift_test`), both with the audit's confidence
sequences, anytime-valid over the run's points; the second's firing is the `credit_drift`
warning: the policy has left the model's support. A metric that is
undefined is null with the reason beside it (`spearman_note`: the reference credit is
constant, ...), and `warnings` lists what voids the point's class shares (most reference
steps undetermined) or its episodes (a fitted horizon that cuts them), and `credit_drift`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from hindsight.credit.names import KLASS_NAMES
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.engine import Labeler
from hindsight.labeling.rollout import episode_length, sample_episode
from hindsight.labeling.trajectories import trajectory_batch
from hindsight.metrics.sequential import SliceBounds, slice_sequences
from hindsight.rl.refresh import bounded_ranges, gap_test, shift_alpha, shift_test, tag_slices
from hindsight.rl.task import Task

# Above this share of undetermined reference steps the class shares say nothing.
UNDETERMINED_WARNING = 0.5


def decorative_tags_of(env) -> list[str]:
  """The planted decorative tags of an environment (reasoning's), else none: the
  decorative share counts them rather than the reference's decorative class."""
  return [t for t in ("restate", "verify", "search_unused") if t in env.tag_names]


EVAL_STREAM = 2  # the evaluation points' keys (the audits of `rl.sources.refresh` take 3)


def point_keys(seed_key: jax.Array, stream: int, update: int, n: int) -> jax.Array:
  """n episode keys of one (stream, update) of a seed: 2 = evaluation, 3 = refresh audits.
  The training updates draw from stream 1 (`ppo.Programs.init`), so none overlap."""
  root = jax.random.fold_in(jax.random.fold_in(seed_key, stream), update)
  return jax.vmap(jax.random.fold_in, (None, 0))(root, jnp.arange(n))


class LabeledSampler:
  """Samples and labels episodes of pi_theta for any theta, compiled once per labeler."""

  def __init__(self, task: Task, config: LabelConfig):
    self.task = task
    self.labeler = Labeler(task.env, task.policy, config)
    sample = functools.partial(sample_episode, task.env, task.policy, task.env_params)
    self._run = jax.jit(
      lambda params, keys: self._labeled(jax.vmap(sample, (None, 0))(params, keys), params, keys)
    )
    self._declared_lengths = None
    if task.declared is not None:  # a fitted horizon: the same episodes at the declared cap
      env = task.declared
      length = functools.partial(episode_length, env, task.policy, env.default_params())
      self._declared_lengths = jax.jit(jax.vmap(length, (None, 0)))

  def _labeled(self, traj, params, keys):
    labels = self.labeler.label_under(params, traj, keys)
    return traj, labels, trajectory_batch(self.task.env, traj, labels)

  def __call__(self, params, keys):
    """(trajectories, labels, labeled batch) of the episodes of `keys` under `params`."""
    return self._run(params, keys)

  def cut_share(self, params, keys) -> float | None:
    """With a fitted horizon, the share of the episodes of `keys` that run longer than it
    at the environment's declared cap (None: the horizon was not fitted)."""
    if self._declared_lengths is None:
      return None
    lengths = np.asarray(self._declared_lengths(params, keys))
    return float(np.mean(lengths > self.task.env.horizon))


def evaluate_point(
  sampler: LabeledSampler,
  params,
  keys,
  score=None,
  model_state=None,
  drift_test=(0.02, 0.05, "asymptotic"),
  probe=None,
  before: dict | None = None,
  index: int = 0,
):
  """The measurements of the module docstring for one seed (plain floats); score: the
  source's jitted prediction (`CreditSource.probe`: sources with a model), model_state its
  state, drift_test (tolerance, alpha, boundary) the per-tag tests (`rl.refresh`), and before the
  per-tag gap statistics of the run's first point (`drift.tags` of update 0), against which
  `credit_drift` tests this point's; probe: the source's `Probe`, whose `consequence` the
  warning says; index: the point's place in the run (0 at update 0), which spends the
  tests' error budget (`rl.refresh`)."""
  traj, labels, batch = jax.device_get(sampler(params, keys))
  mask = np.asarray(traj.mask)
  n_valid = max(int(mask.sum()), 1)
  klass = np.asarray(labels["klass"])[mask]
  out = {
    "success": float(np.mean(traj.success)),
    "length": float(mask.sum(-1).mean()),
    "return": float(np.asarray(traj.rewards).sum(-1).mean()),
    "klass_share": {k: float(np.sum(klass == i) / n_valid) for i, k in enumerate(KLASS_NAMES)},
  }
  env = sampler.task.env
  if env.tag_names:
    tags = np.asarray(labels["tags"])[mask]
    out["tag_share"] = {t: float(np.sum(tags == i) / n_valid) for i, t in enumerate(env.tag_names)}
  warnings = {}  # kind -> message
  if score is not None:
    pred = np.asarray(score(model_state, traj, batch))[mask]
    ref = np.asarray(labels["credit"])[mask]
    slices, names = tag_slices(env, labels)
    ok = np.isfinite(ref)
    boundary = drift_test[2]
    valid = mask & np.isfinite(np.asarray(labels["credit"]))
    ranges, testable = bounded_ranges(boundary, sampler.labeler, traj, pred[ok], valid,
                                      slices[mask][ok], len(names))  # fmt: skip
    out["drift"], found = drift_tests(pred, ref, slices[mask], names, drift_test, index, before,
                                      probe, ranges, testable)  # fmt: skip
    warnings.update(found)
  undetermined = out["klass_share"]["undetermined"]
  # Where the environment plants its decorative steps (reasoning), the decorative share is
  # read off the tags, not the reference's classes: nothing reported rests on them.
  if undetermined > UNDETERMINED_WARNING and not decorative_tags_of(env):
    fix = ("set return_range=LO:HI: without bounds a tied step has no finite stderr"
           if not sampler.task.bounded else "more eval.rollouts narrow the intervals")  # fmt: skip
    warnings["undetermined"] = (
      f"{undetermined:.0%} of the reference's steps are undetermined, so its class shares "
      f"measure nothing ({fix})"
    )
  cut = sampler.cut_share(params, keys)
  if cut is not None:
    out["cut_share"] = cut
    if cut > 0:
      warnings["horizon_cut"] = (
        f"the fitted horizon {env.horizon} cuts {cut:.0%} of the policy's episodes (set "
        "horizon, up to the environment's declared cap)"
      )
  out["warnings"] = warnings
  return out


def drift_tests(
  pred: np.ndarray, ref: np.ndarray, slices: np.ndarray, names, drift_test, index: int,
  before: dict | None, probe, ranges: np.ndarray | None = None, testable: bool = True,
) -> tuple[dict, dict]:  # fmt: skip
  """(drift record, warnings) of one evaluation point's predictions `pred` against the
  reference credit `ref` over its steps (flat [n]; slices [n]: each step's tag index into
  `names`): `drift`'s scores, the per-tag gap test (`audit`), the per-tag sequences
  (`tags`, the next points' `before`) and, given update 0's (`before`), the shift test,
  whose firing is the `credit_drift` warning when `probe.warns` (saying
  `probe.consequence`). drift_test: (tolerance, alpha, boundary); ranges: the bounded
  sequences' `gap_ranges` (testable False: no return range, no test)."""
  out = drift(pred, ref)
  warnings = {}
  ok = np.isfinite(ref)
  gaps, slices = (pred - ref)[ok], slices[ok]
  tolerance, alpha, boundary = drift_test
  if not testable:
    # The bounded sequences need every gap in a known range: without return bounds, no test.
    out["audit"] = {"fired": False, "undefined": "no return range"}
    return out, warnings
  # how far the model is from this policy's credit, per tag (its own error included) ...
  audit = gap_test(gaps, slices, names, ranges, tolerance, alpha, index, boundary)
  audit.pop("tags")
  out["audit"] = audit
  now = slice_sequences(gaps, slices, names, ranges, shift_alpha(alpha, index), boundary=boundary)
  out["tags"] = now.as_dict()
  if before is not None:
    # ... and whether that distance has moved since the first point: the policy has left the
    # states and actions the model described as it did then
    shift = shift_test(now, SliceBounds.from_dict(before), tolerance)
    out["shift"] = shift
    if shift["fired"] and probe.warns:
      warnings["credit_drift"] = (
        f"the credit model's gap on '{shift['slice']}' steps moved from "
        f"{shift['before']:+.3f} at update 0 to {shift['gap']:+.3f} against the "
        f"reference, its confidence sequences {shift['apart']:.3f} apart (tolerance "
        f"{tolerance:g}, alpha {alpha:g} over the run): the policy has left the model's "
        f"support: {probe.consequence}"
      )  # fmt: skip
  return out, warnings


def drift(pred: np.ndarray, ref: np.ndarray) -> dict:
  """Mean gap (pred - ref), MAE and Spearman over the steps with a finite reference; an
  undefined one is None, said why in `NAME_note`."""
  ok = np.isfinite(ref)
  pred, ref = pred[ok], ref[ok]
  if ok.sum() == 0:
    note = "no step has a finite reference credit"
    return {"mean_gap": None, "mae": None, "spearman": None, "mean_gap_note": note,
            "mae_note": note, "spearman_note": note}  # fmt: skip
  gap = pred - ref
  out = {"mean_gap": float(gap.mean()), "mae": float(np.abs(gap).mean())}
  reason = None
  if ref.size < 3:
    reason = f"{ref.size} steps with a finite reference credit (Spearman needs 3)"
  elif np.ptp(ref) == 0:
    reason = f"the reference credit is {ref[0]:g} on every step (nothing to rank)"
  elif np.ptp(pred) == 0:
    reason = f"the prediction is {pred[0]:g} on every step (nothing to rank)"
  out["spearman"] = None if reason else float(stats.spearmanr(pred, ref).statistic)
  if reason:
    out["spearman_note"] = reason
  return out
