"""Tabular MDPs loaded from an .npz file (docs/design.md, section 2), validated on load.

File contract (`--env tabular:PATH.npz`):
  P        float [S, A, S]  transition probabilities, rows sum to 1
  r        float [S, A]     reward
  pi       float [S, A]     the behaviour policy, rows sum to 1
  mu0      float [S]        initial distribution (no mass on terminal states)
  horizon  int              H
  terminal bool [S]         optional, default all False
  null_action int           optional, in [0, A)
  success_threshold float   optional, default 0: success means return > threshold
  action_names str [A]      optional, used as per-step tags (default "a0", "a1", ...)

Dynamics: a_t ~ pi[s_t], reward r[s_t, a_t], s_{t+1} ~ P[s_t, a_t]; the episode ends when
terminal[s_{t+1}] or t + 1 == H.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile

import jax
import jax.numpy as jnp
import numpy as np

from hindsight import pytree
from hindsight.envs.base import Environment
from hindsight.errors import HindsightError

# Rows of P, pi and mu0 must sum to 1 within this tolerance.
_SUM_TOL = 1e-6


@pytree.dataclass
class TabularState:
  s: jax.Array  # int32 [] state index
  time: jax.Array  # int32 [] steps taken since reset
  done: jax.Array  # bool [] the episode has ended


@pytree.dataclass
class TabularParams:
  P_cdf: jax.Array  # float32 [S, A, S] cumulative transition probabilities over s'
  r: jax.Array  # float32 [S, A]
  mu0_cdf: jax.Array  # float32 [S]
  terminal: jax.Array  # bool [S]
  g_bounds: jax.Array  # float32 [H + 1, S, 2] (lo, hi) of G_t from (t, s) (return_bounds)


@dataclasses.dataclass(frozen=True)
class TabularMDP:
  """The validated arrays of a tabular MDP file (NumPy, float64)."""

  P: np.ndarray
  r: np.ndarray
  pi: np.ndarray
  mu0: np.ndarray
  horizon: int
  terminal: np.ndarray
  null_action: int | None = None
  success_threshold: float = 0.0
  action_names: tuple[str, ...] | None = None

  @property
  def num_states(self) -> int:
    return self.P.shape[0]

  @property
  def num_actions(self) -> int:
    return self.P.shape[1]

  def save(self, path: str | os.PathLike) -> None:
    """Writes the file contract above."""
    arrays = dict(
      P=self.P,
      r=self.r,
      pi=self.pi,
      mu0=self.mu0,
      horizon=np.int64(self.horizon),
      terminal=self.terminal,
      success_threshold=np.float64(self.success_threshold),
    )
    if self.null_action is not None:
      arrays["null_action"] = np.int64(self.null_action)
    if self.action_names is not None:
      arrays["action_names"] = np.asarray(self.action_names)
    np.savez(path, **arrays)


def cdf_table(p: np.ndarray) -> np.ndarray:
  """float32 cumulative sums over the last axis, exactly 1.0 from the last positive entry on.

  Pinning the tail to 1.0 means an inverse-CDF draw with u in [0, 1) can never land on an
  outcome of probability zero through float32 round-off.
  """
  cdf = np.cumsum(np.asarray(p, np.float64), axis=-1)
  cdf[cdf >= cdf[..., -1:] - 1e-12] = 1.0
  return cdf.astype(np.float32)


def inverse_cdf(u: jax.Array, cdf: jax.Array) -> jax.Array:
  """Index i with cdf[i-1] < u <= cdf[i], clipped to the last index (float round-off)."""
  return jnp.minimum(jnp.sum(u > cdf, axis=-1), cdf.shape[-1] - 1).astype(jnp.int32)


class TabularEnv(Environment):
  """A tabular MDP as a functional environment. The policy lives apart (TabularPolicy)."""

  def __init__(self, mdp: TabularMDP, name: str = "tabular"):
    self.mdp = mdp
    self.name = name
    self.num_states = mdp.num_states
    self.num_actions = mdp.num_actions
    self.horizon = mdp.horizon
    self.null_action = mdp.null_action
    self.success_threshold = mdp.success_threshold
    self.tag_names = mdp.action_names or tuple(f"a{i}" for i in range(mdp.num_actions))

  def default_params(self) -> TabularParams:
    return TabularParams(
      P_cdf=jnp.asarray(cdf_table(self.mdp.P)),
      r=jnp.asarray(self.mdp.r, jnp.float32),
      mu0_cdf=jnp.asarray(cdf_table(self.mdp.mu0)),
      terminal=jnp.asarray(self.mdp.terminal, bool),
      g_bounds=jnp.asarray(return_bound_table(self.mdp), jnp.float32),
    )

  def reset(self, key, params: TabularParams) -> TabularState:
    s = inverse_cdf(jax.random.uniform(key), params.mu0_cdf)
    return TabularState(s=s, time=jnp.int32(0), done=jnp.bool_(False))

  num_step_uniforms = 1

  def step(self, key, state: TabularState, action, params: TabularParams):
    return self.step_from_uniforms(jax.random.uniform(key, (1,)), state, action, params)

  def step_from_uniforms(self, u, state: TabularState, action, params: TabularParams):
    # Inverse CDF: the same u under two actions gives monotonically coupled next states.
    s_next = inverse_cdf(u[0], params.P_cdf[state.s, action])
    reward = params.r[state.s, action]
    time = state.time + 1
    done = params.terminal[s_next] | (time >= self.horizon)
    return TabularState(s=s_next, time=time, done=done), reward, done

  def observation(self, state: TabularState, params) -> jax.Array:
    del params
    return state.s

  def state_index(self, state: TabularState) -> jax.Array:
    return state.s

  def return_bounds(self, state: TabularState, params: TabularParams) -> jax.Array:
    return params.g_bounds[state.time, state.s]


def return_bound_table(mdp: TabularMDP) -> np.ndarray:
  """(lo, hi) of the return-to-go from each (t, s), float64 [H + 1, S, 2], by DP over the paths
  with positive probability: any first action, then the actions pi can take.

  Rewards enter as min(r, 0) for lo and max(r, 0) for hi, so the bounds hold for every
  gamma in (0, 1]; row H (after the horizon) is 0.
  """
  H, S = mdp.horizon, mdp.num_states
  reach = mdp.P > 0  # [S, A, S]
  alive = ~mdp.terminal
  table = np.zeros((H + 1, S, 2))
  cont = np.zeros((S, 2))  # bounds of what follows s' under pi, at t + 1
  for t in range(H - 1, -1, -1):
    nxt = np.where(alive[:, None], cont, 0.0) if t + 1 < H else np.zeros((S, 2))
    lo = np.minimum(mdp.r, 0.0) + np.where(reach, nxt[None, None, :, 0], np.inf).min(-1)
    hi = np.maximum(mdp.r, 0.0) + np.where(reach, nxt[None, None, :, 1], -np.inf).max(-1)
    table[t, :, 0], table[t, :, 1] = lo.min(-1), hi.max(-1)
    taken = mdp.pi > 0
    cont = np.stack(
      [np.where(taken, lo, np.inf).min(-1), np.where(taken, hi, -np.inf).max(-1)], axis=-1
    )
  return table


def _fail(path, message: str):
  raise HindsightError(f"tabular MDP {path}: {message}")


def _check_distribution(path, name: str, x: np.ndarray) -> None:
  """Entries in [0, 1] and sums over the last axis equal to 1 within _SUM_TOL."""
  if not np.all(np.isfinite(x)):
    _fail(path, f"{name} has non-finite entries")
  bad = np.argwhere((x < 0) | (x > 1))
  if bad.size:
    idx = tuple(int(i) for i in bad[0])
    _fail(path, f"{name}{list(idx)} = {x[idx]:.6g} is not a probability in [0, 1]")
  sums = x.sum(axis=-1)
  bad = np.argwhere(np.abs(sums - 1.0) > _SUM_TOL)
  if bad.size:
    idx = tuple(int(i) for i in bad[0])
    where = f" row {list(idx)}" if idx else ""
    _fail(path, f"{name}{where} sums to {float(sums[idx]):.9g}, not 1 (tolerance {_SUM_TOL:g})")


def _scalar(path, data, name: str, kind: type):
  value = np.asarray(data[name])
  if value.shape != ():
    _fail(path, f"{name} must be a scalar, got shape {value.shape}")
  if kind is int and not np.issubdtype(value.dtype, np.integer):
    _fail(path, f"{name} must be an integer, got dtype {value.dtype}")
  if kind is float and not np.issubdtype(value.dtype, np.number):
    _fail(path, f"{name} must be a number, got dtype {value.dtype}")
  return kind(value)


def load_tabular(path: str | os.PathLike) -> TabularMDP:
  """Loads and validates a tabular MDP file; any violation raises a one-line HindsightError."""
  if not os.path.isfile(path):
    _fail(path, "no such file")
  try:
    with np.load(path, allow_pickle=False) as npz:
      data = {k: npz[k] for k in npz.files}
  except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
    _fail(path, f"not a readable .npz file ({type(e).__name__})")
  for name in ("P", "r", "pi", "mu0", "horizon"):
    if name not in data:
      _fail(path, f"missing required array '{name}'")

  P = np.asarray(data["P"])
  if P.ndim != 3 or P.shape[0] != P.shape[2] or P.shape[0] < 1 or P.shape[1] < 1:
    _fail(path, f"P must have shape [S, A, S], got {P.shape}")
  S, A = P.shape[0], P.shape[1]
  arrays = {}
  for name, shape in (("P", (S, A, S)), ("r", (S, A)), ("pi", (S, A)), ("mu0", (S,))):
    x = np.asarray(data[name])
    if x.shape != shape:
      _fail(path, f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
      _fail(path, f"{name} must be real numbers, got dtype {x.dtype}")
    arrays[name] = x.astype(np.float64)
  if not np.all(np.isfinite(arrays["r"])):
    _fail(path, "r has non-finite entries")
  for name in ("P", "pi", "mu0"):
    _check_distribution(path, name, arrays[name])

  horizon = _scalar(path, data, "horizon", int)
  if horizon < 1:
    _fail(path, f"horizon must be >= 1, got {horizon}")

  terminal = np.zeros(S, bool)
  if "terminal" in data:
    terminal = np.asarray(data["terminal"])
    if terminal.shape != (S,) or terminal.dtype != np.bool_:
      _fail(path, f"terminal must be bool [{S}], got {terminal.dtype} {list(terminal.shape)}")
    on_terminal = np.flatnonzero(terminal & (arrays["mu0"] > 0))
    if on_terminal.size:
      _fail(path, f"mu0 puts mass on terminal state {int(on_terminal[0])}")

  null_action = None
  if "null_action" in data:
    null_action = _scalar(path, data, "null_action", int)
    if not 0 <= null_action < A:
      _fail(path, f"null_action {null_action} is out of range [0, {A})")

  success_threshold = 0.0
  if "success_threshold" in data:
    success_threshold = _scalar(path, data, "success_threshold", float)
    if not np.isfinite(success_threshold):
      _fail(path, "success_threshold must be finite")

  action_names = None
  if "action_names" in data:
    names = np.asarray(data["action_names"])
    if names.shape != (A,) or names.dtype.kind != "U":
      _fail(path, f"action_names must be {A} strings, got {names.dtype} {list(names.shape)}")
    action_names = tuple(str(n) for n in names)

  return TabularMDP(
    P=arrays["P"],
    r=arrays["r"],
    pi=arrays["pi"],
    mu0=arrays["mu0"],
    horizon=horizon,
    terminal=terminal,
    null_action=null_action,
    success_threshold=success_threshold,
    action_names=action_names,
  )


def random_mdp(
  seed: int,
  num_states: int = 6,
  num_actions: int = 3,
  horizon: int = 8,
  *,
  num_terminal: int = 1,
  branching: int = 3,
  null_action: int | None = 0,
) -> TabularMDP:
  """A random MDP for tests and benchmarks: sparse-ish transitions, Gaussian rewards.

  Each (s, a) reaches `branching` random next states with Dirichlet weights; the last
  `num_terminal` states are terminal; the policy is a random softmax, so every action has
  mass (policy_other is always defined).
  """
  rng = np.random.default_rng(seed)
  S, A = num_states, num_actions
  P = np.zeros((S, A, S))
  for s in range(S):
    for a in range(A):
      nxt = rng.choice(S, size=min(branching, S), replace=False)
      P[s, a, nxt] = rng.dirichlet(np.ones(len(nxt)))
  r = rng.normal(size=(S, A))
  logits = rng.normal(size=(S, A))
  pi = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  terminal = np.zeros(S, bool)
  if num_terminal:
    terminal[S - num_terminal :] = True
  mu0 = np.where(terminal, 0.0, 1.0)
  mu0 /= mu0.sum()
  return TabularMDP(
    P=P, r=r, pi=pi, mu0=mu0, horizon=horizon, terminal=terminal, null_action=null_action
  )


def key_corridor_mdp(
  length: int = 5,
  horizon: int = 20,
  key_position: int = 1,
  slip: float = 0.1,
  pi_move_right: float = 0.55,
) -> TabularMDP:
  """A small corridor with a key and a door: the bundled demo MDP (data/key_corridor.npz).

  States: (position in [0, length), has_key) -> index 2 * position + has_key, plus one
  terminal state (the door passed). The agent starts at position 0 without the key.
  Actions: 0 `wait` (the null action), 1 `left`, 2 `right`, 3 `pick` (takes the key only at
  `key_position`). Moves slip (stay put) with probability `slip`. Stepping right from the
  last position with the key opens the door: reward 1 and the episode ends. Success: return
  > 0.5. So `pick` at the key is load-bearing, `wait` and `pick` elsewhere are decorative
  (beyond the time they cost), and `left` is harmful.
  """
  L = length
  S, A = 2 * L + 1, 4
  done = S - 1
  P = np.zeros((S, A, S))
  r = np.zeros((S, A))
  for pos in range(L):
    for key in (0, 1):
      s = 2 * pos + key
      P[s, 0, s] = 1.0  # wait
      left = 2 * max(pos - 1, 0) + key
      P[s, 1, left] += 1 - slip
      P[s, 1, s] += slip
      if pos == L - 1:
        if key:
          P[s, 2, done] = 1.0
          r[s, 2] = 1.0
        else:
          P[s, 2, s] = 1.0  # the door is locked
      else:
        P[s, 2, 2 * (pos + 1) + key] += 1 - slip
        P[s, 2, s] += slip
      P[s, 3, 2 * pos + 1 if pos == key_position else s] = 1.0
  P[done, :, done] = 1.0
  rest = (1.0 - pi_move_right) / 3
  pi = np.tile([rest, rest, pi_move_right, rest], (S, 1))
  terminal = np.zeros(S, bool)
  terminal[done] = True
  mu0 = np.zeros(S)
  mu0[0] = 1.0
  return TabularMDP(
    P=P,
    r=r,
    pi=pi,
    mu0=mu0,
    horizon=horizon,
    terminal=terminal,
    null_action=0,
    success_threshold=0.5,
    action_names=("wait", "left", "right", "pick"),
  )


def with_peaked_policy(mdp: TabularMDP, peak: float, favourite=None) -> TabularMDP:
  """`mdp` with pi putting `peak` on one action per state (int [S]; default: pi's argmax)
  and the rest spread evenly over the other actions."""
  favourite = mdp.pi.argmax(-1) if favourite is None else np.asarray(favourite)
  pi = np.full(mdp.pi.shape, (1.0 - peak) / (mdp.num_actions - 1))
  pi[np.arange(mdp.num_states), favourite] = peak
  return dataclasses.replace(mdp, pi=pi)


def peaked_mdp(seed: int, peak: float = 0.96, horizon: int = 10, sparse: bool = False):
  """A random MDP (8 states, 3 actions) whose policy puts `peak` on one action per state.

  Rewards are random_mdp's Gaussians, or with `sparse` 1 on 15% of (s, a) and 0 elsewhere.
  A stress case for Monte Carlo labels: under the plain `policy` replacement most draws are
  a_t itself (paired difference 0), and with sparse rewards most other differences tie too.
  """
  mdp = random_mdp(seed, num_states=8, num_actions=3, horizon=horizon)
  rng = np.random.default_rng(seed + 1000)
  mdp = with_peaked_policy(mdp, peak, rng.integers(3, size=mdp.num_states))
  r = (rng.random(mdp.r.shape) < 0.15).astype(np.float64) if sparse else mdp.r
  return dataclasses.replace(mdp, r=r)


def rare_success_mdp() -> TabularMDP:
  """The key corridor under a policy that rarely opens the door (success 1.35% by DP): a
  stress case where all K branches of most steps tie although the credit is not 0."""
  return key_corridor_mdp(length=5, horizon=11, key_position=2, slip=0.1, pi_move_right=0.28)
