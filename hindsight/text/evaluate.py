"""`hindsight eval` on a text run: the drift harness's backend for text traces
(`drift.backend`, registered by the text plug-in). The report is the drift harness's own
(`drift.report`, `drift.render`): only the evaluated traces, their reference and one more
signal come from here.

Episodes: the run's test split (the first `--episodes` of it), as the model reads them.

Reference (`--reference`):
  exact     the text world's dynamic programme (`worlds.world.exact_credit`), or the tool
            world's (`worlds.tool_world.exact_credit`, agent traces), stderr 0;
  resample  the same traces relabeled through `--endpoint` at K_ref completions per prefix
            (`--reference-rollouts`, default 256) with a seed of their own (the labels' seed +
            REFERENCE_SEED_OFFSET), cached in the report's cache (`--cache`, default
            OUT/cache; models evaluated with one cache share it; a rerun asks for nothing it
            has); its cost in completions is reported. Its stderrs enter K* as the
            reference's noise.
  auto      exact when the traces are the text or tool world's own (its model wrote them and
            every prompt is its problem), else resample.

Signals beside the harness's (the model, the training labels, the outcome, the labels' MC
progress, a learned PRM reading the text, trained on outcomes only): with the exact reference
a **Bayes observer of the text** (`worlds.world.observer_credit`: the best any reader of the
trace can do, as the world's competence is hidden from it); with a resampled reference of another
model's traces of the world's problems (the small LM's), the credit the scripted world gives
the same sentences (`text world's exact credit` and `text world's Bayes observer`: how far
that model's credit is from the world's). The report adds the equivalent completions per step
(K*) of every signal and their top-3 recall, and the share of the observer's K* the model
reaches; costs are in completions.
"""

from __future__ import annotations

import dataclasses
import os

import msgspec
import numpy as np

from hindsight.credit.estimators import classify, z_value
from hindsight.data.labels import as_text
from hindsight.drift.backend import Cache
from hindsight.drift.config import DriftConfig
from hindsight.drift.sets import EpisodeSet, Run, pad_fields, training_labels
from hindsight.errors import HindsightError

REFERENCE_SEED_OFFSET = 0x5EED  # the reference's seed: labels' seed + this (no shared draws)
TOP_K = 3
DEFAULT_ROLLOUTS = 256  # K_ref of a resampled reference


# The bundled worlds' exact credit lives above the text library (`hindsight.worlds.exact`):
# named here, imported when a run is evaluated.
BUNDLED_WORLD = "hindsight.worlds.exact:bundled_world"
EXACT_REFERENCE = "hindsight.worlds.exact:exact_reference"


def _named(spec: str):
  from hindsight.plugins import import_function

  return import_function(spec, "the exact reference")[1]


def _world(examples) -> tuple[str, str] | None:
  """(the bundled world every trace is a problem of, "text world" or "tool world"; its
  model's name), else None."""
  return _named(BUNDLED_WORLD)(examples)


def exact_reference(examples, replacement: str) -> tuple[list[dict], list[np.ndarray]]:
  """(the world's exact labels of each trace, [T] fields each; the Bayes observer's credit
  [T] per trace): `hindsight.worlds.exact.exact_reference`."""
  return _named(EXACT_REFERENCE)(examples, replacement)


def trace_file(recorded: str, labels_dir: str | None) -> str | None:
  """The labels' trace file: where the job recorded it (absolute since `hindsight label`
  records it so; relative to the directory a job ran in before), else the recorded relative
  path under a directory above the labels (where a job that wrote them under its own
  directory ran); None if neither holds it."""
  if os.path.isfile(recorded):
    return recorded
  if os.path.isabs(recorded) or not labels_dir:
    return None
  here = os.path.abspath(labels_dir)
  while True:
    candidate = os.path.join(here, recorded)
    if os.path.isfile(candidate):
      return candidate
    parent = os.path.dirname(here)
    if parent == here:
      return None
    here = parent


def resampled_reference(
  examples,
  metadata,
  out: str,
  rollouts: int,
  endpoint: str,
  progress: bool,
  labels_dir: str | None = None,
) -> tuple[list[dict], int]:
  """(the label fields [T] of each trace relabeled at `rollouts` through `endpoint` with the
  labels' own text options and a seed of its own, the completions drawn). Each trace's own
  fields (its reference, its metadata) come from the labels' trace file (`trace_file`,
  searched from `labels_dir`); under `--verifier env` the file is not needed."""
  from hindsight.data import open_labels
  from hindsight.labeling.config import LabelConfig
  from hindsight.labeling.job import LabelJob, run_label_job
  from hindsight.text.agent_trace import unmerged
  from hindsight.text.labeler import name_of
  from hindsight.text.options import TextOptions
  from hindsight.text.trace import TextStep, TextTrace, read_traces, write_traces

  job = metadata.job_description
  source = trace_file(job["env"].removeprefix("text:"), labels_dir)
  if source is not None:
    given = {name_of(t, i): t for i, t in enumerate(read_traces(source))}
  elif job["text"].get("verifier") == "env":  # the environment scores: no reference needed
    given = {}
  else:
    raise HindsightError(
      f"{job['env'].removeprefix('text:')}: the labels' trace file is not found (a relative "
      "path is from the directory `hindsight label` ran in: run `hindsight eval` there); the "
      f"verifier {job['text'].get('verifier')} checks each continuation against its trace's "
      "`reference` in it"
    )
  options = dict(job["text"])
  options["stop"] = tuple(options.get("stop", ()))
  os.makedirs(out, exist_ok=True)
  traces_path = os.path.join(out, "traces.jsonl")
  traces = []
  for e in examples:
    # An agent trace's call steps hold their results: written back as steps of role `tool`.
    texts = [as_text(s) for s in e["step_text"]]
    steps = unmerged(texts) if job["text"].get("tools") else [TextStep(text=s) for s in texts]
    name = as_text(e["trace_id"])
    trace = TextTrace(prompt=as_text(e["prompt"]), id=name)
    if name in given:  # the file's own fields (its reference; what an environment reads)
      trace = msgspec.structs.replace(given[name], id=name, text=None, outcome=None)
    traces.append(msgspec.structs.replace(trace, steps=steps))
  write_traces(traces_path, traces)
  config = LabelConfig(
    num_rollouts=rollouts,
    replacement=job["replacement"],
    decorative_tolerance=job["decorative_tolerance"],
    confidence=job["confidence"],
  )
  label_job = LabelJob(
    f"text:{traces_path}",
    len(traces),
    config,
    seed=int(job["seed"]) + REFERENCE_SEED_OFFSET,
    options=TextOptions(endpoint=endpoint, **options),
  )
  ref = open_labels(run_label_job(label_job, os.path.join(out, "labels"), progress=progress))
  by_id = {as_text(r["trace_id"]): r for r in ref}
  return [by_id[t.id] for t in traces], ref.metadata.completions or 0


@dataclasses.dataclass
class TextEvaluation:
  """The `drift.backend.Evaluation` of a run trained on text traces (module docstring)."""

  cfg: DriftConfig
  run: Run
  env: str
  examples: list
  kind: str  # "exact" or "resample"
  rollouts: int  # K_ref (resample), the labels' K (exact: the cost is theirs)
  cache: Cache
  out: str
  learned: tuple[str, ...] = ("prm",)
  report_options: dict = dataclasses.field(
    default_factory=lambda: {"k_star_of_every_signal": True, "top_k": TOP_K}
  )
  completions: int = 0
  observer: list | None = None

  def reference(self) -> dict:
    kind = "exact DP" if self.kind == "exact" else "MC relabel"
    return {"kind": kind, "rollouts": self.rollouts}

  def sets(self):
    from hindsight.data.episode import Episode

    meta, cfg = self.run.labels.metadata, self.cfg
    examples = self.examples
    H = max(len(e["actions"]) for e in examples)
    if self.kind == "exact":
      truth, self.observer = exact_reference(examples, meta.replacement)
      z = z_value(meta.confidence)
      fields = []
      for t in truth:
        zero = np.zeros_like(t["credit"])
        klass = np.asarray(classify(t["credit"], zero, meta.decorative_tolerance, z))
        fields.append({"credit": t["credit"], "credit_stderr": zero, "credit_bounded": zero > 1,
                       "klass": klass, "progress": t["progress"], "progress_stderr": zero,
                       "phi_hard": np.full_like(zero, np.nan)})  # fmt: skip
      # A label costs what the training labels cost per step (the DP costs nothing).
      labels = self.run.labels
      steps = sum(len(labels[i]["actions"]) for i in range(len(labels)))
      spent = (meta.completions or 0) / max(steps, 1)
    else:
      # In the cache (`--cache`), named by what it depends on: models evaluated on the same
      # traces with one cache share one relabel.
      from hindsight.drift.reference import cache_key

      ids = [as_text(e["trace_id"]) for e in examples]
      key = cache_key(data=self.cache.digest, traces=ids, config=self.cache.config)
      fields, self.completions = resampled_reference(
        examples, meta, os.path.join(self.cache.directory, f"reference-{key}"), self.rollouts,
        cfg.endpoint, cfg.progress, self.run.record.get("labels"),
      )  # fmt: skip
      spent = self.completions / max(sum(len(f["credit"]) for f in fields), 1)
    names = ("credit", "credit_stderr", "credit_bounded", "klass", "progress",
             "progress_stderr", "phi_hard")  # fmt: skip
    reference = pad_fields([{k: np.asarray(f[k]) for k in names} for f in fields], H)
    reference["klass"] = np.nan_to_num(reference["klass"], nan=3).astype(np.int64)
    # What a label of each trace cost, in completions (`drift.report`'s cost per step).
    reference["rollout_steps"] = spent * np.array([len(e["actions"]) for e in examples])
    episodes = [Episode.from_example(e) for e in examples]
    main = EpisodeSet(self.env, episodes, reference, training_labels(examples, H))
    return main, [], {} if self.kind == "exact" else {"completions": self.completions}

  def add_signals(self, sets: list) -> None:
    main = sets[0]
    if self.observer is not None:
      main.add_row("Bayes observer of the text", "observer", self.observer)
    elif (_world(self.examples) or ("",))[0] == "text world":
      # Another model's traces of the world's problems: how far its credit is from the credit
      # the scripted world would give the same sentences.
      truth, observer = exact_reference(self.examples, self.run.labels.metadata.replacement)
      main.add_row("text world's exact credit", "world_exact", [t["credit"] for t in truth])
      main.add_row("text world's Bayes observer", "world_observer", observer)

  def finish(self, report: dict, predictor, models: list) -> dict:
    del predictor, models
    out: dict = {"cost_unit": "completions"}
    k = report.get("k_star", {})
    if self.observer is not None and "Bayes observer of the text" in k:
      m, b = k["model (point)"]["value"], k["Bayes observer of the text"]["value"]
      out["k_star_share_of_observer"] = m / b if b and b > 0 else float("nan")
    return out


def open_text(cfg: DriftConfig, run: Run, predictor, out: str) -> TextEvaluation:
  """The evaluation of a run trained on text traces (module docstring)."""
  del predictor
  if cfg.env is not None:
    raise HindsightError("--env: a text run is evaluated on its test split (no fresh episodes)")
  labels, meta = run.labels, run.labels.metadata
  ids = run.test_ids[: cfg.episodes] if cfg.episodes else run.test_ids
  examples = [labels[int(i)] for i in ids]
  bundled = _world(examples)
  own = bundled is not None and meta.policy == bundled[1]
  kind = cfg.reference
  if kind == "auto":  # exact where the traces are a scripted world's own
    kind = "exact" if own else "resample"
  if kind == "exact" and bundled is None:
    raise HindsightError("reference exact: the traces are not the text or tool world's")
  if kind == "resample" and not cfg.endpoint:
    raise HindsightError("reference resample needs --endpoint URL (the model's server)")
  rollouts = meta.rollouts if kind == "exact" else (cfg.reference_rollouts or DEFAULT_ROLLOUTS)
  cache = Cache.of_run(cfg, run, out, {"reference": kind, "rollouts": rollouts})
  return TextEvaluation(cfg, run, meta.env, examples, kind, rollouts, cache, out)
