"""The drift harness: a trained credit model, its training labels and every baseline, held
against the reference credit on the same steps (`hindsight eval`).

  1. episodes: the run's test split (WORKDIR/splits.json), or fresh episodes of `--env`;
     shifted sets (`shifts`: another behaviour policy, a longer horizon) for the OOD slices;
  2. the reference (`drift.reference`): the DP on tabular environments, else the same
     trajectories relabeled at K_ref with independent keys; cached under OUT/cache and
     checked by a second independent pass (or, tabular, by an MC pass against the DP);
  3. signals per step: the model (Predictor), its training labels, outcome, MC progress and
     hard estimation, and the learned baselines (`drift.baselines`);
  4. metrics with bootstrap CIs (`metrics.drift`), calibration, classes, equivalent rollouts,
     slices, per-tag means; 5. the policy-gradient table on a tabular MDP (`drift.gradients`).
`drift.report` writes report.md, report.json and the plots.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time

import jax
import numpy as np

from hindsight.data.episode import Episode
from hindsight.data.labels import open_training_labels
from hindsight.drift import baselines as bl
from hindsight.drift import reference as ref_lib
from hindsight.drift.config import DriftConfig, gradient_env_for, shift_episodes_for
from hindsight.drift.gradients import gradient_table
from hindsight.envs import make
from hindsight.envs.families import family_of
from hindsight.envs.tabular import TabularEnv
from hindsight.errors import HindsightError, make_dir
from hindsight.files import atomic_savez, finished_report, mark_finished, sha256_file
from hindsight.labeling import trajectories as tr
from hindsight.labeling.config import LabelConfig, make_labeled
from hindsight.labeling.engine import Labeler
from hindsight.model.batching import EpisodeReader
from hindsight.model.predictor import checkpoint_workdirs, load_predictor, training_run

# Seeds of fresh episode sets: --seed + this (+ 1 + j for shift j), whatever the run's labels,
# so every run evaluated with --env SPEC meets the same episodes (a before/after comparison).
SHIFT_SEED_OFFSET = 1_000_003
# Caches that hold episodes carry their layout in the key: an older layout (fresh sets
# without the trajectory's `success`) is recomputed, never read.
EPISODE_CACHES, EPISODE_CACHE_FORMAT = ("fresh", "shift"), 2


class EpisodeSet:
  """One evaluated set: episodes + per-step columns over their valid steps."""

  def __init__(self, name: str, episodes: list[Episode], reference: dict, labels: dict | None):
    self.name, self.episodes, self.reference = name, episodes, reference
    lengths = np.array([len(e) for e in episodes])
    self.lengths = lengths
    mask = np.arange(reference["credit"].shape[1])[None] < lengths[:, None]
    self.mask = mask
    flat = lambda x: np.asarray(x)[mask]  # noqa: E731
    self.cols = {f"ref_{k}": flat(reference[k]) for k in ref_lib.FIELDS}
    if labels is not None:
      self.cols.update({f"label_{k}": flat(v) for k, v in labels.items() if np.ndim(v) == 2})
    self.cols["episode"] = np.repeat(np.arange(len(episodes)), lengths)
    self.cols["t"] = np.concatenate([np.arange(n) for n in lengths])
    self.cols["length"] = np.repeat(lengths, lengths)
    self.cols["success"] = np.repeat([e.success for e in episodes], lengths)
    self.cols["tag"] = np.concatenate([np.asarray(e.tags, dtype=object) for e in episodes])
    self.rollout_steps = reference.get("rollout_steps")

  def add_episode_signal(self, name: str, per_episode: list[np.ndarray]) -> None:
    self.cols[name] = np.concatenate(
      [np.asarray(v)[:n] for v, n in zip(per_episode, self.lengths, strict=True)]
    )


@dataclasses.dataclass
class _Context:
  """What every stage of run_drift shares."""

  cfg: DriftConfig
  env: object  # the evaluated environment (the dataset's, or --env)
  policy: object
  base: LabelConfig  # the training labels' config
  ref_cfg: LabelConfig  # the same at K_ref
  seed: int  # the training labels' seed
  digest: str  # of the label dataset's checksums file
  cache: str  # directory of cached arrays

  @property
  def tabular(self) -> bool:
    return isinstance(self.env, TabularEnv)

  def labeler(self, env=None, policy=None, exact_if_tabular: bool = False) -> Labeler:
    """An MC labeler at K_ref, or (exact_if_tabular) the DP where the env is tabular."""
    env = self.env if env is None else env
    policy = self.policy if policy is None else policy
    if exact_if_tabular and isinstance(env, TabularEnv):
      return Labeler(env, policy, ref_lib.reference_config(self.base, 2, exact=True))
    return Labeler(env, policy, self.ref_cfg)

  def cached(self, name: str, compute, **key) -> dict:
    """compute() once; later runs load OUT/cache/NAME-<digest of key and config>.npz."""
    key["config"] = dataclasses.asdict(self.ref_cfg)
    if name in EPISODE_CACHES:
      key["format"] = EPISODE_CACHE_FORMAT
    path = os.path.join(self.cache, f"{name}-{ref_lib.cache_key(**key)}.npz")
    hit = ref_lib.load_cached(path)
    if hit is None:
      hit = compute()
      atomic_savez(path, hit)  # a killed run leaves no half cache
    return hit


@dataclasses.dataclass
class _Run:
  """A training run (or ensemble) as the harness reads it: its labels and test split."""

  workdirs: list[str]
  record: dict  # splits.json of the first member
  labels: object  # the label dataset it trained on
  base: LabelConfig  # the labels' config
  test_ids: np.ndarray  # int64 [n] the test split's episode ids


def _open_run(checkpoint: str) -> _Run:
  """The run (or ensemble) behind a --checkpoint, refusing what cannot be relabeled."""
  workdirs = checkpoint_workdirs(checkpoint)
  record = training_run(workdirs[0])
  for w in workdirs[1:]:  # an ensemble is scored on its members' one test split
    other = training_run(w)
    if other["labels"] != record["labels"] or other["test"] != record["test"]:
      raise HindsightError(f"checkpoint {w}: trained on other labels or another split")
  labels = open_training_labels(
    record["labels"], record.get("mix_labels", ""), record.get("mix_episodes", 0)
  )
  env_spec = labels.metadata.env
  if not env_spec or not family_of(env_spec).functional:
    raise HindsightError(
      f"labels of '{env_spec}' cannot be relabeled from their seed (not a functional JAX "
      "environment): the drift harness needs a JAX environment"
    )
  base = LabelConfig.from_metadata(labels.metadata)
  return _Run(workdirs, record, labels, base, np.asarray(record["test"], np.int64))


def _default_out(run: _Run) -> str:
  name = "drift" if len(run.workdirs) == 1 else f"drift_ensemble{len(run.workdirs)}"
  return os.path.join(run.workdirs[0], name)


def _context(cfg: DriftConfig, run: _Run, out: str) -> _Context:
  """What every stage shares: the evaluated environment, K_ref and the cache."""
  meta = run.labels.metadata
  k_ref = cfg.reference_rollouts or _auto_rollouts(run.labels, run.test_ids[:256], run.base, cfg)
  env, policy = make_labeled(meta, cfg.env)
  return _Context(
    cfg=cfg,
    env=env,
    policy=policy,
    base=run.base,
    ref_cfg=ref_lib.reference_config(run.base, k_ref),
    seed=meta.seed,
    digest=sha256_file(os.path.join(run.labels.path, "hindsight_checksums.json")),
    cache=make_dir(cfg.cache or os.path.join(out, "cache"), "--cache"),
  )


def _test_ids(cfg: DriftConfig, run: _Run) -> np.ndarray:
  if run.labels.metadata.partial or run.record.get("mix_labels"):
    raise HindsightError(
      f"{cfg.checkpoint} trained on an audit's labels, whose test split cannot be "
      "regenerated from one seed: evaluate it on fresh episodes with --env SPEC"
    )
  return run.test_ids[: cfg.episodes] if cfg.episodes else run.test_ids


def held_out_split(workdir: str) -> tuple[object, np.ndarray]:
  """(label dataset, int64 [n] episode ids) of a training run's test split: the episodes
  `hindsight eval` scores (`Episode.from_example(labels[i])` for each id)."""
  run = _open_run(workdir)
  return run.labels, run.test_ids


def reference_credit(
  checkpoint: str,
  episodes: int = 0,
  reference_rollouts: int = 0,
  cache: str = "",
  progress: bool = True,
) -> EpisodeSet:
  """The reference credit of a run's test split, as `hindsight eval` computes it (the DP on
  tabular environments, else the regenerated trajectories relabeled at K_ref with
  independent keys), from the same cache (default CHECKPOINT/drift/cache): after an eval,
  this loads its arrays. Returns the EpisodeSet: `.episodes`, `.reference` (fields [n, H]),
  `.cols` (per valid step: `ref_credit`, `label_credit`, tags, ...)."""
  cfg = DriftConfig(
    checkpoint=checkpoint,
    episodes=episodes,
    reference_rollouts=reference_rollouts,
    cache=cache,
    progress=progress,
  )
  cfg.check()
  run = _open_run(checkpoint)
  ctx = _context(cfg, run, _default_out(run))
  return _test_split_set(ctx, run.labels, _test_ids(cfg, run))[0]


def run_drift(cfg: DriftConfig) -> dict:
  """The whole harness; returns the report (also written under cfg.out)."""
  cfg.check()
  tic = time.perf_counter()
  predictor = load_predictor(cfg.checkpoint, cfg.step)
  run = _open_run(cfg.checkpoint)
  workdirs, labels, base = run.workdirs, run.labels, run.base
  out = make_dir(cfg.out or _default_out(run), "--out")
  ctx = _context(cfg, run, out)
  inputs = _inputs_key(cfg, predictor, ctx)
  finished = finished_report(out, inputs)
  if finished is not None:
    return {**finished, "out": out}
  env, k_ref = ctx.env, ctx.ref_cfg.num_rollouts
  main_env = cfg.env or labels.metadata.env
  report: dict = {
    "checkpoint": ",".join(os.path.abspath(w) for w in workdirs),
    "model": predictor.describe(),
    "labels": os.path.abspath(run.record["labels"]),
    "env": main_env,
    "replacement": base.replacement,
    "label_rollouts": base.num_rollouts,
    "reference": {"kind": "exact DP" if ctx.tabular else "MC relabel", "rollouts": k_ref},
  }
  if cfg.env is None:
    ids = _test_ids(cfg, run)
    main, traj = _test_split_set(ctx, labels, ids)
    check_seed = ctx.seed
  else:
    ids = np.arange(cfg.episodes or 256)
    main, traj = _fresh_set(ctx, main_env, ids)
    check_seed = cfg.seed + SHIFT_SEED_OFFSET
  report["reference"]["check"] = _check_reference(ctx, main, traj, ids, check_seed, main_env)
  report["reference"].update(_noise_ratio(main.cols))
  # The family's own shifts (EnvFamily.shifts) unless the config names others.
  shifts = family_of(main_env).shifts if cfg.shifts is None else cfg.shifts
  n_shift = shift_episodes_for(cfg, len(main.episodes))
  shift_sets = [_shift_set(ctx, spec, j, n_shift) for j, spec in enumerate(shifts)]

  score_seconds, models = _add_signals(ctx, predictor, run, [main, *shift_sets])

  from hindsight.drift.render import write_report
  from hindsight.drift.report import build_report

  report["seconds"] = {"model_scoring": round(score_seconds, 2)}
  report.update(
    build_report(cfg, predictor, main, shift_sets, base.num_rollouts, k_ref, score_seconds)
  )
  gradient_env = gradient_env_for(cfg, main_env, tabular=ctx.tabular)
  if gradient_env:
    # The learned signals join the table when they were trained on its environment.
    extra = None
    if _same_env(gradient_env, main_env):
      extra = _gradient_learned_sources(env, predictor, models)
    report["gradient"] = gradient_table(
      gradient_env,
      cfg.gradient_episodes,
      cfg.gradient_rollouts,
      cfg.seed,
      progress=cfg.progress,
      extra_sources=extra,
    )
  report["seconds"]["total"] = round(time.perf_counter() - tic, 1)
  write_report(out, report, main, shift_sets)
  mark_finished(out, inputs)  # last, after the report and its plots
  report["out"] = out
  return report


def _inputs_key(cfg: DriftConfig, predictor, ctx: _Context) -> str:
  """Everything the report depends on: the config (but where it is written and whether
  bars show), the model's parameters, the labels, the hindsight version."""
  import hashlib
  from importlib.metadata import version

  params = hashlib.sha256()
  for leaf in jax.tree.leaves(predictor.state):
    params.update(np.asarray(leaf).tobytes())
  config = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out", "progress")}
  return ref_lib.cache_key(config=config, params=params.hexdigest(), data=ctx.digest,
                           version=version("hindsight"))  # fmt: skip


def _add_signals(ctx: _Context, predictor, run: _Run, sets: list[EpisodeSet]):
  """Signals on every set: the model (timed after one untimed pass that compiles), the
  outcome, and the learned baselines. Returns (model scoring seconds, learned baselines).
  Shifted sets may run longer than the model was trained on: that is the slice they read."""
  cfg = ctx.cfg
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
  if cfg.baseline_steps:
    models = _learned_baselines(ctx, predictor, EpisodeReader(run.labels), run.record)
  for m in models:
    for s in sets:
      s.add_episode_signal(
        m.kind, m.credit(functools.partial(predictor.batch, allow_longer=True), s.episodes)
      )
  return seconds, models


def _auto_rollouts(labels, ids: np.ndarray, base: LabelConfig, cfg: DriftConfig) -> int:
  """K_ref from the noise of (some of) the test split's labels: the reference needs far
  less of it than they have (`reference.choose_rollouts`)."""
  sample = [labels[int(i)] for i in ids]
  field = lambda name: np.concatenate([np.asarray(e[name]) for e in sample])  # noqa: E731
  return ref_lib.choose_rollouts(
    field("credit"),
    field("credit_stderr"),
    base.num_rollouts,
    cfg.reference_fraction,
    bounded=field("credit_bounded"),
  )


def _test_split_set(ctx: _Context, labels, ids: np.ndarray):
  """The run's test episodes with their training labels and the reference: the DP where
  tabular, else the regenerated trajectories relabeled at K_ref with independent keys.
  Returns (EpisodeSet, Trajectory of the episodes)."""
  eps = [labels[int(i)] for i in ids]
  episodes = [Episode.from_example(e) for e in eps]
  fields = ("credit", "credit_stderr", "progress", "phi_hard", "klass", "credit_bounded")
  train_labels = _pad_fields([{k: np.asarray(e[k]) for k in fields} for e in eps], ctx.env.horizon)
  traj = tr.regenerate(
    ctx.labeler(), ctx.seed, ids, [e.actions for e in episodes], [e.rewards for e in episodes]
  )

  def compute():
    what = "reference (DP)" if ctx.tabular else f"reference K={ctx.ref_cfg.num_rollouts}"
    labeler = ctx.labeler(exact_if_tabular=True)
    keys = ref_lib.reference_keys(ctx.seed, ids)
    return _keep(tr.label_trajectories(labeler, traj, keys, ctx.cfg.progress, what))

  reference = ctx.cached(
    "reference", compute, data=ctx.digest, ids=ids.tolist(), tabular=ctx.tabular
  )
  name = ctx.cfg.env or labels.metadata.env
  return EpisodeSet(name, episodes, reference, train_labels), traj


def _fresh_set(ctx: _Context, spec: str, ids: np.ndarray):
  """Fresh episodes of `spec` (--env), sampled and labeled as the reference."""
  seed = ctx.cfg.seed + SHIFT_SEED_OFFSET

  def compute():
    labeler = ctx.labeler(exact_if_tabular=True)
    t, lab = tr.sample_and_label(labeler, seed, ids.size, ctx.cfg.progress, f"{spec} reference")
    return _keep(lab) | tr.trajectory_arrays(ctx.env, t)

  got = ctx.cached("fresh", compute, env=spec, seed=seed, n=int(ids.size))
  m = min(ctx.cfg.check_episodes, ids.size)
  traj = tr.sample_trajectories(ctx.labeler(), seed, np.arange(m))
  return EpisodeSet(spec, tr.episodes_from_arrays(ctx.env, got), got, None), traj


def _check_reference(ctx: _Context, main, traj, ids, seed: int, env_spec: str) -> dict:
  """The reference's honesty on its first `check_episodes` episodes: an independent MC
  pass (keys of pass 1) against it, or against the DP on tabular environments."""
  m = min(ctx.cfg.check_episodes, len(main.episodes))
  check_traj = jax.tree.map(lambda x: x[:m], traj)
  check_ids = ids[:m]

  def compute():
    keys = ref_lib.reference_keys(seed, check_ids, 1)
    labels = tr.label_trajectories(ctx.labeler(), check_traj, keys, ctx.cfg.progress, "check pass")
    return _keep(labels)

  check = ctx.cached(
    "check", compute, data=ctx.digest, env=env_spec, seed=seed, ids=check_ids.tolist()
  )
  mask = main.mask[:m]
  first = {k: v[:m] for k, v in main.reference.items()}
  if ctx.tabular:
    kind = f"MC K={ctx.ref_cfg.num_rollouts} against the DP"
    return {"kind": kind, **ref_lib.check_against_exact(check, first, mask)}
  return {"kind": "two independent passes", **ref_lib.check_passes(first, check, mask)}


def _shift_set(ctx: _Context, spec: str, j: int, n: int):
  """n fresh episodes of a shifted environment (an OOD slice), labeled as the reference."""
  env, policy = make(spec)
  seed = ctx.cfg.seed + SHIFT_SEED_OFFSET + 1 + j

  def compute():
    labeler = ctx.labeler(env, policy, exact_if_tabular=True)
    t, lab = tr.sample_and_label(labeler, seed, n, ctx.cfg.progress, f"{spec} reference")
    return _keep(lab) | tr.trajectory_arrays(env, t)

  got = ctx.cached("shift", compute, env=spec, seed=seed, n=n)
  return EpisodeSet(spec, tr.episodes_from_arrays(env, got), got, None)


def _keep(labels: dict) -> dict:
  out = {k: np.asarray(labels[k]) for k in ref_lib.FIELDS}
  out["rollout_steps"] = np.asarray(labels["rollout_steps"])
  return out


def _pad_fields(per_episode: list[dict], horizon: int) -> dict:
  out = {}
  for k in per_episode[0]:
    pad = np.full((len(per_episode), horizon), np.nan, np.float64)
    if per_episode[0][k].dtype == bool:
      pad = np.zeros((len(per_episode), horizon), bool)
    for i, ep in enumerate(per_episode):
      pad[i, : len(ep[k])] = ep[k]
    out[k] = pad
  return out


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


def _learned_baselines(ctx: _Context, predictor, reader, run) -> list:
  """prm, td_advantage and rudder trained on the run's training split (outcomes only),
  cached beside the reference (keyed by the labels, the split, the model config and the
  baseline config): a rerun that changes nothing trains nothing."""
  cfg, spec = ctx.cfg, predictor.spec
  train_ids = np.asarray(run["train"], np.int64)
  steps = cfg.baseline_steps if cfg.baseline_steps > 0 else bl.scaled_steps(train_ids.size)
  bcfg = bl.BaselineConfig(steps=steps, seed=cfg.seed)
  split = bl.TrainingSplit.of(reader, train_ids, spec, bcfg.batch_size, cfg.seed)
  batches, bases, return_scale = split.batches, split.bases, split.return_scale
  models = []
  for kind in bl.LEARNED:

    def train(kind=kind):
      _, state = bl.train_history_model(
        kind, batches, spec, predictor.model_config, bcfg, return_scale, cfg.progress
      )
      return bl.state_arrays(state)

    arrays = ctx.cached(
      f"baseline_{kind}",
      train,
      data=ctx.digest,
      train_ids=ref_lib.cache_key(ids=train_ids.tolist()),
      model=dataclasses.asdict(predictor.model_config),
      spec=dataclasses.asdict(spec),
      baseline=dataclasses.asdict(bcfg),
    )
    graphdef, state = bl.history_model_from_arrays(kind, spec, predictor.model_config, arrays)
    models.append(bl.LearnedBaseline(kind, graphdef, state, bases[kind], return_scale))
  return models


def _same_env(a: str, b: str) -> bool:
  """Two env specs name the same environment: the same spec, or tabular MDPs with equal
  arrays (`key_corridor` is `tabular:data/key_corridor.npz`)."""
  if a == b:
    return True
  ea, eb = make(a)[0], make(b)[0]
  if not (isinstance(ea, TabularEnv) and isinstance(eb, TabularEnv)):
    return False
  ma, mb = ea.mdp, eb.mdp
  fields = ("P", "r", "pi", "mu0", "terminal")
  return ma.horizon == mb.horizon and all(
    np.array_equal(getattr(ma, f), getattr(mb, f)) for f in fields
  )


def _gradient_learned_sources(env, predictor, models):
  """extra_sources for gradient_table: the model's and the learned baselines' credit on the
  gradient episodes (when they were trained on this very environment)."""

  def sources(traj, labels):
    del labels
    arrays = tr.trajectory_arrays(env, traj)
    episodes = tr.episodes_from_arrays(env, arrays)
    H = arrays["actions"].shape[1]

    def padded(per_episode):
      out = np.zeros((len(per_episode), H))
      for i, c in enumerate(per_episode):
        out[i, : len(c)] = c
      return out

    found = {
      "model (point)": padded([sc["credit"] for sc in predictor.score(episodes, allow_longer=True)])
    }
    for m in models:
      found[f"learned {m.kind}"] = padded(
        m.credit(functools.partial(predictor.batch, allow_longer=True), episodes)
      )
    return found

  return sources


__all__ = ["DriftConfig", "EpisodeSet", "held_out_split", "reference_credit", "run_drift"]
