"""The labeling job: chunked, sharded over devices, resumable after SIGKILL.

A job labels episodes 0..N-1 in chunks of C. Each finished chunk is written atomically
(temp file + rename) to `OUT/_chunks/`; a restarted job with the same arguments skips the
chunks it finds. When every chunk exists the TFDS dataset is written (atomically, by TFDS's
own incomplete-dir + rename) and the work area is removed. A killed job therefore leaves
either no dataset at all or the finished one, never one that reads as complete but is not.

Labels depend only on (seed, episode index, step, branch), never on the chunk: any chunk size
gives identical labels, and so does any number of processes (`jax.distributed`): process p of
P labels chunks p, p + P, ... and process 0 alone prepares --out and writes the dataset
(`run_label_job`).
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np

from hindsight.data import labels as label_io
from hindsight.data.metadata import LabelMetadata
from hindsight.distributed import gather, together
from hindsight.envs.families import EnvFamily, check_env_options, family_of
from hindsight.errors import HindsightError, make_dir, note
from hindsight.files import atomic_savez, atomic_write_text
from hindsight.labeling.config import LabelJob
from hindsight.labeling.label_source import LabelSource
from hindsight.labeling.source import SourceEntry, source_entry
from hindsight.progress import CompileAwareBar

CHUNKS = "_chunks"
JOB_FILE = "job.json"


def _check(job: LabelJob, family: EnvFamily, entry: SourceEntry) -> None:
  if job.episodes < 1:
    raise HindsightError(f"episodes must be >= 1, got {job.episodes}")
  if job.chunk_size < 1:
    raise HindsightError(f"chunk_size must be >= 1, got {job.chunk_size}")
  if not 0 <= job.seed < 2**32:
    raise HindsightError(f"seed must be in [0, 2^32), got {job.seed}")
  if job.workers < 1:
    raise HindsightError(f"workers must be >= 1, got {job.workers}")
  if job.horizon is not None and job.horizon < 1:
    raise HindsightError(f"horizon must be >= 1, got {job.horizon}")
  given = {
    "policy": bool(job.policy),
    "horizon": bool(job.horizon),
    "return_range": job.return_range is not None,
  }
  check_env_options(family, given)
  if job.workers != 1 and not entry.workers:
    raise HindsightError(f"workers is for labels over a process pool, not {family.name}")
  if job.options is not None and not isinstance(job.options, entry.options or ()):
    raise HindsightError(
      f"{type(job.options).__name__} are for another environment family, not {family.name}"
    )
  if job.permutations and (job.permutations < 4 or job.permutations % 2):
    raise HindsightError(f"permutations must be even and >= 4, got {job.permutations}")
  if job.return_range is not None:
    lo, hi = job.return_range
    if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
      raise HindsightError(f"return_range needs finite LO <= HI, got {lo}:{hi}")


def _chunk_path(work: str, start: int, stop: int) -> str:
  return os.path.join(work, f"episodes_{start:09d}_{stop:09d}.npz")


def _episodes_from_chunks(paths: list[str], tag_names: tuple[str, ...]):
  """Yields one TFDS example per episode, in order, cut to its length T."""
  for path in paths:
    with np.load(path) as z:
      c = {k: z[k] for k in z.files}
    for i in range(len(c["episode"])):
      T = int(c["length"][i])
      fields = {name: c[name][i, :T] for name in label_io.EXAMPLE_STEP_ARRAYS if name in c}
      fields.update({name: c[name][i] for name in label_io.TEXT_FIELDS if name in c})
      fields.update(
        {
          "episode": c["episode"][i],
          "length": T,
          "return": c["return"][i],
          "success": c["success"][i],
          "tags": [tag_names[j] for j in c["tags"][i, :T]],
        }
      )
      if "agent" in c:  # sampled Shapley values come without interactions and coalitions
        fields.update({name: c[name][i] for name in label_io.AGENT_FIELDS if name in c})
      yield label_io.make_example(fields)


def _differing(previous: dict, described: dict, parent: str = "") -> str:
  """The job arguments whose values differ, each with its two values, `; `-separated (a
  family's own options by their names: `text.max_tokens: 1024 stored, 512 given`)."""
  out = []
  for k in sorted(set(previous) | set(described)):
    a, b = previous.get(k), described.get(k)
    if a == b:
      continue
    if isinstance(a, dict) and isinstance(b, dict):
      out.append(_differing(a, b, f"{parent}{k}."))
    else:
      out.append(f"{parent}{k}: {json.dumps(a)} stored, {json.dumps(b)} given")
  return "; ".join(out)


def _as_recorded_now(previous: dict) -> dict:
  """A stored job description as `hindsight label` records it now: a text job's trace file
  absolute (jobs recorded it relative to the directory they ran in, which a rerun runs in)."""
  kind, _, path = str(previous.get("env", "")).partition(":")
  if kind == "text" and path and not os.path.isabs(path):
    return {**previous, "env": f"text:{os.path.abspath(path)}"}
  return previous


def _prepare(out_dir: str, work: str, described: dict) -> str | None:
  """Readies --out for the job (process 0 alone): the dataset dir if the job is done, else
  None with the work area and its job file in place."""
  job_file = os.path.join(work, JOB_FILE)
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise HindsightError(f"out {out_dir} exists and is not a directory")
  if label_io.is_complete(out_dir):
    previous = _as_recorded_now(label_io.open_labels(out_dir).metadata.job_description)
    if previous != described:
      differ = _differing(previous, described)
      raise HindsightError(
        f"out {out_dir} already holds labels of a different job ({differ}); choose another --out"
      )
    shutil.rmtree(work, ignore_errors=True)
    return label_io.dataset_dir(out_dir)
  if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.isfile(job_file):
    raise HindsightError(f"out {out_dir} is not empty and holds no hindsight job")
  make_dir(out_dir, "--out")
  os.makedirs(work, exist_ok=True)
  if os.path.isfile(job_file):
    with open(job_file) as f:
      previous = _as_recorded_now(json.load(f))
    if previous != described:
      raise HindsightError(
        f"out {out_dir} holds an unfinished job with other arguments "
        f"({_differing(previous, described)}); rerun it with the same arguments or choose "
        "another --out"
      )
  else:
    atomic_write_text(job_file, json.dumps(described, sort_keys=True))
  return None


def _join(out_dir: str, work: str, rank: int, described: dict) -> str | None:
  """The job process 0 readied in --out, as seen by process `rank`: the dataset dir if it is
  done, else None. Refuses a job of other arguments, or an --out it cannot see."""
  if label_io.is_complete(out_dir):
    theirs, finished = label_io.open_labels(out_dir).metadata.job or "{}", True
  elif os.path.isfile(os.path.join(work, JOB_FILE)):
    with open(os.path.join(work, JOB_FILE)) as f:
      theirs, finished = f.read(), False
  else:
    raise HindsightError(
      f"process {rank} does not see the job process 0 started in --out {out_dir}: "
      "every process needs --out on a filesystem they all share"
    )
  theirs = json.loads(theirs)
  if theirs != described:
    raise HindsightError(
      f"process {rank} was given other arguments than process 0 "
      f"({_differing(theirs, described)}); start every process with the same ones"
    )
  return label_io.dataset_dir(out_dir) if finished else None


def run_label_job(job: LabelJob, out_dir: str, progress: bool = True) -> str:
  """Runs (or resumes, or recognises as finished) a labeling job. Returns the dataset dir.

  Under `jax.distributed` (`hindsight.distributed.initialize`) every process calls this with
  the same job and --out on a shared filesystem: process p labels chunks p, p + P, p + 2P, ...
  of the P processes' job on its own local devices and writes their files; process 0 prepares
  --out first and writes the TFDS dataset once every chunk is there. Labels depend on
  neither P nor the chunk size, so any layout gives the one-process dataset; a relaunched
  job (any process killed) skips the chunks already written.
  """
  family = family_of(job.env)
  entry = source_entry(family)
  _check(job, family, entry)
  rank, count = jax.process_index(), jax.process_count()
  with together("starting the job"):
    source: LabelSource = entry.make(job, out_dir)
  if rank == 0 and family.no_return_range and job.return_range is None:
    bound = family.no_return_range
    note(f"{job.env}: no --return-range LO:HI (the range of any return-to-go): {bound}")
  # Whole micro-batches on every process's devices (local device counts may differ).
  multiple = int(np.lcm.reduce(gather(source.chunk_multiple())))
  chunk = -(-job.chunk_size // multiple) * multiple
  described = job.describe()
  described["chunk_size"] = chunk

  work = os.path.join(out_dir, CHUNKS)
  finished = None  # the dataset dir once the job is done
  with together(f"preparing --out {out_dir}"):
    if rank == 0:
      finished = _prepare(out_dir, work, described)
  with together(f"opening --out {out_dir}"):
    if rank != 0:
      finished = _join(out_dir, work, rank, described)
  if finished is not None:
    return finished

  ranges = [(s, min(s + chunk, job.episodes)) for s in range(0, job.episodes, chunk)]
  mine = ranges[rank::count]
  todo = [r for r in mine if not os.path.isfile(_chunk_path(work, *r))]
  share = sum(b - a for a, b in mine)
  bar = CompileAwareBar(
    total=share,
    initial=share - sum(b - a for a, b in todo),
    unit="ep",
    desc=f"label {source.info.env_name}" + (f" (process 0 of {count})" if count > 1 else ""),
    disable=not progress or rank != 0,
    dynamic_ncols=True,
    compiles=source.info.compiles,
  )
  env_steps = 0
  with together("labeling"), bar:
    for start, stop in todo:
      arrays = source.label(job.seed, start, stop, bar)
      atomic_savez(_chunk_path(work, start, stop), arrays)
      if "rollout_steps" in arrays:  # text sources show their own rates
        env_steps += int(arrays["rollout_steps"].sum())
        bar.set_postfix(env_steps=f"{env_steps:.3g}")

  path = label_io.dataset_dir(out_dir)
  with together(f"writing the dataset in --out {out_dir}"):
    if rank == 0:
      path = _finish(job, source, out_dir, work, ranges, described)
  return path


def _finish(
  job: LabelJob, source: LabelSource, out_dir: str, work: str, ranges, described: dict
) -> str:
  """Every chunk file -> the TFDS dataset in --out (process 0 alone); its dataset dir."""
  missing = [r for r in ranges if not os.path.isfile(_chunk_path(work, *r))]
  if missing:
    raise HindsightError(
      f"out {out_dir}: {len(missing)} chunk files (episodes {missing[0][0]}..) are missing "
      "after every process finished: every process needs --out on a filesystem they all share"
    )
  info = source.info
  features = label_io.build_features(
    info.obs_shape,
    info.obs_dtype,
    info.with_states,
    info.num_agents,
    coalitions=info.coalitions,
    texts=info.texts,
  )
  paths = [_chunk_path(work, *r) for r in ranges]
  metadata = job_metadata(job, info, described).replace(**source.finish(paths))
  path = label_io.write_dataset(
    out_dir,
    features,
    metadata,
    _episodes_from_chunks(paths, info.tag_names),
  )
  shutil.rmtree(work, ignore_errors=True)
  return path


def job_metadata(job: LabelJob, info, described: dict) -> LabelMetadata:
  """The dataset's metadata: the job's description and label config, and what its source
  says of the episodes (`SourceInfo`)."""
  return LabelMetadata(
    job=json.dumps(described, sort_keys=True),
    env=job.env,
    env_name=info.env_name,
    policy=info.policy,
    seed=job.seed,
    **job.config.metadata_fields(),
    horizon=info.horizon,
    num_actions=info.num_actions,
    null_action=-1 if info.null_action is None else info.null_action,
    success_threshold=info.success_threshold,
    success_from_return=info.success_from_return,
    tag_names=tuple(info.tag_names),
    agent_names=tuple(info.agent_names),
    shapley_permutations=info.permutations,
  )
