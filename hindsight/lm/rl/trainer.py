"""`hindsight rl --config rl_text`: GRPO of a language model on a per-step credit source,
on Tunix's RL engine (`rl.tunix_learner`: an `RLCluster` and a `GRPOLearner` whose advantages
come from the source).

One update of one seed:
  1. draws grpo.prompts prompts and grpo.group completions of each through the cluster's
     rollout worker (`rl.engine_rollout`), verified;
  2. asks the source for each step's signal A_t (`rl.sources`), its Monte Carlo pools drawn
     through the same worker, charged in completions and tokens, and divides it by its std
     over the batch's steps (grpo.normalize);
  3. puts each step's A_t on exactly that step's tokens (`grpo.token_advantages`) and takes
     one step of Tunix's actor trainer on its GRPO loss, KL to the starting policy (the
     cluster's reference role) included.

Seeds run one after another from the same starting LM, each on a cluster of its own, with
keys fold_in(seed, i) (`context.stream_key`). Every eval.every updates the seed is measured on
fresh prompts (`rl.measure`) and checkpointed (orbax: the actor's model, its optimizer and the
log so far), so a killed run resumes from its last point and ends with the same parameters and
results. WORKDIR/results.json holds what `hindsight rl --sources` compares (`rl.experiment`'s
shape: per seed the last point, and the curve over points), WORKDIR/seed_I/checkpoints the
policies (`load_policy`).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from hindsight.errors import HindsightError
from hindsight.lm.rl.alarm import alarm_message, alarm_test, check_record
from hindsight.lm.rl.config import check_config
from hindsight.lm.rl.context import CREDIT, EVAL, REFERENCE, TRAIN, Context, stream_key
from hindsight.lm.rl.credit import Spend
from hindsight.lm.rl.grpo import batch_arrays, token_advantages
from hindsight.lm.rl.measure import evaluate_point, step_tags
from hindsight.lm.rl.sources import source_class
from hindsight.worlds.world import SENTENCE_TAGS

LOG_FILE = "log.json"


def policy_lm(config, workdir: str) -> str:
  """The policy's path: config.lm, or the text world's small LM trained (or resumed) into
  WORKDIR/lm at config.lm_train's settings."""
  if config.lm:
    return config.lm
  from hindsight.lm.config import LMTrainConfig
  from hindsight.lm.train import train_lm

  path = os.path.join(workdir, "lm")
  t = config.lm_train
  settings = LMTrainConfig(traces=int(t.traces), steps=int(t.steps), width=int(t.width),
                           depth=int(t.depth), batch_size=int(t.batch_size),
                           max_count=int(t.max_count), seed=int(config.seed),
                           eval_every=max(int(t.steps) // 4, 1),
                           progress=bool(config.progress))  # fmt: skip
  train_lm(settings, path)
  return path


def group_prompts(prompts, group: int):
  """Each prompt `group` times, consecutively (GRPO's groups)."""
  return [p for p in prompts for _ in range(group)]


def normalised(steps: list[np.ndarray], on: bool) -> list[np.ndarray]:
  """Each trace's signal divided by the std over the batch's steps (+ 1e-6)."""
  if not on:
    return steps
  scale = float(np.std(np.concatenate(steps))) + 1e-6
  return [s / scale for s in steps]


def update_batch(ctx, source, state, update_key, update: int, seed_index: int):
  """One update's rollouts, signal and Tunix batch (module docstring, 1-3)."""
  g = ctx.config.grpo
  prompts = ctx.prompts.draw(stream_key(ctx.root, seed_index, TRAIN, 2 * update), int(g.prompts))
  ro = ctx.rollout(state, group_prompts(prompts, int(g.group)), update_key)
  signal = source.signal(state, ro, stream_key(ctx.root, seed_index, CREDIT, update))
  steps = normalised(signal.steps, bool(g.normalize) and not source.standardised)
  advantages = [token_advantages(a, c.token_step)
                for a, c in zip(steps, ro.completions, strict=True)]  # fmt: skip
  batch = batch_arrays([p.ids for p in ro.prompts], [c.ids for c in ro.completions], advantages,
                       int(ctx.lm.cfg.pad_id))  # fmt: skip
  return ro, signal, batch


def seed_learner(ctx, source, seed_index: int):
  """Tunix's learner for one seed, on a cluster of its own from the starting LM, whose
  advantages are `update_batch`'s (a training input: {"update": u}; the prompts and keys
  follow from the seed and u). Its rollout worker becomes the run's sampler (`ctx.sampler`):
  the seed's completions, pools and evaluations all draw through it."""
  from hindsight.lm.rl.tunix_learner import Batch, CreditGRPOLearner, algo_config, make_cluster

  def make_batch(training_input, state):
    u = int(training_input["update"])
    key = stream_key(ctx.root, seed_index, TRAIN, 2 * u + 1)
    ro, signal, arrays = update_batch(ctx, source, state, key, u, seed_index)
    return Batch(arrays, (ro, signal))

  learner = CreditGRPOLearner(make_cluster(ctx.lm, ctx.config.grpo),
                              algo_config(ctx.config.grpo), make_batch)  # fmt: skip
  ctx.sampler.close()  # the sampler it replaces (the setup's, or the last seed's)
  ctx.sampler = learner.rollout
  return learner


class SeedRun:
  """One seed's training (module docstring), resumable from WORKDIR/seed_I/checkpoints."""

  def __init__(self, ctx, source, seed_index: int, workdir: str):
    from hindsight.model.checkpoints import Checkpoints

    self.ctx, self.source, self.i = ctx, source, seed_index
    self.learner = seed_learner(ctx, source, seed_index)
    self.ckpt = Checkpoints(os.path.join(workdir, f"seed_{seed_index}", "checkpoints"), keep=1)

  def point(self, state, update: int, index: int, before):
    c = self.ctx
    n = int(c.config.eval.prompts)
    prompts = c.prompts.draw(stream_key(c.root, self.i, EVAL, 2 * update), n)
    return evaluate_point(c, self.source, state, prompts,
                          stream_key(c.root, self.i, EVAL, 2 * update + 1),
                          stream_key(c.root, self.i, REFERENCE, update), index, before)  # fmt: skip

  def save(self, step: int, log: dict) -> None:
    """Checkpoints the actor's model and optimizer and the log at `step`, the log's seconds
    brought up to now (a resumed run adds to them: its results count every run's time)."""
    now = time.time()
    log["seconds"] = log.get("seconds", 0.0) + now - self._since
    self._since = now
    self.ckpt.save(step, self.parts(), 0.0, {LOG_FILE: json.dumps(log)})

  def parts(self):
    """What a checkpoint holds: the actor's model and optimizer, and with them the source's
    own per-seed state where it keeps one (pp_credit's head and label buffer)."""
    own = self.source.seed_state()
    parts = self.learner.parts()
    if own is None:
      return parts
    # beside "model" (what `load_policy` reads) and "optimizer"
    return {"model": parts["model"], "optimizer": parts["optimizer"], "source": own}

  def run(self, bar=None) -> dict:
    c, g = self.ctx, self.ctx.config.grpo
    self._since = time.time()
    learner = self.learner
    self.source.start_seed()
    start, parts = self.ckpt.restore(_abstract(self.parts()))
    if parts is not None and self.source.seed_state() is not None:
      self.source.start_seed(parts["source"])
      parts = {"model": parts["model"], "optimizer": parts["optimizer"]}
    if parts is None:
      log = {"points": [], "updates": [], "policy": Spend().as_dict(), "credit": Spend().as_dict()}
      log["points"].append(self._point(0, log))
      self.save(0, log)
      start = 0
    else:
      learner.load(parts, start)
      with open(os.path.join(self.ckpt.step_dir(start), LOG_FILE)) as f:
        log = json.load(f)
    if bar is not None:
      bar.update(start)
    for u in range(start, int(g.updates)):
      batch, aux = learner.train_step({"update": u})
      ro, signal = batch.info
      log["policy"] = (Spend(**log["policy"]) + Spend(len(ro.completions), ro.tokens)).as_dict()
      log["credit"] = (Spend(**log["credit"]) + signal.spend).as_dict()
      log["updates"].append({"update": u, "reward": float(ro.rewards.mean()),
                             "steps": sum(x.num_steps for x in ro.completions),
                             "tokens": ro.tokens,
                             **{k: float(v) for k, v in aux.items()}, **signal.record,
                             **self.source.between_updates(ro, signal),
                             "checks": check_record(signal.checks, step_tags(ro))})  # fmt: skip
      self._alarm(log)
      if bar is not None:
        bar.update(1)
        bar.set_postfix(seed=self.i, reward=f"{ro.rewards.mean():.2f}",
                        kl=f"{float(aux['kl']):.3f}")  # fmt: skip
      if (u + 1) % int(c.config.eval.every) == 0:
        log["points"].append(self._point(u + 1, log))
        self.save(u + 1, log)
    self.ckpt.close()
    return log

  def _alarm(self, log: dict) -> None:
    """The training alarm at the update just logged (`rl.alarm`); its first firing is kept
    as log["alarm"] and the next point's `training_alarm` warning."""
    c = self.ctx.config
    if "alarm" in log or not self.source.learned:
      return
    e = c.eval
    test = alarm_test([x["checks"] for x in log["updates"]], SENTENCE_TAGS, int(c.alarm.baseline),
                      int(c.alarm.window), float(e.tolerance), float(e.alpha))  # fmt: skip
    if test is not None:
      log["updates"][-1]["alarm"] = test
      if test["fired"]:
        log["alarm"] = {**test, "message": alarm_message(test, float(e.tolerance),
                                                         float(e.alpha))}  # fmt: skip

  def _point(self, update: int, log: dict) -> dict:
    before = log["points"][0].get("drift", {}).get("tags") if log["points"] else None
    p = self.point(self.learner.rollout.state, update, len(log["points"]), before)
    alarm = log.get("alarm")
    p["alarm_update"] = alarm["update"] if alarm else None  # the training alarm's first firing
    if alarm:
      p["warnings"] = {**p.get("warnings", {}), "training_alarm": alarm["message"]}
    return {"update": update, "policy": dict(log["policy"]), "credit": dict(log["credit"]), **p}


def _abstract(state):
  """The restore target of `state`: its shapes, dtypes and shardings."""
  import jax

  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)


def _seed_entry(point: dict, setup: Spend) -> dict:
  """A seed's record at a point, in `rl.experiment`'s names: env steps are completions."""
  entry = {k: v for k, v in point.items() if k not in ("policy", "credit", "update")}
  entry["policy_env_steps"] = point["policy"]["completions"]
  entry["credit_env_steps"] = point["credit"]["completions"] + setup.completions
  entry["policy_tokens"] = point["policy"]["tokens"]
  entry["credit_tokens"] = point["credit"]["tokens"] + setup.tokens
  return entry


def assemble(config, source, logs: list[dict], setup: Spend, wall: float, setup_seconds: float):
  """results.json's content from every seed's log."""
  curve = []
  for j, first in enumerate(logs[0]["points"]):
    seeds = [_seed_entry(log["points"][j], setup) for log in logs]
    curve.append({"update": first["update"], "seeds": seeds,
                  "policy_steps": [s["policy_env_steps"] for s in seeds],
                  "credit_steps": [s["credit_env_steps"] for s in seeds],
                  "policy_tokens": [s["policy_tokens"] for s in seeds],
                  "credit_tokens": [s["credit_tokens"] for s in seeds]})  # fmt: skip
  # A source that labels a share of its own steps (pp_credit): its per-update statistics in
  # the symbolic experiment's "refreshes" shape (one entry per update, a record per seed),
  # which `rl.experiment`'s table averages per seed, then over seeds.
  from hindsight.rl.experiment import CHUNK_FIELDS

  refreshes = []
  if any("label_share" in u for u in logs[0]["updates"]):
    for j in range(len(logs[0]["updates"])):
      refreshes.append({"update": j, "seeds": [
        {k: log["updates"][j].get(k) for k in CHUNK_FIELDS} for log in logs]})  # fmt: skip
  warnings = {}
  for p in curve:
    for s in p["seeds"]:
      warnings.update(s.get("warnings", {}))
  return {
    "kind": "lm",
    "env": "text" if not config.prompts else config.prompts,
    "source": source.name,
    "unbiased": source.unbiased,
    "learned": source.learned,
    "updates": int(config.grpo.updates),
    "seeds": curve[-1]["seeds"],
    "curve": curve,
    "updates_log": [log["updates"] for log in logs],
    "refreshes": refreshes,
    "setup": setup.as_dict(),
    "wall_seconds": wall,  # every seed's training and evaluation, over every resume
    "setup_seconds": setup_seconds,
    "warnings": warnings,
    "config": config.to_dict(),
  }


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains (or resumes) every seed of `config` into `workdir`; returns results.json's
  content, written there too."""
  from hindsight.files import write_json
  from hindsight.lm.train import load_lm
  from hindsight.progress import CompileAwareBar

  check_config(config)
  os.makedirs(workdir, exist_ok=True)
  lm = load_lm(policy_lm(config, workdir))
  setup_dir = config.setup_dir or os.path.join(workdir, "setup")
  ctx = Context(config, lm, setup_dir)
  source = source_class(config.source)(ctx)
  setup = source.setup  # fits (or reads) its models
  setup_seconds = ctx.models().stats.get("seconds", 0.0) if source.learned else 0.0
  total = int(config.num_seeds) * int(config.grpo.updates)
  bar = CompileAwareBar(total=total, desc=f"rl {source.name}", unit="update",
                        disable=not config.progress)  # fmt: skip
  logs = []
  try:
    for i in range(int(config.num_seeds)):
      logs.append(SeedRun(ctx, source, i, workdir).run(bar))
  finally:
    ctx.sampler.close()
    bar.close()
  wall = sum(log.get("seconds", 0.0) for log in logs)
  results = assemble(config, source, logs, setup, wall, setup_seconds)
  write_json(os.path.join(workdir, "results.json"), results)
  return results


def load_policy(workdir: str, seed: int = 0, update: int | None = None):
  """(LoadedLM of the trained policy of `seed`, the run's config): its last checkpoint's
  model (`update`, if given, must be that checkpoint's: a run keeps only its last). Also what
  `hindsight.rl.load_policy` returns for a run of this trainer."""
  import dataclasses

  import jax
  from flax import nnx
  from ml_collections import ConfigDict

  from hindsight.lm.train import load_lm
  from hindsight.model.checkpoints import Checkpoints

  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    raise HindsightError(f"{workdir}: no results.json (not a finished `hindsight rl` run)")
  with open(path) as f:
    config = ConfigDict(json.load(f)["config"])
  lm = load_lm(config.lm or os.path.join(workdir, "lm"))
  ckpt = Checkpoints(os.path.join(workdir, f"seed_{seed}", "checkpoints"), read_only=True)
  try:
    steps = ckpt.steps()
    if not steps:
      raise HindsightError(f"{workdir}: seed {seed} has no checkpoint")
    if update is not None and int(update) != steps[-1]:
      raise HindsightError(f"{workdir}: seed {seed} keeps its last update ({steps[-1]}) only")
    _, state = ckpt.restore({"model": nnx.state(nnx.eval_shape(lambda: lm.model))},
                            step=steps[-1], partial=True)  # fmt: skip
  finally:
    ckpt.close()
  return dataclasses.replace(lm, state=jax.device_put(state["model"])), config


def results_text(results: dict, path: str) -> str:
  """The run's result in one console line (`hindsight rl`): each measure from its start
  (update 0) to its end, the end's 95% interval over seeds cut to the measure's range."""
  from hindsight.rl.experiment import RANGES, ci_text, mean_ci

  seeds, start = results["seeds"], results["curve"][0]["seeds"]

  def change(m: str, fmt: str) -> str:
    first = float(np.mean([s[m] for s in start]))
    return f"{first:{fmt}} -> {ci_text(mean_ci([s[m] for s in seeds], RANGES[m]), fmt)}"

  return (
    f"{results['source']} on a language model, {results['updates']} updates: success "
    f"{change('success', '.3f')}, tokens per trace {change('tokens', '.1f')}, steps per "
    f"trace {change('length', '.2f')} (over {len(seeds)} seeds); {path}"
  )


def _register() -> None:
  from hindsight.lm.rl.config import KIND
  from hindsight.rl.load import register_policy_loader

  register_policy_loader(KIND, load_policy)


_register()  # this module is the `lm` plug-in of `hindsight.rl.load_policy`
