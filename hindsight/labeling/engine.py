"""The labeling engine: every field of docs/design.md section 1 for every step of a trajectory.

For each step t and branch k = 1..K three arms start from the saved state s_t and share the
continuation key c_{t,k} (common random numbers):
  keep     a_t itself                        -> G^keep_{t,k}    estimates Q(s_t, a_t)
  replace  a' ~ q_-(. | s_t, a_t)            -> G^rep_{t,k}     estimates E_{q_-} Q(s_t, a')
  phi      a'' ~ pi(. | s_t)                 -> G^phi_{t,k}     estimates Phi(s_t) = V(s_t)
where q_- is q restricted to a' != a_t (stratified; LabelConfig.stratify=False draws from q
itself and sets w = 0). With w = q(a_t | s_t) and the identity
  Delta_t = Q(a_t) - E_q Q(a') = (1 - w) E_{a' ~ q_-}[Q(a_t) - Q(a')]
no branch is spent on a' = a_t, whose paired difference is 0 by construction:
  credit_t          = (1 - w) mean_k (G^keep - G^rep)          (1 - w) x stderr of the mean
  credit_realized_t = G_t(tau) - mean_k [w G^keep + (1 - w) G^rep]
  progress_t        = r_t + gamma Phi(s_{t+1}) - Phi(s_t)      the two Phi estimates come from
                                                               different branch keys, so they
                                                               are independent: se^2 adds
  phi_hard_t        = 1 if any k: R_{<=t} + gamma^{t+1} G^phi_{t+1,k} > success_threshold
                      (Math-Shepherd "hard" estimate, N = K continuations from s_{t+1});
                      stderr = sqrt(h (1 - h)), h = 1 - (1 - p)^K with p the fraction of
                      continuations that succeed: the plug-in spread of the indicator itself.
Every stderr of a nearly tied estimate is raised to the conservative tie bound of
`credit.estimators` (from the environment's `return_bounds`), so a stderr of 0 means exact.
With `exact`, credit, credit_realized and progress come from the dynamic-programming tables
instead (stderr 0) and only the phi arm is rolled (for phi_hard).

Keys: episode key e = fold_in(key(seed), episode_index); the trajectory uses fold_in(e, 0);
branch (t, k) takes four words from Threefry hashes of the counter t K + k under
fold_in(e, 1): its continuation key and the uniforms of the replace and phi arms' first
actions (`rollout.hash_words`). No key depends on how episodes are batched, so labels are
identical for any chunk size.

Rollouts: every branch of a micro-batch of episodes goes through one work queue of lanes
(`rollout.roll_branches`): a lane whose branch ends takes the next, so the work follows the
env steps that happen rather than the longest branch.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hindsight.credit.estimators import mean_stderr, tie_upper_rates, z_value
from hindsight.credit.exact import exact_step_credit, tabular_values
from hindsight.credit.fields import returns_to_go, step_fields
from hindsight.credit.replacement import check_replacement, replacement_probs, without_taken
from hindsight.envs.base import Environment
from hindsight.envs.tabular import TabularEnv
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.dispatch import (
  in_blocks,
  local_mesh_shardings,
  micro_batch_size,
  shard_over_local_devices,
  sharded_over_local_devices,
)
from hindsight.labeling.rollout import (
  Trajectory,
  hash_words,
  roll_branches,
  sample_episode,
  start_branch,
  unit_uniforms,
)
from hindsight.labeling.spot_check import label_one_step, return_bounds
from hindsight.labeling.stored import program_key, program_path, stored_program
from hindsight.labeling.xla import jit, unroll_threefry_on_cpu
from hindsight.policies.base import Policy, sample_categorical_from_uniform

PyTree = Any

# Lanes of the branch work queue (see rollout.roll_branches): enough to vectorise each
# step, few enough that the lanes' working set stays in cache on CPU.
_LANES = 4096


def episode_key(seed: int | jax.Array, episode_index: int | jax.Array) -> jax.Array:
  """The root key of one episode: a function of the seed and the episode's index only."""
  return jax.random.fold_in(jax.random.key(seed), episode_index)


class Labeler:
  """Samples and labels episodes of one (environment, policy, config).

  `label(trajectories, keys)` labels trajectories from anywhere (a replay buffer, an RL
  loop): their saved states, actions, rewards and masks. `sample_and_label(seed, indices)`
  samples the episodes itself first. `label_steps(trajectories, steps, keys)` labels one
  chosen step of each trajectory (the audit), and `step_info(trajectories)` says which steps
  have no credit and what range their returns can take. All are jitted and vmapped over the
  leading batch axis.
  """

  def __init__(
    self,
    env: Environment,
    policy: Policy,
    config: LabelConfig,
    env_params: PyTree | None = None,
    policy_params: PyTree | None = None,
    program_dir: str | None = None,
  ):
    """program_dir: where `unit_program` keeps its sample-and-label program between
    processes (`labeling.stored`: a warm process neither traces nor lowers it); None traces
    it in every process."""
    check_label_config(env, config)
    unroll_threefry_on_cpu()
    self.env, self.policy, self.config = env, policy, config
    self.env_params = env.default_params() if env_params is None else env_params
    self.policy_params = policy.default_params() if policy_params is None else policy_params
    self._tables = None
    if config.exact:
      q, v = tabular_values(env.mdp, config.gamma)
      self._tables = (jnp.asarray(q, jnp.float32), jnp.asarray(v, jnp.float32))
    self._units = {}  # relabel -> unit_program
    self._program_dir = program_dir
    # How unit_program() came to be: "traced", or from program_dir "exported" / "loaded".
    self.program_source = None
    # The public entry points below are methods (help() reads them) that call these.
    self._jitted = {
      "label": jit(self._label_batch),
      "label_steps": jit(jax.vmap(self._label_step)),
      "step_info": jit(jax.vmap(self._step_info)),
      "sample": jit(lambda keys: self.sample_under(self.policy_params, keys)),
      "sample_and_label": jit(self._sample_and_label),
    }

  def sample_and_label(self, seed, episode_indices) -> tuple[Trajectory, dict]:
    """(Trajectory, labels) of episodes `episode_indices` (int32 [E]) of `seed`: each sampled
    from its own key `episode_key(seed, i)` and labeled. Trajectory leaves are [E, H + 1, ...]
    (states) or [E, H] (actions, rewards, mask); labels are a dict of [E, H] arrays (credit,
    credit_stderr, progress, phi_hard, klass, ...: docs/labeling.md lists every field).
    Jitted; NumPy with `to_numpy`."""
    return self._jitted["sample_and_label"](seed, episode_indices)

  def sample(self, keys: jax.Array) -> Trajectory:
    """The episodes of `keys` [E] under the labeler's policy (no labels). Jitted."""
    return self._jitted["sample"](keys)

  def label(self, trajectories: Trajectory, keys: jax.Array) -> dict:
    """Labels of given trajectories (leaves [E, ...], from anywhere: a replay buffer, an RL
    loop) with branch keys `keys` [E]: a dict of [E, H] arrays as `sample_and_label`'s.
    Jitted."""
    return self._jitted["label"](trajectories, keys)

  def label_steps(self, trajectories: Trajectory, steps: jax.Array, keys: jax.Array) -> dict:
    """The credit of one chosen step `steps[e]` (int32 [E]) of each trajectory (the audit):
    a dict of [E] arrays. Jitted."""
    return self._jitted["label_steps"](trajectories, steps, keys)

  def step_info(self, trajectories: Trajectory) -> tuple[jax.Array, jax.Array]:
    """(undefined bool [E, H]: steps whose replacement q does not exist, so no credit;
    bounds [E, H, 2]: the (lo, hi) range of each step's return-to-go). Jitted."""
    return self._jitted["step_info"](trajectories)

  # Read only while a program is traced: a process that loads its stored unit program
  # never computes them (they import scipy.special, 0.4 s). NumPy, not jax: a jax array
  # made inside a trace would be that trace's tracer, cached past it.
  @functools.cached_property
  def _z(self) -> float:
    return z_value(self.config.confidence)

  @functools.cached_property
  def _upper_rates(self) -> np.ndarray:
    """float32 [MIN_OFF_TIE]: `tie_upper_rates` of the config."""
    return np.asarray(tie_upper_rates(self.config.num_rollouts, self.config.confidence), np.float32)

  # -- the chunk program used by labeling jobs ---------------------------------------------

  def micro_batch(self) -> int:
    """Episodes labeled together on one device (`dispatch.micro_batch_size` of the H K n_arms
    branches an episode starts). A function of the configuration only, never of the chunk
    size: that is what keeps labels bitwise identical for any chunk size."""
    arms = 1 if self.config.exact else 3
    return micro_batch_size(self.env.horizon * self.config.num_rollouts * arms)

  def chunk_multiple(self) -> int:
    """Chunk sizes are multiples of this: local devices x micro-batch (`unit_program`)."""
    return jax.local_device_count() * self.micro_batch()

  def chunk_program(self, chunk_size: int):
    """fn(seed, episode_indices [C]) -> (Trajectory, labels) as NumPy, sharded over devices.

    The chunk runs as C / chunk_multiple() calls of one compiled unit program (`unit_program`:
    a micro-batch on every local device), dispatched back to back. C must be a multiple of
    `chunk_multiple()`.
    """
    return self._chunked(chunk_size, self.unit_program(), n_shared=1)

  def relabel_program(self, chunk_size: int):
    """fn(trajectories, keys [C]) -> labels of given trajectories (leaves [C, ...]) as
    NumPy, sharded and micro-batched like `chunk_program` (the drift harness's high-K
    reference relabels saved trajectories with it). C: a multiple of `chunk_multiple()`."""
    return self._chunked(chunk_size, self.unit_program(relabel=True), n_shared=0)

  def unit_program(self, relabel: bool = False):
    """The compiled unit of `chunk_program` (or of `relabel_program`): one micro-batch of
    episodes on each local device, jitted over a 1-D `data` mesh of them; per-episode
    arguments have leading axis chunk_multiple().

    One small program rather than a loop over micro-batches inside one: it compiles in
    less time (`lax.map` around the rollouts cost 0.3 s more), and an episode runs through
    the same program whatever the chunk size. Made once per labeler: every chunk and
    relabel program of any size shares it, so it compiles once.
    """
    if relabel not in self._units:
      self._units[relabel] = self._unit_program(relabel)
    return self._units[relabel]

  def _unit_program(self, relabel: bool):
    if relabel:
      return sharded_over_local_devices(self._label_batch, n_shared=0, n_split=2)
    avals = (
      jax.ShapeDtypeStruct((), jnp.uint32),
      jax.ShapeDtypeStruct((self.chunk_multiple(),), jnp.int32),
    )
    # The labeler's own class too: a subclass from outside the package is traced every time.
    parts = (type(self), self.env, self.policy, self.env_params, self.policy_params, self.config)
    key = program_key("sample_and_label", parts, avals) if self._program_dir else None
    if key is None:
      self.program_source = "traced"
      return sharded_over_local_devices(self._sample_and_label, n_shared=1, n_split=1)
    in_shardings, out_sharding = local_mesh_shardings(n_shared=1, n_split=1)
    program, self.program_source = stored_program(
      shard_over_local_devices(self._sample_and_label, n_shared=1, n_split=1),
      avals,
      in_shardings,
      out_sharding,
      program_path(self._program_dir, key),
    )
    return program

  def _chunked(self, chunk_size: int, unit, n_shared: int):
    return in_blocks(unit, chunk_size, self.chunk_multiple(), n_shared)

  # -- one episode ------------------------------------------------------------------------

  def sample_under(self, policy_params: PyTree, keys: jax.Array) -> Trajectory:
    """`sample` as a pure, unjitted function of the policy's parameters too (the twin of
    `label_under`): the episodes of `keys` [E] under pi_{policy_params}."""
    return jax.vmap(self._sample_episode, (0, None))(keys, policy_params)

  def _sample_episode(self, key: jax.Array, policy_params: PyTree = None) -> Trajectory:
    params = self.policy_params if policy_params is None else policy_params
    return sample_episode(
      self.env, self.policy, self.env_params, params, jax.random.fold_in(key, 0)
    )

  def _sample_and_label(self, seed, episode_indices):
    keys = jax.vmap(episode_key, (None, 0))(seed, episode_indices)
    traj = jax.vmap(self._sample_episode)(keys)
    return traj, self._label_batch(traj, keys)

  def _label_step(self, traj: Trajectory, t: jax.Array, key: jax.Array) -> dict[str, jax.Array]:
    """The credit of step t of one trajectory alone (`spot_check.label_one_step`)."""
    return label_one_step(
      self.env,
      self.policy,
      self.config,
      self.env_params,
      self.policy_params,
      traj,
      t,
      key,
      upper_rates=jnp.asarray(self._upper_rates),
      z=self._z,
    )

  def _step_info(self, traj: Trajectory) -> tuple[jax.Array, jax.Array]:
    """What a step's label can be before any rollout: (undefined [H] bool, q does not exist
    for a valid step; bounds [H, 2], (lo, hi) of the return-to-go from s_t)."""
    states = jax.tree.map(lambda x: x[: self.env.horizon], traj.states)
    pi = jax.vmap(self.policy.probs, (None, 0, None))(self.policy_params, states, self.env_params)
    legal = jax.vmap(self.env.legal_actions, (0, None))(states, self.env_params)
    _, undefined = jax.vmap(replacement_probs, (None, 0, 0, 0, None))(
      self.config.replacement, pi, legal, traj.actions, self.env.null_action
    )
    return undefined & traj.mask, jax.vmap(self._return_bounds)(states)

  def _branch_starts(self, traj: Trajectory, key: jax.Array, policy_params: PyTree):
    """What each branch of one episode starts with: forced first action and key.

    Returns (firsts, key_words, banned, q, undefined, keep_share): firsts and banned [H, K,
    n_arms] (arms: keep, replace, phi; only phi when exact), key_words uint32 [H, K, 2] (the
    continuation key the arms of branch (t, k) share), q [H, A], undefined and keep_share
    [H]. `banned` is the content class a continuation may not take (-1: none). With
    `stratify` the replace arm draws from q restricted to a' != a_t and keep_share = q(a_t)
    (else 0).
    """
    env, cfg = self.env, self.config
    H, K = env.horizon, cfg.num_rollouts
    states, a = jax.tree.map(lambda x: x[:H], traj.states), traj.actions
    pi = jax.vmap(self.policy.probs, (None, 0, None))(policy_params, states, self.env_params)
    legal = jax.vmap(env.legal_actions, (0, None))(states, self.env_params)
    q, undefined = jax.vmap(replacement_probs, (None, 0, 0, 0, None))(
      cfg.replacement, pi, legal, a, env.null_action
    )
    if cfg.stratify:
      keep_share = jnp.take_along_axis(q, a[:, None], axis=-1)[:, 0]
      rest, mass = jax.vmap(without_taken)(q, a)
      # q(a_t) = 1 leaves nothing else: draw a_t (its credit is scaled by 0, exactly).
      q_draw = jnp.where(mass[:, None] > 0, rest, q)
    else:
      keep_share, q_draw = jnp.zeros((H,), jnp.float32), q

    # Branch (t, k): four words from one pair of hashes of the counter t K + k under the
    # episode's branch key: the continuation key (2 words) and the uniforms of the replace
    # and phi arms' first actions.
    root = jax.random.key_data(jax.random.fold_in(key, 1))
    counters = jnp.arange(H * K, dtype=jnp.uint32)
    words = jax.vmap(hash_words, (None, 0, None))(root, counters, 4).reshape(H, K, 4)
    u = unit_uniforms(words[..., 2:])  # [H, K, 2]
    draw = jax.vmap(jax.vmap(sample_categorical_from_uniform, (0, None)))
    a_phi = draw(u[..., 1], pi)  # [H, K]
    if cfg.exact:  # only the phi arm is needed (for phi_hard); DP gives the rest
      firsts = a_phi[..., None]
    else:
      a_rep = draw(u[..., 0], q_draw)
      firsts = jnp.stack([jnp.broadcast_to(a[:, None], (H, K)), a_rep, a_phi], -1)
    # policy_no_repeat: only the replace arm's continuation avoids a_t's content class.
    banned = jnp.full(firsts.shape, -1, jnp.int32)
    if cfg.replacement == "policy_no_repeat" and not cfg.exact:
      klass_t = jax.vmap(env.action_class, (0, 0, None))(states, a, self.env_params)
      banned = banned.at[:, :, 1].set(klass_t[:, None])
    return firsts, words[..., :2], banned, q, undefined & traj.mask, keep_share

  def _rollout(
    self, traj: Trajectory, firsts, key_words, banned, policy_params: PyTree, step_mask=None,
    num_lanes: int = _LANES,
  ):  # fmt: skip
    """Branch returns G, step counts (both [E, H, K, n_arms]) and success [E, H, K, n_arms]
    (env.success of the branch's final state with the episode return it implies, R_{<t} +
    gamma^t G), from the branch starts of `_branch_starts` (batched over E episodes).

    All branches of the batch go through one work queue (`roll_branches`, `num_lanes`
    lanes), the longest first: branch ids run over [E, H, K, n_arms]; the queue takes them
    start step by start step and skips those that start after their episode has ended, and
    with `step_mask` (bool [E, H]) those of the steps it leaves out (G = 0 and 0 steps there).
    """
    E, H, K, n = firsts.shape
    gamma = self.config.gamma
    B = E * H * K * n
    starts = jax.tree.map(lambda x: x[:, :H], traj.states)
    discounts = gamma ** jnp.arange(H, dtype=jnp.float32)
    offsets = jnp.cumsum(discounts * traj.rewards, axis=1) - discounts * traj.rewards  # R_{<t}
    ids = jnp.arange(B, dtype=jnp.int32).reshape(E, H, K, n)
    live = ~starts.done if step_mask is None else ~starts.done & step_mask
    rolled = jnp.broadcast_to(live[:, :, None, None], ids.shape)
    time_major = jnp.swapaxes(ids, 0, 1).reshape(-1)
    keep = jnp.swapaxes(rolled, 0, 1).reshape(-1)
    count = keep.sum()
    order = time_major[jnp.nonzero(keep, size=B, fill_value=0)[0]]
    flat_firsts, flat_banned = firsts.reshape(-1), banned.reshape(-1)
    flat_keys = key_words.reshape(-1, 2)

    def load(b):
      e, t = b // (H * K * n), (b // (K * n)) % H
      return jax.vmap(start_branch)(
        jax.tree.map(lambda x: x[e, t], starts),
        flat_firsts[b],
        flat_keys[b // n],
        H - t,
        flat_banned[b],
        offsets[e, t],
        discounts[t],
      )

    # Branches that never roll (their episode has ended) succeed as the episode did.
    success0 = jax.vmap(jax.vmap(self.env.success))(starts, offsets)
    success0 = jnp.broadcast_to(success0[:, :, None, None], ids.shape).reshape(-1)
    G, steps, success = roll_branches(
      self.env,
      self.policy,
      self.env_params,
      policy_params,
      load,
      order,
      count,
      success0,
      num_lanes=num_lanes,
      gamma=gamma,
      use_banned=self.config.replacement == "policy_no_repeat" and not self.config.exact,
    )
    shape = (E, H, K, n)
    return G.reshape(shape), steps.reshape(shape), success.reshape(shape)

  def _label_batch(self, traj: Trajectory, keys: jax.Array) -> dict[str, jax.Array]:
    """Labels a batch of episodes: traj leaves [E, H, ...], keys [E]."""
    out = self.label_under(self.policy_params, traj, keys)
    del out["arm_steps"]
    return out

  def label_under(
    self,
    policy_params: PyTree,
    traj: Trajectory,
    keys: jax.Array,
    credit_only: bool = False,
    step_mask: jax.Array | None = None,
    num_lanes: int | None = None,
  ) -> dict:
    """`label` as a pure, unjitted function of the policy's parameters too: the labels of
    trajectories (leaves [E, H, ...], keys [E]) under pi_{policy_params}, for a caller's own
    jit whose policy changes between calls (an RL update). Beside the label fields it
    returns arm_steps int32 [E, 3]: the env steps each arm's branches took (keep, replace,
    phi; only phi with `exact`), so a caller can charge an estimator for the arms it uses.

    credit_only: roll the keep and replace arms alone (a third fewer branch steps) and
    return only credit, credit_stderr and credit_bounded [E, H], bit for bit those of the
    full labels (the same branches, keys and estimator), arm_steps with 0 for phi, and
    credit_sample_stderr [E, H]: the branch pairs' own standard error, (1 - w) std(G^keep -
    G^rep, ddof=1) / sqrt(K), before any tie bound raises it (an unbiased estimate of the
    label's noise, where credit_stderr is a conservative bound on it).
    step_mask: bool [E, H], the steps to label (None: all). No branch of another step rolls, so
    the env steps spent follow the steps chosen; the labels of the chosen steps are bit for
    bit the unmasked ones (a branch's keys and result depend on its own (t, k) only), and
    those of the others are meaningless (mask them out).
    num_lanes: the branch work queue's lanes (default 4,096): about the branches that roll,
    so a sparse `step_mask` does not step thousands of idle lanes.
    """
    if credit_only and self.config.exact:
      raise HindsightError("credit_only needs Monte Carlo labels (exact takes credit from DP)")
    starts = jax.vmap(self._branch_starts, (0, 0, None))(traj, keys, policy_params)
    firsts, key_words, banned, q, undefined, keep_share = starts
    if credit_only:
      firsts, banned = firsts[..., :2], banned[..., :2]
    lanes = _LANES if num_lanes is None else int(num_lanes)
    G, steps, success = self._rollout(
      traj, firsts, key_words, banned, policy_params, step_mask=step_mask, num_lanes=lanes
    )
    arm_steps = steps.sum((1, 2)).astype(jnp.int32)  # [E, n_arms]
    if credit_only:
      # The credit reads the keep and replace arms only; the replace arm stands in for the
      # phi arm the reduction expects, and the fields it would feed are dropped below.
      G = jnp.concatenate([G, G[..., 1:]], -1)
      arm_steps = jnp.pad(arm_steps, ((0, 0), (0, 1)))
    out = jax.vmap(self._reduce)(traj, G, steps, success[..., -1], q, undefined, keep_share)
    if credit_only:
      out = {name: out[name] for name in ("credit", "credit_stderr", "credit_bounded")}
      _, spread = mean_stderr(G[..., 0] - G[..., 1])  # [E, H] over the K branch pairs
      out["credit_sample_stderr"] = jnp.where(traj.mask, (1.0 - keep_share) * spread, 0.0)
    out["arm_steps"] = arm_steps
    return out

  def _reduce(
    self, traj: Trajectory, G, steps, phi_success, q, undefined, keep_share
  ) -> dict[str, jax.Array]:
    """All label fields of one episode from its branch returns G [H, K, n_arms] and the
    success of its phi continuations phi_success [H, K] (the branch from s_t)."""
    env, cfg = self.env, self.config
    H, K, gamma = env.horizon, cfg.num_rollouts, cfg.gamma
    states = jax.tree.map(lambda x: x[:H], traj.states)
    final_state = jax.tree.map(lambda x: x[H], traj.states)
    a, r, mask = traj.actions, traj.rewards, traj.mask
    t_index = jnp.arange(H)
    exact = None
    if cfg.exact:
      q_table, v_table = self._tables
      s = jax.vmap(env.state_index)(states)
      qvals = q_table[t_index, s]  # [H, A]
      credit, realized = jax.vmap(exact_step_credit)(q, qvals, a, returns_to_go(r, gamma))
      # V_{t+1}(s_{t+1}) counts only if step t+1 happens (not terminal, not past the horizon).
      mask_next = jnp.append(mask[1:], False)
      v_next = jnp.where(mask_next, v_table[t_index + 1, jnp.append(s[1:], 0)], 0.0)
      exact = (credit, realized, r + gamma * v_next - v_table[t_index, s])

    # Continuations from s_{t+1}: the phi arms at t + 1; after step H - 1, the episode.
    last = jnp.broadcast_to(env.success(final_state, returns_to_go(r, gamma)[0]), (1, K))
    success = jnp.concatenate([phi_success[1:], last])
    out = step_fields(
      G,
      r,
      mask,
      success,
      undefined,
      keep_share=keep_share,
      bounds=jax.vmap(self._return_bounds)(traj.states),
      upper_rates=jnp.asarray(self._upper_rates),
      gamma=gamma,
      tolerance=cfg.decorative_tolerance,
      z=self._z,
      exact=exact,
    )
    out["tags"] = jax.vmap(env.tag, (0, 0, None))(states, a, self.env_params)
    out["success"] = traj.success  # the trajectory's own (rollout.Trajectory)
    out["rollout_steps"] = steps.sum().astype(jnp.int64 if jax.config.x64_enabled else jnp.int32)
    return out

  def _return_bounds(self, state) -> jax.Array:
    return return_bounds(self.env, self.env_params, state)


def check_label_config(env: Environment, config: LabelConfig) -> None:
  """Refuses a configuration the engine cannot label (one-line HindsightError)."""
  check_replacement(config.replacement, env.null_action, env.name, env.has_action_classes)
  if config.exact and config.replacement == "policy_no_repeat":
    raise HindsightError("exact does not cover policy_no_repeat (its continuation differs)")
  if config.exact and not isinstance(env, TabularEnv):
    raise HindsightError(f"exact needs a tabular MDP, not environment '{env.name}'")


def to_numpy(tree) -> Any:
  """Device arrays -> NumPy (one transfer per leaf)."""
  return jax.tree.map(np.asarray, jax.device_get(tree))
