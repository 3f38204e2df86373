"""The RL run: prepare the credit source, run the compiled update chunks, measure, checkpoint.

  WORKDIR/config.json        the run's configuration (a rerun with another one is refused)
  WORKDIR/checkpoints/U/     orbax, after every evaluation point U: the stacked train
                             states, the source's state (a credit model kept current), the
                             policies alone (what `load_policy` reads) and the history
  WORKDIR/tensorboard/       per-update training metrics (mean over seeds)
  WORKDIR/results.json       per seed: the final measurements, the env steps spent on the
                             policy's rollouts and on credit, and wall time

Every `eval.every` updates (one call of the compiled chunk) the run lets the source do what
it does between chunks (`CreditSource.between_chunks`: keep its model current, charged),
measures each seed on fresh episodes (`rl.measure`), and saves. Killed at any point and
restarted with the same config, it resumes from the last save and ends with bitwise the same
parameters: the updates draw their keys from the train state, the measurements and audits
from (seed, update).
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from ml_collections import ConfigDict

from hindsight.config_io import check_workdir
from hindsight.errors import note
from hindsight.files import write_json
from hindsight.progress import CompileAwareBar
from hindsight.rl.config import check_config
from hindsight.rl.measure import EVAL_STREAM, LabeledSampler, evaluate_point, point_keys
from hindsight.rl.ppo import Programs
from hindsight.rl.sources import label_config, prepare
from hindsight.rl.task import make_task


def _manager(workdir: str, read_only: bool = False) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
    max_to_keep=None if read_only else 2,
    enable_async_checkpointing=False,
    read_only=read_only,
  )
  return ocp.CheckpointManager(
    os.path.join(os.path.abspath(workdir), "checkpoints"), options=options
  )


def _finished(workdir: str, updates: int) -> dict | None:
  """results.json of a run of this workdir's config that reached `updates`, else None."""
  path = os.path.join(workdir, "results.json")
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    results = json.load(f)
  return results if results.get("updates") == updates else None


def seed_keys(config: ConfigDict) -> jax.Array:
  """[S] root keys of the run's seeds: fold_in(key(seed), i)."""
  root = jax.random.key(int(config.seed))
  return jax.vmap(jax.random.fold_in, (None, 0))(root, jnp.arange(int(config.num_seeds)))


def _stack(tree, n: int):
  return None if tree is None else jax.tree.map(lambda x: jnp.stack([x] * n), tree)


def _row(tree, i: int):
  return jax.tree.map(lambda x: x[i], tree)


def _set_row(stacked, i: int, tree):
  return jax.tree.map(lambda s, x: s.at[i].set(x), stacked, tree)


class _Board:
  """TensorBoard scalars (mean over seeds) per update."""

  def __init__(self, workdir: str):
    from tensorboardX import SummaryWriter

    self.writer = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def updates(self, first: int, metrics: dict, tag_names) -> None:
    n = np.asarray(metrics["success"]).shape[1]
    for j in range(n):
      step = first + j + 1
      for name in ("success", "length", "return", "loss"):
        self.writer.add_scalar(f"train/{name}", float(np.mean(metrics[name][:, j])), step)
      for t, tag in enumerate(tag_names):
        share = float(np.mean(metrics["tag_share"][:, j, t]))
        self.writer.add_scalar(f"train/share_{tag}", share, step)

  def point(self, update: int, point: dict) -> None:
    for kind, message in point_warnings(point).items():
      self.writer.add_text(f"warnings/{kind}", message, update)
    for name in ("success", "length", "return"):
      value = np.mean([s[name] for s in point["seeds"]])
      self.writer.add_scalar(f"eval/{name}", value, update)
    for k in point["seeds"][0]["klass_share"]:
      value = np.mean([s["klass_share"][k] for s in point["seeds"]])
      self.writer.add_scalar(f"eval/klass_{k}", value, update)
    self.writer.flush()

  def close(self) -> None:
    self.writer.close()


def point_warnings(point: dict) -> dict[str, str]:
  """kind -> message of an evaluation point's warnings (`rl.measure`), each said once with
  the first seed that raised it."""
  out = {}
  for i, s in enumerate(point["seeds"]):
    for kind, message in s.get("warnings", {}).items():
      out.setdefault(kind, f"seed {i}: {message}")
  return out


def train_and_evaluate(config: ConfigDict, workdir: str) -> dict:
  """Runs (or resumes) the RL run of `config` in `workdir`; returns results.json's content."""
  check_config(config)
  task = make_task(config)
  check_workdir(config, workdir, launch_fields=("progress",))
  finished = _finished(workdir, int(config.ppo.updates))
  if finished is not None:
    return finished  # the same config ran to the end here: nothing to redo
  progress = bool(config.progress)
  S, every, total = int(config.num_seeds), int(config.eval.every), int(config.ppo.updates)
  setup_start = time.perf_counter()
  source = prepare(task, config, progress=progress)
  setup_seconds = time.perf_counter() - setup_start
  programs = Programs(source, config)
  keys = seed_keys(config)
  manager = _manager(workdir)
  ts0 = programs.place(programs.init(keys))
  aux0 = programs.place(_stack(source.aux, S))
  state_tree = {"ts": ts0, "aux": aux0}
  latest = manager.latest_step()
  if latest is not None:
    restored = manager.restore(
      latest,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, state_tree)),
        history=ocp.args.JsonRestore(),
      ),
    )
    state = programs.place(restored["state"])
    ts, aux, history = state["ts"], state["aux"], restored["history"]
  else:
    ts, aux = ts0, aux0
    history = {
      "points": [],
      "policy_steps": [0] * S,
      "credit_steps": [source.setup_steps] * S,
      "wall_seconds": 0.0,
      "setup_seconds": setup_seconds,
      "refreshes": [],
    }
  done = int(np.asarray(ts.update)[0])

  reference = LabeledSampler(task, label_config(config, config.eval.rollouts))
  probe = source.probe()
  score = None if probe is None else jax.jit(probe.predict)
  drift_test = (float(config.eval.tolerance), float(config.eval.alpha), str(config.eval.boundary))

  def measure(update: int) -> dict:
    seeds = []
    for i in range(S):
      k = point_keys(keys[i], EVAL_STREAM, update, int(config.eval.episodes))
      model_state = _row(aux, i) if score is not None else None
      first = None
      if update and score is not None:
        first = history["points"][0]["seeds"][i]["drift"].get("tags")
      seeds.append(evaluate_point(reference, _row(ts.params, i), k, score, model_state,
                                   drift_test, probe, first, update // every))  # fmt: skip
    return {"update": update, "policy_steps": list(history["policy_steps"]),
            "credit_steps": list(history["credit_steps"]), "seeds": seeds}  # fmt: skip

  def save(update: int) -> None:
    manager.save(
      update,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave({"ts": ts, "aux": aux}),
        policy=ocp.args.StandardSave(ts.params),
        history=ocp.args.JsonSave(history),
      ),
      force=True,
    )
    manager.wait_until_finished()

  board = _Board(workdir)
  bar = CompileAwareBar(
    total=total, initial=done, desc=f"rl {config.source}", unit="update", disable=not progress
  )
  said: set[str] = set()

  def warn(point: dict) -> str:
    """A point's warnings: once per kind on stderr (above the bar), and the kinds in the bar."""
    warnings = point_warnings(point)
    for kind, message in warnings.items():
      if kind not in said:
        said.add(kind)
        bar.clear()
        note(f"rl {config.source} at update {point['update']}: {message}")
    return ",".join(warnings)

  try:
    if not history["points"]:
      history["points"].append(measure(0))
      board.point(0, history["points"][-1])
      save(0)
    warn(history["points"][-1])
    with bar:
      while done < total:
        start = time.perf_counter()
        ts, metrics = programs.chunk(ts, aux, every)
        metrics = jax.device_get(metrics)
        chunk_records = metrics.pop("record")  # the source's, leaves [S, n, ...]
        for i in range(S):
          history["policy_steps"][i] += int(np.sum(metrics["policy_steps"][i], dtype=np.int64))
          history["credit_steps"][i] += int(np.sum(metrics["credit_steps"][i], dtype=np.int64))
        board.updates(done, metrics, task.env.tag_names)
        done += every
        records = []
        for i in range(S):
          new_state, record = source.between_chunks(
            _row(aux, i), _row(ts.params, i), keys[i], done,
            seed=int(config.seed) * 1000 + done * S + i, record=_row(chunk_records, i),
          )  # fmt: skip
          if new_state is not None:
            aux = programs.place(_set_row(aux, i, new_state))
          if record is not None:
            history["credit_steps"][i] += record["env_steps"]
          records.append(record)
        if any(r is not None for r in records):
          history["refreshes"].append({"update": done, "seeds": records})
        history["wall_seconds"] += time.perf_counter() - start
        point = measure(done)
        for seed_point, record in zip(point["seeds"], records, strict=True):
          if record is not None:  # the source's own alarm
            seed_point["warnings"].update(record.get("warnings", {}))
        history["points"].append(point)
        board.point(done, history["points"][-1])
        save(done)
        last = history["points"][-1]["seeds"]
        postfix = {"success": f"{np.mean([s['success'] for s in last]):.3f}",
                   "length": f"{np.mean([s['length'] for s in last]):.2f}"}  # fmt: skip
        kinds = warn(history["points"][-1])
        if kinds:
          postfix["warning"] = kinds
        # the count first: the figures are the point at the count the bar then shows
        bar.set_postfix(postfix, refresh=False)
        bar.update(every)
  finally:
    board.close()
    manager.close()
  results = summarize(config, history, score is not None, task.env.horizon)
  write_json(os.path.join(workdir, "results.json"), results)
  return results


def summarize(config: ConfigDict, history: dict, learned: bool, horizon: int) -> dict:
  """results.json: per seed the final point's measurements and what the run spent."""
  final = history["points"][-1]
  seeds = []
  for i, s in enumerate(final["seeds"]):
    row = dict(s)
    row["policy_env_steps"] = history["policy_steps"][i]
    row["credit_env_steps"] = history["credit_steps"][i]
    seeds.append(row)
  refires = [sum(bool((r["seeds"][i] or {}).get("fired")) for r in history["refreshes"])
             for i in range(len(seeds))]  # fmt: skip
  return {
    "env": config.env,
    "source": config.source,
    "updates": final["update"],
    # every seed's updates run together (vmapped): these are the run's, not one seed's
    "wall_seconds": history["wall_seconds"],
    "setup_seconds": history["setup_seconds"],
    "seeds": seeds,
    "refreshes_fired": refires if history["refreshes"] else None,
    # per chunk, each seed's record of what its source did between chunks (rl.sources)
    "refreshes": history["refreshes"],
    "curve": [
      {
        "update": p["update"],
        "policy_steps": p["policy_steps"],
        "credit_steps": p["credit_steps"],
        "seeds": p["seeds"],
      }
      for p in history["points"]
    ],
    "learned": learned,
    # what voids a measurement (kind -> message, the last point's; rl.measure)
    "warnings": point_warnings(final),
    "horizon": horizon,
  }


def results_text(results: dict, path: str) -> str:
  """The run's result in one console line (`hindsight rl`)."""
  seeds = results["seeds"]
  success = sum(s["success"] for s in seeds) / len(seeds)
  length = sum(s["length"] for s in seeds) / len(seeds)
  return (
    f"{results['source']} on {results['env']}: after {results['updates']} updates, success "
    f"{success:.3f}, length {length:.2f} (mean of {len(seeds)} seeds); {path}"
  )
