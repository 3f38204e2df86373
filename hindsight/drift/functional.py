"""The drift harness's backend for functional JAX environments (`drift.backend`).

1. episodes: the run's test split (regenerated from its seed, checked against the stored
   actions and rewards), or fresh episodes of `--env`; shifted sets (`shifts`: another
   behaviour policy, a longer horizon) for the OOD slices;
2. the reference (`drift.reference`): the DP on tabular environments, else the same
   trajectories relabeled at K_ref with independent keys; cached under OUT/cache and
   checked by a second independent pass (or, tabular, by an MC pass against the DP);
3. the policy-gradient table on a tabular MDP (`drift.gradients`), with the learned
   signals where they were trained on its environment.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import numpy as np

from hindsight.data.episode import Episode
from hindsight.drift import reference as ref_lib
from hindsight.drift.backend import Cache, DriftBackend
from hindsight.drift.config import DriftConfig, gradient_env_for, shift_episodes_for
from hindsight.drift.gradients import gradient_table
from hindsight.drift.sets import EpisodeSet, Run, training_labels
from hindsight.envs import make
from hindsight.envs.families import family_of
from hindsight.envs.tabular import TabularEnv
from hindsight.errors import HindsightError
from hindsight.labeling import trajectories as tr
from hindsight.labeling.config import LabelConfig, make_labeled
from hindsight.labeling.engine import Labeler

# Seeds of fresh episode sets: --seed + this (+ 1 + j for shift j), whatever the run's labels,
# so every run evaluated with --env SPEC meets the same episodes (a before/after comparison).
SHIFT_SEED_OFFSET = 1_000_003


@dataclasses.dataclass
class FunctionalEvaluation:
  """The `drift.backend.Evaluation` of a run on a functional environment."""

  cfg: DriftConfig
  run: Run
  env: str  # the evaluated spec: the dataset's, or --env
  environment: object
  policy: object
  ref_cfg: LabelConfig  # the training labels' config at K_ref
  seed: int  # the training labels' seed
  cache: Cache
  learned: tuple[str, ...] = ("prm", "td_advantage", "rudder")
  report_options: dict = dataclasses.field(default_factory=dict)

  @property
  def tabular(self) -> bool:
    return isinstance(self.environment, TabularEnv)

  @property
  def exact(self) -> bool:
    """The reference is the DP: a tabular MDP, unless --reference resample."""
    return self.tabular and self.cfg.reference != "resample"

  def labeler(self, env=None, policy=None, exact_if_tabular: bool = False) -> Labeler:
    """An MC labeler at K_ref, or (exact_if_tabular) the DP where the env is tabular and the
    reference is exact."""
    env = self.environment if env is None else env
    policy = self.policy if policy is None else policy
    exact = exact_if_tabular and self.cfg.reference != "resample"
    if exact and isinstance(env, TabularEnv):
      return Labeler(env, policy, ref_lib.reference_config(self.run.base, 2, exact=True))
    return Labeler(env, policy, self.ref_cfg)

  def reference(self) -> dict:
    kind = "exact DP" if self.exact else "MC relabel"
    return {"kind": kind, "rollouts": self.ref_cfg.num_rollouts}

  def sets(self):
    cfg = self.cfg
    if cfg.env is None:
      ids = test_ids(cfg, self.run)
      main, traj = self.test_split_set(ids)
      check_seed = self.seed
    else:
      ids = np.arange(cfg.episodes or 256)
      main, traj = self._fresh_set(self.env, ids)
      check_seed = cfg.seed + SHIFT_SEED_OFFSET
    check = self._check_reference(main, traj, ids, check_seed)
    # The family's own shifts (EnvFamily.shifts) unless the config names others.
    shifts = family_of(self.env).shifts if cfg.shifts is None else cfg.shifts
    n_shift = shift_episodes_for(cfg, len(main.episodes))
    shift_sets = [self._shift_set(spec, j, n_shift) for j, spec in enumerate(shifts)]
    return main, shift_sets, {"check": check}

  def add_signals(self, sets: list) -> None:
    del sets  # the harness's own signals are all it shows

  def finish(self, report: dict, predictor, models: list) -> dict:
    """The policy-gradient table, on a tabular MDP (the learned signals join it when they
    were trained on its environment)."""
    gradient_env = gradient_env_for(self.cfg, self.env, tabular=self.tabular)
    if not gradient_env:
      return {}
    extra = None
    if same_env(gradient_env, self.env):
      extra = _gradient_learned_sources(self.environment, predictor, models)
    cfg = self.cfg
    table = gradient_table(gradient_env, cfg.gradient_episodes, cfg.gradient_rollouts, cfg.seed,
                           progress=cfg.progress, extra_sources=extra)  # fmt: skip
    return {"gradient": table}

  # -- the sets -----------------------------------------------------------------------------

  def test_split_set(self, ids: np.ndarray):
    """The run's test episodes with their training labels and the reference: the DP where
    tabular, else the regenerated trajectories relabeled at K_ref with independent keys.
    Returns (EpisodeSet, Trajectory of the episodes)."""
    labels = self.run.labels
    eps = [labels[int(i)] for i in ids]
    episodes = [Episode.from_example(e) for e in eps]
    train_labels = training_labels(eps, self.environment.horizon)
    traj = tr.regenerate(
      self.labeler(), self.seed, ids, [e.actions for e in episodes], [e.rewards for e in episodes]
    )

    def compute():
      what = "reference (DP)" if self.exact else f"reference K={self.ref_cfg.num_rollouts}"
      labeler = self.labeler(exact_if_tabular=True)
      keys = ref_lib.reference_keys(self.seed, ids)
      return keep(tr.label_trajectories(labeler, traj, keys, self.cfg.progress, what))

    reference = self.cache.cached(
      "reference", compute, data=self.cache.digest, ids=ids.tolist(), tabular=self.exact
    )
    return EpisodeSet(self.env, episodes, reference, train_labels), traj

  def _fresh_set(self, spec: str, ids: np.ndarray):
    """Fresh episodes of `spec` (--env), sampled and labeled as the reference; with the
    Trajectory of the first `check_episodes` of them (for the reference's check)."""
    seed = self.cfg.seed + SHIFT_SEED_OFFSET
    main = self._sampled_set("fresh", spec, self.environment, self.policy, seed, ids.size)
    m = min(self.cfg.check_episodes, ids.size)
    return main, tr.sample_trajectories(self.labeler(), seed, np.arange(m))

  def _check_reference(self, main, traj, ids, seed: int) -> dict:
    """The reference's honesty on its first `check_episodes` episodes: an independent MC
    pass (keys of pass 1) against it, or against the DP on tabular environments."""
    m = min(self.cfg.check_episodes, len(main.episodes))
    check_traj = jax.tree.map(lambda x: x[:m], traj)
    check_ids = ids[:m]

    def compute():
      keys = ref_lib.reference_keys(seed, check_ids, 1)
      labels = tr.label_trajectories(self.labeler(), check_traj, keys, self.cfg.progress,
                                     "check pass")  # fmt: skip
      return keep(labels)

    check = self.cache.cached(
      "check", compute, data=self.cache.digest, env=self.env, seed=seed, ids=check_ids.tolist()
    )
    mask = main.mask[:m]
    first = {k: v[:m] for k, v in main.reference.items()}
    if self.exact:
      kind = f"MC K={self.ref_cfg.num_rollouts} against the DP"
      return {"kind": kind, **ref_lib.check_against_exact(check, first, mask)}
    return {"kind": "two independent passes", **ref_lib.check_passes(first, check, mask)}

  def _shift_set(self, spec: str, j: int, n: int):
    """n fresh episodes of a shifted environment (an OOD slice), labeled as the reference."""
    env, policy = make(spec)
    return self._sampled_set(
      "shift", spec, env, policy, self.cfg.seed + SHIFT_SEED_OFFSET + 1 + j, n
    )

  def _sampled_set(self, name: str, spec: str, env, policy, seed: int, n: int) -> EpisodeSet:
    """n episodes of `env` under `policy` sampled from `seed` and labeled as the reference
    (the DP where tabular), cached as `name`."""

    def compute():
      labeler = self.labeler(env, policy, exact_if_tabular=True)
      t, lab = tr.sample_and_label(labeler, seed, n, self.cfg.progress, f"{spec} reference")
      return keep(lab) | tr.trajectory_arrays(env, t)

    got = self.cache.cached(name, compute, env=spec, seed=seed, n=int(n))
    return EpisodeSet(spec, tr.episodes_from_arrays(env, got), got, None)


def open_functional(cfg: DriftConfig, run: Run, predictor, out: str) -> FunctionalEvaluation:
  """The evaluation of a run on a functional environment: the evaluated environment, K_ref
  and the cache. Labels that cannot be relabeled from their seed are refused."""
  del predictor
  meta = run.labels.metadata
  if not meta.env or not family_of(meta.env).functional:
    raise HindsightError(
      f"labels of '{meta.env}' cannot be relabeled from their seed (not a functional JAX "
      "environment): the drift harness needs a JAX environment"
    )
  env, policy = make_labeled(meta, cfg.env)
  if cfg.reference == "exact" and not isinstance(env, TabularEnv):
    raise HindsightError(f"reference exact: {cfg.env or meta.env} is not a tabular MDP")
  k_ref = cfg.reference_rollouts or _auto_rollouts(run.labels, run.test_ids[:256], run.base, cfg)
  ref_cfg = ref_lib.reference_config(run.base, k_ref)
  cache = Cache.of_run(cfg, run, out, dataclasses.asdict(ref_cfg))
  return FunctionalEvaluation(cfg, run, cfg.env or meta.env, env, policy, ref_cfg, meta.seed,
                              cache)  # fmt: skip


FUNCTIONAL = DriftBackend(open_functional)


def test_ids(cfg: DriftConfig, run: Run) -> np.ndarray:
  """The test split's episode ids the report evaluates (the first cfg.episodes of them)."""
  if run.labels.metadata.partial or run.record.get("mix_labels"):
    raise HindsightError(
      f"{cfg.checkpoint} trained on an audit's labels, whose test split cannot be "
      "regenerated from one seed: evaluate it on fresh episodes with --env SPEC"
    )
  return run.test_ids[: cfg.episodes] if cfg.episodes else run.test_ids


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


def keep(labels: dict) -> dict:
  """The reference's fields of a labeler's output, and what it cost."""
  out = {k: np.asarray(labels[k]) for k in ref_lib.FIELDS}
  out["rollout_steps"] = np.asarray(labels["rollout_steps"])
  return out


def same_env(a: str, b: str) -> bool:
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
