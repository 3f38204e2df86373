"""The JAX engine as a label source (`hindsight.labeling.label_source.LabelSource`): chunks of
episodes sampled and labeled by `Labeler`'s compiled program, sharded over the devices, with
agent-level credit (Shapley values) for multi-agent environments."""

from __future__ import annotations

import jax
import numpy as np

from hindsight.compile_cache import program_dir
from hindsight.envs import make
from hindsight.envs.families import family_of
from hindsight.errors import note
from hindsight.labeling import trajectories as tr
from hindsight.labeling.agents import MAX_ENUMERATED_AGENTS, agent_credit
from hindsight.labeling.config import LabelJob
from hindsight.labeling.engine import Labeler, episode_key, to_numpy
from hindsight.labeling.label_source import SourceInfo
from hindsight.labeling.rollout import Trajectory

AGENT_KEY_SALT = 0x0A6E7  # folds the coalition-rollout keys off an episode's root key
DEFAULT_PERMUTATIONS = 64  # sampled Shapley values, beyond MAX_ENUMERATED_AGENTS agents


def fitted_horizon(job: LabelJob) -> int | None:
  """The horizon a job labels at: `job.horizon` where given, else, for families that fit it
  (`EnvFamily.fit_horizon`: gymnax), the longest of the job's own episodes at the declared
  maximum (MemoryChain declares 1000 for episodes of 6 steps; padding every episode, the
  model's length and the reference to the declared maximum costs memory and time for
  nothing). The episodes are the same either way: their keys depend on the step, not on the
  horizon. Says what it chose, and what a given horizon truncates."""
  if not family_of(job.env).fit_horizon:
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


class JaxSource:
  """Chunks from the JAX engine (sharded over devices): a `labeling.label_source.LabelSource`."""

  def __init__(self, job: LabelJob):
    self.env, self.policy = make(job.env, job.policy, fitted_horizon(job), job.return_range)
    self.labeler = Labeler(self.env, self.policy, job.config, program_dir=program_dir())
    env = self.env
    params = self.labeler.env_params

    def first_step():
      state = env.reset(jax.random.key(0), params)
      return env.observation(state, params), env.state_index(state)

    # Shapes only: nothing is compiled (eager ops would compile one small program each).
    obs, index = jax.eval_shape(first_step)
    self._programs = {}  # chunk size -> chunk_program, all of one unit program
    # Multi-agent environments also get agent-level labels (Shapley values by coalition
    # rollouts from each episode's initial state, non-members' turns made null): every
    # coalition at K = num_rollouts up to MAX_ENUMERATED_AGENTS agents, else sampled orders.
    self.num_agents = env.num_agents
    permutations = job.permutations
    if self.num_agents > MAX_ENUMERATED_AGENTS and not permutations:
      permutations = DEFAULT_PERMUTATIONS
    self.info = SourceInfo(
      env_name=env.name,
      policy=self.policy.name,
      horizon=env.horizon,
      num_actions=env.num_actions,
      null_action=env.null_action,
      success_threshold=env.success_threshold,
      success_from_return=env.success_from_return,
      tag_names=tuple(env.tag_names),
      obs_shape=tuple(obs.shape),
      obs_dtype=obs.dtype,
      agent_names=tuple(env.agent_names),
      permutations=permutations,
      with_states=index is not None,
      coalitions=bool(self.num_agents) and not permutations,
    )
    if self.num_agents:
      K, policy, P = job.config.num_rollouts, self.policy, permutations

      def credit(actions, state0, key):
        return agent_credit(env, policy, actions, key, K, initial_state=state0,
                            num_permutations=P)  # fmt: skip

      self._agent_program = jax.jit(jax.vmap(credit))
      # Who acts at each step t < H (the same for every episode).
      self._acting = np.asarray(jax.vmap(env.agent_of_step)(np.arange(env.horizon)))

  def chunk_multiple(self) -> int:
    return self.labeler.chunk_multiple()

  def label(self, seed: int, start: int, stop: int, bar) -> dict:
    # A short chunk (the job's last) runs only the blocks that hold its episodes.
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

  def finish(self, chunk_paths: list[str]) -> dict:
    del chunk_paths
    return {}


def _flatten_chunk(env, traj: Trajectory, labels: dict, start: int, stop: int) -> dict:
  """Device outputs of one chunk -> the NumPy arrays stored in its file ([n, H, ...]).
  (The labels carry the tags and success; the trajectory's arrays the rest.)"""
  n = stop - start
  arrays = tr.trajectory_arrays(env, jax.tree.map(lambda x: x[:n], traj), with_tags=False)
  arrays.update({k: np.asarray(v)[:n] for k, v in labels.items()})
  arrays["episode"] = np.arange(start, stop)
  return arrays
