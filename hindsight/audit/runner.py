"""`hindsight audit`: spot-check a served credit model against rollouts, under a budget.

  1. the pool (`audit.pool`): trajectories of `--env` (fresh) or `--trajectories`;
  2. the model scores every step of it; the design (`audit.design`) mixes uniform draws with
     the model's most uncertain steps and those where it disagrees most with the outcome,
     and gives every draw its importance weight w = 1 / (N p);
  3. draws are labeled in order by rollouts, K keep and K replace branches from the step's
     saved state (`Labeler.label_steps`; `block` draws per call while even their worst
     case fits the budget, then one at a time), until the next draw could overrun the budget
     of env steps (a step t of a horizon-H environment costs at most 2 K (H - t));
  4. the alarm (`metrics.sequential`) is evaluated after every draw: the confidence sequences
     of the mean gap g = predicted mean - rollout credit (terms w g), of the model's interval
     coverage (terms w 1[covered]) and of each tag's own mean gap (terms w g 1[tag] / p_tag,
     so opposite drifts on two tags cannot cancel); it may be read at any time with
     false-alarm rate <= alpha;
  5. the gap per slice (tag, position, outcome) with bootstrap CIs over draws;
  6. OUT/report.json, OUT/report.md, OUT/alarm.png, OUT/draws.npz, and the audited steps as
     a label dataset OUT/labels (`audit.dataset`) to fine-tune on (`--config.init_from`).

Keys: everything flows from `--seed`: the pool (seed + AUDIT_SEED_OFFSET), and from
fold_in(key(seed), AUDIT_SALT) the draws (draws 1024 b .. 1024 b + 1023 from fold_in(k_draw,
b)), draw j's rollouts (fold_in(k_label, j)) and its PIT tie-break (fold_in(k_pit, j)); none
depends on the block size or the budget, so a rerun gives the same audit and a larger budget
extends it (the first draw that could overrun the budget ends it: a stopping time, which
the confidence sequences allow).
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import numpy as np

from hindsight.audit import pool as pool_lib
from hindsight.audit.backend import (
  AuditBackend,
  RolloutSteps,
  StepLabeler,
  audit_backend,
  step_labeler,
)
from hindsight.audit.config import AUDIT_SALT, AuditConfig
from hindsight.audit.design import mixture_design, outcome_signal
from hindsight.data.labels import open_labels
from hindsight.envs.families import family_of
from hindsight.errors import HindsightError, make_dir
from hindsight.files import atomic_savez
from hindsight.labeling.config import LabelConfig, make_labeled
from hindsight.labeling.engine import Labeler
from hindsight.metrics.drift import pit
from hindsight.metrics.sequential import AlarmConfig, SliceTerms, drift_alarm
from hindsight.model.predictor import Predictor, training_run
from hindsight.progress import CompileAwareBar

DRAW_BLOCK = 1024  # draws generated per key (fixed: the sequence must not depend on --block)
PREDICTION_FIELDS = ("credit", "mean", "std", "p_zero", "mu", "sigma")
LABEL_FIELDS = ("credit", "credit_stderr", "credit_bounded", "klass", "rollout_steps")
# Tags below this share of the pool get no slice of the alarm (`_slice_terms`).
MIN_SLICE_SHARE = 0.02


@dataclasses.dataclass
class Draws:
  """The audited draws in order: pool step index, rollout label fields, cost ([n] each)."""

  step: np.ndarray
  label: dict[str, np.ndarray]

  @property
  def size(self) -> int:
    return int(self.step.size)


def prepare_audit(cfg: AuditConfig):
  """(predictor, label config, env spec, step labeler, pool) of an audit (nothing written),
  by the backend of the family the model's labels came from (`audit.backend`)."""
  return _prepare(cfg)[1:]


def _prepare(cfg: AuditConfig):
  """(the audit's backend, then what `prepare_audit` returns)."""
  predictor = Predictor.load(cfg.checkpoint, cfg.step)
  run = training_run(cfg.checkpoint)
  meta = open_labels(run["labels"]).metadata
  backend = audit_backend(meta.env, FUNCTIONAL)
  return backend, predictor, *backend.prepare(cfg, predictor, meta, cfg.out)


def _prepare_functional(cfg: AuditConfig, predictor, meta, out: str):
  """The pool of a functional environment's model: fresh episodes of --env, a label
  dataset, or a file of (seed, episode) lines; its steps branched by the engine."""
  del predictor, out
  label_cfg = LabelConfig.from_metadata(meta, num_rollouts=cfg.rollouts)
  dataset, file_episodes = None, None
  if cfg.trajectories is not None:
    found = pool_lib.dataset_env(cfg.trajectories)
    if found is not None:
      dataset, spec = found
    else:
      spec, file_episodes = pool_lib.read_trajectory_file(cfg.trajectories, cfg.episodes)
      spec = spec or meta.env
  else:
    spec = cfg.env
  if not spec or not family_of(spec).functional:
    raise HindsightError(
      f"cannot audit '{spec}': branching needs a functional JAX environment (Gymnasium, "
      "dm_env and text traces are labeled by `hindsight label` only)"
    )
  # A dataset audited is built as it was labeled; else as the model's labels were.
  env, policy = make_labeled(meta if dataset is None else dataset.metadata, spec)
  labeler = Labeler(env, policy, label_cfg)
  if dataset is not None:
    pool = pool_lib.from_dataset(labeler, dataset, cfg.episodes)
  elif file_episodes is not None:
    pool = pool_lib.from_file(labeler, cfg.trajectories, file_episodes)
  else:
    pool = pool_lib.from_env(labeler, spec, cfg.episodes, cfg.seed)
  return label_cfg, spec, RolloutSteps(labeler), pool


FUNCTIONAL = AuditBackend(_prepare_functional)


def _flat_steps(pool: pool_lib.Pool, predictor: Predictor, labeler: StepLabeler) -> dict:
  """Every auditable step of the pool (valid, credit defined), flat [N]: episode, t, the
  model's outputs, the return range of its state, tag, outcome, position."""
  try:
    scores = predictor.score(pool.episodes)
  except HindsightError as e:
    raise HindsightError(f"the trajectories do not fit the model: {e}") from None
  undefined, bounds = jax.device_get(labeler.step_info(pool.traj))
  mask = np.asarray(pool.traj.mask) & ~np.asarray(undefined)
  if not np.isfinite(bounds[mask]).all():
    # The confidence sequences need every gap term in a known range: without one they are
    # NaN, and a NaN must never read as "no alarm".
    raise HindsightError(
      f"{labeler.env.name} declares no range for its returns, which the audit's confidence "
      "sequences need: label with --return-range LO:HI (the audit takes it from the labels)"
    )
  episode, t = np.nonzero(mask)
  lengths = pool.lengths
  out = {"episode": episode, "t": t, "length": lengths[episode]}
  for name in PREDICTION_FIELDS:
    out[f"model_{name}"] = np.array([scores[e][name][s] for e, s in zip(episode, t, strict=True)])
  out["lo"], out["hi"] = bounds[episode, t, 0], bounds[episode, t, 1]
  out["tag"] = np.array([pool.episodes[e].tags[s] for e, s in zip(episode, t, strict=True)])
  out["success"] = np.array([pool.episodes[e].success for e in episode])
  returns = np.array([e.episode_return for e in pool.episodes])
  out["outcome"] = outcome_signal(returns, lengths)[episode]
  return out


def _label_draws(cfg, labeler, pool, steps, design, keys, tolerance: float) -> Draws:
  """Draws labeled in order until the next one could overrun the budget (or the alarm
  fires, with stop_at_alarm; `alarm` is then re-evaluated after each block)."""
  K, unit = labeler.config.num_rollouts, labeler.cost_unit
  cost_bound = labeler.cost_bound(steps)  # what a draw may cost at most
  k_draw, k_label = keys
  label_fn = labeler.label_steps
  B = cfg.block
  picked: list[int] = []
  labels: dict[str, list] = {k: [] for k in LABEL_FIELDS}
  spent, j = 0, 0
  block_cache: dict[int, np.ndarray] = {}

  def draw(j):
    b = j // DRAW_BLOCK
    if b not in block_cache:
      block_cache.clear()
      block_cache[b] = design.draw(k_draw, b, DRAW_BLOCK)
    return int(block_cache[b][j % DRAW_BLOCK])

  first = draw(0)
  if cost_bound[first] > cfg.budget:
    raise HindsightError(
      f"--budget {cfg.budget} {unit} cannot pay for one audited step: the first one drawn "
      f"may cost {int(cost_bound[first])} {unit} ({K} rollouts per arm); raise --budget or "
      "lower --rollouts"
    )
  bar = CompileAwareBar(total=cfg.budget, desc="audit", unit=unit.rstrip("s"),
                        disable=not cfg.progress)  # fmt: skip
  with bar:
    while True:
      # A whole block when even its worst case fits the budget, else draws one at a time: so
      # draw j is taken iff (spent before j) + (its cost bound) fits, whatever --block is.
      take = [draw(j + i) for i in range(B)]
      size = B
      if spent + int(cost_bound[take].sum()) > cfg.budget:
        if spent + cost_bound[take[0]] > cfg.budget:
          break
        take, size = take[:1], 1
      ep, ts = steps["episode"][take], steps["t"][take]
      draw_keys = jax.vmap(lambda i: jax.random.fold_in(k_label, i))(np.arange(j, j + size))
      traj = jax.tree.map(lambda x, ep=ep: x[ep], pool.traj)
      out = jax.device_get(label_fn(traj, ts.astype(np.int32), draw_keys))
      for k in LABEL_FIELDS:
        labels[k].append(np.asarray(out[k]))
      cost = int(np.asarray(out["rollout_steps"]).sum())
      spent += cost
      picked.extend(take)
      j += size
      bar.update(cost)
      bar.set_postfix(draws=j)
      if cfg.stop_at_alarm and _alarm_now(cfg, steps, design, picked, labels, tolerance):
        break
  label = {k: np.concatenate(v) for k, v in labels.items()}
  return Draws(step=np.asarray(picked, np.int64), label=label)


def _alarm_now(cfg, steps, design, picked, labels, tolerance: float) -> bool:
  """Whether the alarm has fired after the draws so far."""
  draws = Draws(np.asarray(picked), {k: np.concatenate(v) for k, v in labels.items()})
  terms = _terms(cfg, steps, design, draws, _pit_ties(cfg, draws.size), tolerance)
  return drift_alarm(*terms).first is not None


def _pit_ties(cfg: AuditConfig, n: int) -> np.ndarray:
  """v_j ~ U(0, 1) of draw j (the PIT's tie-break on the atom at 0), from its own key."""
  root = jax.random.fold_in(jax.random.fold_in(jax.random.key(cfg.seed), AUDIT_SALT), 2)
  return np.asarray(
    jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(root, i)))(np.arange(n))
  )


def tolerance_of(cfg: AuditConfig, predictor: Predictor) -> float:
  """--gap-tolerance, or a tenth of the model's credit scale (the std of its training
  credits)."""
  return cfg.gap_tolerance or 0.1 * float(predictor.spec.value_scale)


def _terms(cfg, steps, design, draws: Draws, ties: np.ndarray, tolerance: float):
  """The arguments of `drift_alarm` for the draws: (gap terms w g [n], coverage terms
  w 1[covered] [n], the range every gap term of the pool lies in, the coverage terms'
  range, AlarmConfig, the per-tag SliceTerms)."""
  s, lab = draws.step, draws.label
  w = design.weights[s]
  # The predicted mixture's mean, E[credit]: the median ("credit") is 0 wherever a tie is
  # likelier than not, which is no estimate of the mean a rollout label estimates.
  gap = steps["model_mean"][s] - lab["credit"]
  sigma = np.sqrt(np.square(steps["model_sigma"][s]) + np.square(lab["credit_stderr"]))
  u = pit(lab["credit"], steps["model_p_zero"][s], steps["model_mu"][s], sigma, v=ties)
  covered = np.abs(u - 0.5) <= cfg.coverage_level / 2
  all_w = design.weights
  width = steps["hi"] - steps["lo"]
  pred = steps["model_mean"]
  gap_range = (float(np.min(all_w * (pred - width))), float(np.max(all_w * (pred + width))))
  if gap_range[1] <= gap_range[0]:
    gap_range = (gap_range[0], gap_range[0] + 1e-6)
  alarm_cfg = AlarmConfig(
    gap_tolerance=tolerance,
    alpha=cfg.alpha,
    level=cfg.coverage_level,
    coverage_tolerance=cfg.coverage_tolerance,
  )
  slices = _slice_terms(steps, s, w * gap, all_w * (pred - width), all_w * (pred + width))
  return w * gap, w * covered, gap_range, (0.0, design.max_weight), alarm_cfg, slices


def _slice_terms(steps, s, weighted_gap, lowest, highest) -> SliceTerms:
  """The per-tag terms of the slice alarm (`metrics.sequential`): x = w g 1[tag] / p_tag for
  every tag holding at least MIN_SLICE_SHARE of the pool (rarer tags would spend the error
  budget on confidence sequences too wide to ever fire), each with its range over the pool
  (0 included: a draw from another slice contributes 0)."""
  tags = steps["tag"]
  names, terms, ranges = [], [], []
  for name in sorted(set(tags.tolist())):
    inside = tags == name
    share = inside.mean()
    if share < MIN_SLICE_SHARE:
      continue
    names.append(str(name))
    terms.append(np.where(inside[s], weighted_gap, 0.0) / share)
    lo, hi = min(0.0, lowest[inside].min()) / share, max(0.0, highest[inside].max()) / share
    ranges.append((lo, hi if hi > lo else lo + 1e-6))
  n = len(s)
  return SliceTerms(
    tuple(names), np.asarray(terms, np.float64).reshape(len(names), n), np.asarray(ranges)
  )


@dataclasses.dataclass
class AuditResult:
  """What an audit found: the pool's steps, the design, the labeled draws, the alarm's
  inputs (`_terms`) and its trace."""

  steps: dict
  design: object
  draws: Draws
  terms: tuple
  trace: object


def audit_pool(cfg: AuditConfig, predictor, labeler, pool, tolerance: float):
  """Design, draws, rollouts and the alarm over one pool (no files written). `predictor`
  needs only `score(episodes)` (tests audit a known-exact predictor through it); `labeler`
  is a `StepLabeler` (an engine `Labeler` is wrapped in `RolloutSteps`)."""
  labeler = step_labeler(labeler)
  steps = _flat_steps(pool, predictor, labeler)
  if steps["t"].size == 0:
    raise HindsightError("the audited trajectories hold no step with a defined credit")
  dis = np.abs(steps["model_mean"] - steps["outcome"])
  design = mixture_design(steps["model_std"], dis, cfg.shares)
  root = jax.random.fold_in(jax.random.key(cfg.seed), AUDIT_SALT)
  keys = (jax.random.fold_in(root, 0), jax.random.fold_in(root, 1))
  draws = _label_draws(cfg, labeler, pool, steps, design, keys, tolerance)
  ties = _pit_ties(cfg, draws.size)
  terms = _terms(cfg, steps, design, draws, ties, tolerance)
  trace = drift_alarm(*terms)
  if cfg.stop_at_alarm and trace.first is not None:
    keep = trace.first + 1  # what was labeled after the firing draw is not reported
    draws = Draws(draws.step[:keep], {k: v[:keep] for k, v in draws.label.items()})
    terms = _terms(cfg, steps, design, draws, ties[:keep], tolerance)
    trace = drift_alarm(*terms)
  return AuditResult(steps, design, draws, terms, trace)


def run_audit(cfg: AuditConfig) -> dict:
  """The whole audit; returns the report (also written under cfg.out)."""
  cfg.check()
  tic = time.perf_counter()
  backend, predictor, label_cfg, spec, labeler, pool = _prepare(cfg)
  tolerance = tolerance_of(cfg, predictor)
  AlarmConfig(tolerance, cfg.alpha, cfg.coverage_level, cfg.coverage_tolerance).check()
  out = make_dir(cfg.out, "--out")
  for name in ("report.json", "report.md"):  # an older audit's verdict must not outlive it
    if os.path.exists(os.path.join(out, name)):
      os.remove(os.path.join(out, name))
  res = audit_pool(cfg, predictor, labeler, pool, tolerance)
  steps, design, draws, trace = res.steps, res.design, res.draws, res.trace

  from hindsight.audit import dataset as dataset_lib
  from hindsight.audit import report as report_lib

  report = report_lib.build_report(cfg, predictor, label_cfg, spec, pool, res, tolerance)
  labels_dir = os.path.join(out, "labels")
  report["budget_unit"] = labeler.cost_unit
  report["labels"] = None
  if backend.writes_labels:
    report["labels"] = dataset_lib.write_audit_labels(
      labels_dir, labeler, spec, pool, steps, draws, label_cfg, cfg, predictor
    )
  atomic_savez(
    os.path.join(out, "draws.npz"),
    {
      "episode": steps["episode"][draws.step],
      "t": steps["t"][draws.step],
      "weight": design.weights[draws.step],
      "prediction": steps["model_mean"][draws.step],
      **{f"label_{k}": v for k, v in draws.label.items()},
      "gap_lower": trace.gap_lower,
      "gap_upper": trace.gap_upper,
      "coverage_upper": trace.coverage_upper,
    },
  )
  report["seconds"] = round(time.perf_counter() - tic, 1)
  report_lib.write_report(out, report, trace, draws)
  report["out"] = out
  return report
