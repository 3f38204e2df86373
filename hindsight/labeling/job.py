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

from hindsight.compile_cache import program_dir
from hindsight.credit.estimators import KLASS_NAMES
from hindsight.credit.replacement import check_replacement
from hindsight.data import labels as label_io
from hindsight.distributed import gather, together
from hindsight.envs import make
from hindsight.envs.adapters import is_adapter_spec
from hindsight.envs.registry import takes_policy_options
from hindsight.errors import HindsightError, make_dir, note
from hindsight.files import atomic_savez, atomic_write_text
from hindsight.labeling import trajectories as tr
from hindsight.labeling.agents import MAX_ENUMERATED_AGENTS, agent_credit
from hindsight.labeling.config import LabelJob
from hindsight.labeling.engine import Labeler, episode_key, to_numpy
from hindsight.labeling.py_labeler import PyJob, label_episodes
from hindsight.labeling.rollout import Trajectory
from hindsight.progress import CompileAwareBar

CHUNKS = "_chunks"
JOB_FILE = "job.json"
AGENT_KEY_SALT = 0x0A6E7  # folds the coalition-rollout keys off an episode's root key
DEFAULT_PERMUTATIONS = 64  # sampled Shapley values, beyond MAX_ENUMERATED_AGENTS agents


def _check(job: LabelJob) -> None:
  if job.episodes < 1:
    raise HindsightError(f"--episodes must be >= 1, got {job.episodes}")
  if job.chunk_size < 1:
    raise HindsightError(f"--chunk-size must be >= 1, got {job.chunk_size}")
  if not 0 <= job.seed < 2**32:
    raise HindsightError(f"--seed must be in [0, 2^32), got {job.seed}")
  if job.workers < 1:
    raise HindsightError(f"--workers must be >= 1, got {job.workers}")
  if job.horizon is not None and job.horizon < 1:
    raise HindsightError(f"--horizon must be >= 1, got {job.horizon}")
  if not takes_policy_options(job.env) and (job.policy or job.horizon or job.return_range):
    raise HindsightError(
      "--policy, --horizon and --return-range are for gymnax:, gymnasium: and dm_env: "
      "environments only"
    )
  if job.env.startswith("gymnax:") and job.workers != 1:
    raise HindsightError("--workers is for gymnasium:/dm_env: (gymnax runs on the devices)")
  if job.permutations and (job.permutations < 4 or job.permutations % 2):
    raise HindsightError(f"--permutations must be even and >= 4, got {job.permutations}")
  if job.return_range is not None:
    lo, hi = job.return_range
    if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
      raise HindsightError(f"--return-range needs finite LO <= HI, got {lo}:{hi}")


def _gymnax_horizon(job: LabelJob) -> int | None:
  """The horizon a gymnax job labels at: --horizon, else the longest of the job's own
  episodes at the environment's declared `max_steps_in_episode` (MemoryChain declares 1000
  for episodes of 6 steps; padding every episode, the model's length and the reference to
  the declared maximum costs memory and time for nothing). The episodes are the same either
  way: their keys depend on the step, not on the horizon. Says what it chose, and what a
  given --horizon truncates."""
  if not job.env.startswith("gymnax:"):
    return job.horizon
  env, policy = make(job.env, job.policy, None, job.return_range)
  lengths = tr.episode_lengths(env, policy, job.seed, job.episodes)
  longest, declared = int(lengths.max()), env.horizon
  if job.horizon is not None:
    cut = int((lengths > job.horizon).sum())
    if cut:
      note(
        f"--horizon {job.horizon} truncates {cut} of {job.episodes} episodes (the longest "
        f"runs {longest} steps): their returns stop there"
      )
    return job.horizon
  if longest < declared:
    note(
      f"{job.env}: horizon {longest}, the longest of the job's {job.episodes} episodes (the "
      f"environment declares {declared}; --horizon sets another)"
    )
  return longest


class _JaxSource:
  """Chunks from the JAX engine (sharded over devices)."""

  texts = False  # no prompt or step texts (hindsight.text.source's sources have them)

  def __init__(self, job: LabelJob):
    self.env, self.policy = make(job.env, job.policy, _gymnax_horizon(job), job.return_range)
    self.labeler = Labeler(self.env, self.policy, job.config, program_dir=program_dir())
    env = self.env
    self.name, self.policy_name, self.horizon = env.name, self.policy.name, env.horizon
    self.num_actions, self.null_action = env.num_actions, env.null_action
    self.success_threshold, self.tag_names = env.success_threshold, tuple(env.tag_names)
    self.success_from_return = env.success_from_return
    params = self.labeler.env_params

    def first_step():
      state = env.reset(jax.random.key(0), params)
      return env.observation(state, params), env.state_index(state)

    # Shapes only: nothing is compiled (eager ops would compile one small program each).
    obs, index = jax.eval_shape(first_step)
    self.obs_shape, self.obs_dtype = tuple(obs.shape), obs.dtype
    self.with_states = index is not None
    self._programs = {}  # chunk size -> chunk_program, all of one unit program
    # Multi-agent environments also get agent-level labels (Shapley values by coalition
    # rollouts from each episode's initial state, non-members' turns made null): every
    # coalition at K = --rollouts up to MAX_ENUMERATED_AGENTS agents, else sampled orders.
    self.num_agents, self.agent_names = env.num_agents, tuple(env.agent_names)
    self.permutations = job.permutations
    if self.num_agents > MAX_ENUMERATED_AGENTS and not self.permutations:
      self.permutations = DEFAULT_PERMUTATIONS
    self.coalitions = bool(self.num_agents) and not self.permutations
    if self.num_agents:
      K, policy, P = job.config.num_rollouts, self.policy, self.permutations

      def credit(actions, state0, key):
        return agent_credit(env, policy, actions, key, K, initial_state=state0,
                            num_permutations=P)  # fmt: skip

      self._agent_program = jax.jit(jax.vmap(credit))
      # Who acts at each step t < H (the same for every episode).
      self._acting = np.asarray(jax.vmap(env.agent_of_step)(np.arange(env.horizon)))

  def chunk_multiple(self) -> int:
    return self.labeler.chunk_multiple()

  def label(self, seed: int, start: int, stop: int, chunk: int, bar) -> dict:
    del chunk  # a short chunk (the job's last) runs only the blocks that hold its episodes
    multiple = self.labeler.chunk_multiple()
    size = -(-(stop - start) // multiple) * multiple
    if size not in self._programs:  # labels do not depend on the size (dispatch.py)
      self._programs[size] = self.labeler.chunk_program(size)
    indices = np.arange(start, start + size, dtype=np.int32)
    traj, labels = to_numpy(self._programs[size](np.uint32(seed), indices))
    arrays = _flatten_chunk(self.env, traj, labels, start, stop)
    if self.num_agents:
      n = stop - start
      # Coalition rollouts get keys of their own, folded off each episode's root key.
      keys = jax.vmap(lambda i: jax.random.fold_in(episode_key(seed, i), AGENT_KEY_SALT))(
        indices[:n]
      )
      state0 = jax.tree.map(lambda x: x[:n, 0], traj.states)
      agents = jax.device_get(self._agent_program(traj.actions[:n], state0, keys))
      arrays.update({k: np.asarray(v) for k, v in agents.items()})
      arrays["agent"] = np.broadcast_to(self._acting, (n, self.env.horizon))
    bar.update(stop - start)
    return arrays


class _PySource:
  """Chunks from Gymnasium / dm_env environments over a process pool."""

  texts = False

  def __init__(self, job: LabelJob):
    from hindsight.envs.adapters import load_policy, make_py_env

    env = make_py_env(job.env, job.horizon)
    load_policy(job.policy, env.num_actions)  # fail early on a bad --policy
    check_replacement(job.config.replacement, None, env.spec, has_action_classes=False)
    if job.config.exact:
      raise HindsightError("--exact needs a tabular MDP")
    self.py_job = PyJob(
      job.env, job.policy, job.horizon, job.config, job.seed, return_range=job.return_range
    )
    self.workers = job.workers
    self.name, self.policy_name, self.horizon = env.name, job.policy or "uniform", env.horizon
    self.num_actions, self.null_action = env.num_actions, None
    self.success_threshold = self.py_job.success_threshold
    self.success_from_return = True  # adapters: success is return > success_threshold
    self.tag_names = tuple(f"a{i}" for i in range(env.num_actions))
    self.obs_shape, self.obs_dtype = (env.reset(0).size,), np.float32
    self.with_states = False
    self.num_agents, self.agent_names = 0, ()  # single-agent environments
    self.coalitions, self.permutations = False, 0

  def chunk_multiple(self) -> int:
    return 1

  def label(self, seed: int, start: int, stop: int, chunk: int, bar) -> dict:
    del seed, chunk  # the PyJob carries the seed
    return label_episodes(self.py_job, range(start, stop), self.workers, lambda: bar.update(1))


def _source(job: LabelJob, out_dir: str):
  """The job's source of labeled chunks: text traces, Gymnasium/dm_env, or the JAX engine."""
  from hindsight.text.source import TextSource, is_text_spec

  if is_text_spec(job.env):
    return TextSource(job, out_dir)
  if job.text is not None:
    raise HindsightError("--model, --endpoint and the other text flags are for --env text:... only")
  return _PySource(job) if is_adapter_spec(job.env) else _JaxSource(job)


def _chunk_path(work: str, start: int, stop: int) -> str:
  return os.path.join(work, f"episodes_{start:09d}_{stop:09d}.npz")


def _flatten_chunk(env, traj: Trajectory, labels: dict, start: int, stop: int) -> dict:
  """Device outputs of one chunk -> the NumPy arrays stored in its file ([n, H, ...]).
  (The labels carry the tags and success; the trajectory's arrays the rest.)"""
  n = stop - start
  arrays = tr.trajectory_arrays(env, jax.tree.map(lambda x: x[:n], traj), with_tags=False)
  arrays.update({k: np.asarray(v)[:n] for k, v in labels.items()})
  arrays["episode"] = np.arange(start, stop)
  return arrays


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


def _chunk_totals(paths: list[str], names: tuple[str, ...]) -> dict[str, np.ndarray]:
  """The per-episode arrays `names` of every chunk file, concatenated."""
  parts: dict[str, list] = {name: [] for name in names}
  for path in paths:
    with np.load(path) as z:
      for name in names:
        parts[name].append(z[name])
  return {name: np.concatenate(v) for name, v in parts.items()}


def _differing(previous: dict, described: dict) -> str:
  """The job arguments whose values differ, comma-separated."""
  return ", ".join(sorted(k for k in described if previous.get(k) != described[k]))


def _prepare(out_dir: str, work: str, described: dict) -> str | None:
  """Readies --out for the job (process 0 alone): the dataset dir if the job is done, else
  None with the work area and its job file in place."""
  job_file = os.path.join(work, JOB_FILE)
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise HindsightError(f"--out {out_dir} exists and is not a directory")
  label_io.finish_checksums(out_dir)  # a job killed between TFDS's rename and the checksums
  if label_io.is_complete(out_dir):
    meta = label_io.open_labels(out_dir).metadata
    previous = json.loads(meta.get("job", "{}"))
    if previous != described:
      differ = _differing(previous, described)
      raise HindsightError(
        f"--out {out_dir} already holds labels of a different job ({differ} differ); choose "
        "another --out"
      )
    shutil.rmtree(work, ignore_errors=True)
    return label_io.dataset_dir(out_dir)
  if os.path.isdir(out_dir) and os.listdir(out_dir) and not os.path.isfile(job_file):
    raise HindsightError(f"--out {out_dir} is not empty and holds no hindsight job")
  make_dir(out_dir, "--out")
  os.makedirs(work, exist_ok=True)
  if os.path.isfile(job_file):
    with open(job_file) as f:
      previous = json.load(f)
    if previous != described:
      raise HindsightError(
        f"--out {out_dir} holds an unfinished job with other arguments "
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
    theirs, finished = label_io.open_labels(out_dir).metadata.get("job", "{}"), True
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
  _check(job)
  rank, count = jax.process_index(), jax.process_count()
  with together("starting the job"):
    source = _source(job, out_dir)
  if rank == 0 and takes_policy_options(job.env) and job.return_range is None:
    bound = (
      "the tie bound of a near-tied step is then infinite (stderr inf, klass undetermined)"
      if job.env.startswith("gymnax:")
      else "the tie bound then uses the range of each episode's branch returns, what the data show"
    )
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
    desc=f"label {source.name}" + (f" (process 0 of {count})" if count > 1 else ""),
    disable=not progress or rank != 0,
    dynamic_ncols=True,
  )
  env_steps = 0
  with together("labeling"), bar:
    for start, stop in todo:
      arrays = source.label(job.seed, start, stop, chunk, bar)
      atomic_savez(_chunk_path(work, start, stop), arrays)
      if "rollout_steps" in arrays:  # text sources show their own rates
        env_steps += int(arrays["rollout_steps"].sum())
        bar.set_postfix(env_steps=f"{env_steps:.3g}")

  path = label_io.dataset_dir(out_dir)
  with together(f"writing the dataset in --out {out_dir}"):
    if rank == 0:
      path = _finish(job, source, out_dir, work, ranges, described)
  return path


def _finish(job: LabelJob, source, out_dir: str, work: str, ranges, described: dict) -> str:
  """Every chunk file -> the TFDS dataset in --out (process 0 alone); its dataset dir."""
  missing = [r for r in ranges if not os.path.isfile(_chunk_path(work, *r))]
  if missing:
    raise HindsightError(
      f"--out {out_dir}: {len(missing)} chunk files (episodes {missing[0][0]}..) are missing "
      "after every process finished: every process needs --out on a filesystem they all share"
    )
  metadata = dict(
    job=json.dumps(described, sort_keys=True),
    env=job.env,
    env_name=source.name,
    policy=source.policy_name,
    replacement=job.config.replacement,
    rollouts=job.config.num_rollouts,
    exact=job.config.exact,
    seed=job.seed,
    gamma=job.config.gamma,
    horizon=source.horizon,
    num_actions=source.num_actions,
    null_action=-1 if source.null_action is None else source.null_action,
    success_threshold=source.success_threshold,
    success_from_return=source.success_from_return,
    decorative_tolerance=job.config.decorative_tolerance,
    confidence=job.config.confidence,
    stratify=job.config.stratify,
    tag_names=list(source.tag_names),
    agent_names=list(source.agent_names),
    shapley_permutations=source.permutations,
    klass_names=list(KLASS_NAMES),
  )
  features = label_io.build_features(
    source.obs_shape,
    source.obs_dtype,
    source.with_states,
    source.num_agents,
    coalitions=source.coalitions,
    texts=source.texts,
  )
  paths = [_chunk_path(work, *r) for r in ranges]
  if source.texts:
    # Text traces: the horizon is the longest trace, and the cost is in completions.
    totals = _chunk_totals(paths, ("length", "completions"))
    metadata["horizon"] = int(totals["length"].max())
    metadata["completions"] = int(totals["completions"].sum())
    metadata.update({k: json.dumps(v, sort_keys=True) if isinstance(v, dict) else v
                     for k, v in source.metadata.items()})  # fmt: skip
  path = label_io.write_dataset(
    out_dir,
    features,
    metadata,
    _episodes_from_chunks(paths, source.tag_names),
    download_dir=os.path.join(work, "downloads"),
  )
  shutil.rmtree(work, ignore_errors=True)
  return path
