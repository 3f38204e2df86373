"""The drift harness: a trained credit model, its training labels and every baseline, held
against the reference credit on the same steps (`hindsight eval`), for a run of any family.

  1. the evaluated sets and their reference, from the backend of the family the run's labels
     came from (`drift.backend`: functional environments, `drift.functional`; text traces,
     the text plug-in's `text.evaluate`);
  2. signals per step: the model (Predictor), its training labels, outcome, MC progress and
     hard estimation, the learned baselines (`drift.baselines`) and the backend's own;
  3. metrics with bootstrap CIs (`metrics.drift`), calibration, classes, equivalent rollouts,
     slices, per-tag means (`drift.report`); the backend's own entries (the policy-gradient
     table of a tabular MDP).
`drift.render` writes report.md, report.json and the plots.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import numpy as np

from hindsight.drift import baselines as bl
from hindsight.drift import reference as ref_lib
from hindsight.drift.backend import drift_backend
from hindsight.drift.config import DriftConfig
from hindsight.drift.functional import FUNCTIONAL, FunctionalEvaluation, open_functional, test_ids
from hindsight.drift.sets import EpisodeSet, Run, open_run
from hindsight.errors import HindsightError, make_dir
from hindsight.files import finished_report, mark_finished
from hindsight.metrics.drift import MIN_EPISODES
from hindsight.model.batching import EpisodeReader
from hindsight.model.predictor import load_predictor


def _default_out(run: Run) -> str:
  name = "drift" if len(run.workdirs) == 1 else f"drift_ensemble{len(run.workdirs)}"
  return os.path.join(run.workdirs[0], name)


def held_out_split(workdir: str) -> tuple[object, np.ndarray]:
  """(label dataset, int64 [n] episode ids) of a training run's test split: the episodes
  `hindsight eval` scores (`Episode.from_example(labels[i])` for each id)."""
  run = open_run(workdir)
  return run.labels, run.test_ids


def reference_credit(
  checkpoint: str,
  episodes: int = 0,
  reference_rollouts: int = 0,
  cache: str = "",
  progress: bool = True,
) -> EpisodeSet:
  """The reference credit of a run's test split on a functional environment, as `hindsight
  eval` computes it (the DP on tabular environments, else the regenerated trajectories
  relabeled at K_ref with independent keys), from the same cache (default
  CHECKPOINT/drift/cache): after an eval, this loads its arrays. Returns the EpisodeSet:
  `.episodes`, `.reference` (fields [n, H]), `.cols` (per valid step: `ref_credit`,
  `label_credit`, tags, ...)."""
  cfg = DriftConfig(
    checkpoint=checkpoint,
    episodes=episodes,
    reference_rollouts=reference_rollouts,
    cache=cache,
    progress=progress,
  )
  cfg.check()
  run = open_run(checkpoint)
  ev: FunctionalEvaluation = open_functional(cfg, run, None, _default_out(run))
  return ev.test_split_set(test_ids(cfg, run))[0]


def _check_episodes(cfg: DriftConfig, run) -> None:
  """Before any work: the evaluated set must hold MIN_EPISODES episodes (its intervals
  resample episodes)."""
  given = cfg.episodes if cfg.env else len(test_ids(cfg, run))
  if cfg.env and cfg.episodes == 0:
    return  # fresh episodes at the backend's default count
  if given < MIN_EPISODES:
    where = "--episodes" if cfg.env or cfg.episodes else "the run's test split"
    raise HindsightError(
      f"{where} holds {given} episode(s); the report's bootstrap intervals need at least "
      f"{MIN_EPISODES} (label more episodes, or train with a larger data.test_fraction)"
    )


def run_drift(cfg: DriftConfig) -> dict:
  """The whole harness; returns the report (also written under cfg.out)."""
  cfg.check()
  tic = time.perf_counter()
  predictor = load_predictor(cfg.checkpoint, cfg.step)
  versus = load_predictor(cfg.versus, "run") if cfg.versus else None
  run = open_run(cfg.checkpoint)
  _check_episodes(cfg, run)
  out = make_dir(cfg.out or _default_out(run), "--out")
  backend = drift_backend(run.labels.metadata.env, FUNCTIONAL)
  ev = backend.open(cfg, run, predictor, out)
  inputs = _inputs_key(cfg, [predictor, versus], ev.cache.digest)
  finished = finished_report(out, inputs)
  if finished is not None:
    return {**finished, "out": out}
  base = run.base
  report: dict = {
    "checkpoint": ",".join(os.path.abspath(w) for w in run.workdirs),
    "model": predictor.describe(),
    **(
      {"versus": {"run": os.path.abspath(cfg.versus), "model": versus.describe()}}
      if versus is not None
      else {}
    ),
    "labels": os.path.abspath(run.record["labels"]),
    "env": ev.env,
    "replacement": base.replacement,
    "label_rollouts": base.num_rollouts,
    "reference": ev.reference(),
  }
  main, shift_sets, checked = ev.sets()
  report["reference"].update(checked)
  report["reference"].update(_noise_ratio(main.cols))
  sets = [main, *shift_sets]
  score_seconds, models = _add_signals(cfg, ev, predictor, run, sets)
  if versus is not None:
    for s in sets:
      scores = versus.score(s.episodes, allow_longer=True)
      s.add_episode_signal("versus_credit", [sc["credit"] for sc in scores])
  ev.add_signals(sets)

  from hindsight.drift.render import write_report
  from hindsight.drift.report import build_report

  report["seconds"] = {"model_scoring": round(score_seconds, 2)}
  k_ref = report["reference"]["rollouts"]
  options = ev.report_options
  k_label = base.num_rollouts
  report.update(
    build_report(cfg, predictor, main, shift_sets, k_label, k_ref, score_seconds, **options)
  )
  report.update(ev.finish(report, predictor, models))
  report["seconds"]["total"] = round(time.perf_counter() - tic, 1)
  write_report(out, report, main, shift_sets)
  mark_finished(out, inputs)  # last, after the report and its plots
  report["out"] = out
  return report


def _inputs_key(cfg: DriftConfig, predictors: list, digest: str) -> str:
  """Everything the report depends on: the config (but where it is written and whether
  bars show), the models' parameters (None: none), the labels, the hindsight version."""
  import hashlib
  from importlib.metadata import version

  params = hashlib.sha256()
  for predictor in (p for p in predictors if p is not None):
    for leaf in jax.tree.leaves(predictor.state):
      params.update(np.asarray(leaf).tobytes())
  config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out", "progress")}
  return ref_lib.cache_key(config=config, params=params.hexdigest(), data=digest,
                           version=version("hindsight"))  # fmt: skip


def _add_signals(cfg: DriftConfig, ev, predictor, run: Run, sets: list[EpisodeSet]):
  """Signals on every set: the model (timed after one untimed pass that compiles), the
  outcome, and the learned baselines the backend asks for. Returns (model scoring seconds,
  learned baselines). Shifted sets may run longer than the model was trained on: that is
  the slice they read."""
  predictor.score(sets[0].episodes, allow_longer=True)
  tic = time.perf_counter()
  for s in sets:
    scores = predictor.score(s.episodes, allow_longer=True)
    for name in ("credit", "mean", "std", "p_zero", "mu", "sigma", "klass"):
      s.add_episode_signal(f"model_{name}", [sc[name] for sc in scores])
  seconds = time.perf_counter() - tic
  for s in sets:
    s.add_episode_signal("outcome", [np.full(len(e), e.episode_return) for e in s.episodes])
  models = []
  if cfg.baseline_steps and ev.learned:
    models = _learned_baselines(cfg, ev, predictor, EpisodeReader(run.labels), run.record)
  for m in models:
    for s in sets:
      s.add_episode_signal(
        m.kind, m.credit(functools.partial(predictor.batch, allow_longer=True), s.episodes)
      )
  return seconds, models


def _noise_ratio(cols: dict) -> dict:
  """The reference's RMS sample stderr / the std of its credit (the 'stated small
  fraction'), the share of steps whose stderr is a tie bound instead (left out), and the
  share of steps whose reference credit is exactly 0."""
  c, se = cols["ref_credit"], cols["ref_credit_stderr"]
  bounded = cols["ref_credit_bounded"].astype(bool)
  ok = np.isfinite(c)
  sample = ok & ~bounded
  rms = float(np.sqrt(np.mean(np.square(se[sample])))) if sample.any() else 0.0
  return {
    "stderr_over_spread": rms / max(float(np.std(c[ok])), 1e-12),
    "tie_bounded_share": float(np.mean(bounded[ok])),
    # Mostly exact zeros: a Spearman against it mostly ranks ties (renderers say so).
    "exact_zero_share": float(np.mean(c[ok] == 0.0)),
  }


def _learned_baselines(cfg: DriftConfig, ev, predictor, reader, run) -> list:
  """The backend's learned baselines (prm, td_advantage, rudder) trained on the run's
  training split (outcomes only), cached beside the reference (keyed by the labels, the
  split, the model config and the baseline config): a rerun that changes nothing trains
  nothing."""
  spec = predictor.spec
  train_ids = np.asarray(run["train"], np.int64)
  steps = cfg.baseline_steps if cfg.baseline_steps > 0 else bl.scaled_steps(train_ids.size)
  bcfg = bl.BaselineConfig(steps=steps, seed=cfg.seed)
  split = bl.TrainingSplit.of(reader, train_ids, spec, bcfg.batch_size, cfg.seed)
  batches, bases, return_scale = split.batches, split.bases, split.return_scale
  models = []
  for kind in ev.learned:

    def train(kind=kind):
      _, state = bl.train_history_model(
        kind, batches, spec, predictor.model_config, bcfg, return_scale, cfg.progress
      )
      return bl.state_arrays(state)

    arrays = ev.cache.cached(
      f"baseline_{kind}",
      train,
      data=ev.cache.digest,
      train_ids=ref_lib.cache_key(ids=train_ids.tolist()),
      model=dataclasses.asdict(predictor.model_config),
      spec=json.loads(spec.to_json()),
      baseline=dataclasses.asdict(bcfg),
    )
    graphdef, state = bl.history_model_from_arrays(kind, spec, predictor.model_config, arrays)
    models.append(bl.LearnedBaseline(kind, graphdef, state, bases[kind], return_scale))
  return models


__all__ = ["DriftConfig", "EpisodeSet", "held_out_split", "reference_credit", "run_drift"]
