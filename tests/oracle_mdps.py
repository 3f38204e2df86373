"""The exact per-step credit of tabular MDPs, written apart from hindsight.credit.exact, and
FrozenLake as a TabularMDP: the oracles the label tests hold Monte Carlo labels against."""

from __future__ import annotations

import numpy as np

from hindsight.envs import TabularMDP


def backward_induction(mdp, gamma: float = 1.0):
  """Q [H, S, A] and V [H + 1, S] by plain loops (written apart from hindsight.credit.exact)."""
  H, S, A = mdp.horizon, mdp.num_states, mdp.num_actions
  Q, V = np.zeros((H, S, A)), np.zeros((H + 1, S))
  for t in reversed(range(H)):
    for s in range(S):
      for a in range(A):
        future = sum(
          mdp.P[s, a, n] * V[t + 1, n] for n in range(S) if not mdp.terminal[n] and t + 1 < H
        )
        Q[t, s, a] = mdp.r[s, a] + gamma * future
      V[t, s] = float(np.dot(mdp.pi[s], Q[t, s]))
  return Q, V


def replacement_distribution(kind: str, pi_s, a_t: int, null_action) -> np.ndarray:
  """q(. | s, a_t) written out for the oracle (every action legal)."""
  A = len(pi_s)
  if kind == "policy":
    return np.asarray(pi_s, float)
  if kind == "uniform":
    return np.full(A, 1.0 / A)
  if kind == "null":
    return np.eye(A)[null_action]
  others = np.where(np.arange(A) == a_t, 0.0, pi_s)  # policy_other
  return others / others.sum()


def exact_fields(mdp, traj, replacement: str, gamma: float = 1.0) -> dict[str, np.ndarray]:
  """credit, credit_realized and progress of every step of `traj` (NumPy leaves [E, H])."""
  Q, V = backward_induction(mdp, gamma)
  s, a, r, m = np.asarray(traj.states.s), traj.actions, traj.rewards, traj.mask
  E, H = a.shape
  out = {k: np.full((E, H), np.nan) for k in ("credit", "credit_realized", "progress")}
  for e in range(E):
    T = int(m[e].sum())
    g = 0.0
    for t in reversed(range(T)):
      g = r[e, t] + gamma * g
      q = replacement_distribution(replacement, mdp.pi[s[e, t]], a[e, t], mdp.null_action)
      baseline = float(np.dot(q, Q[t, s[e, t]]))
      out["credit"][e, t] = Q[t, s[e, t], a[e, t]] - baseline
      out["credit_realized"][e, t] = g - baseline
      v_next = V[t + 1, s[e, t + 1]] if t + 1 < T else 0.0
      out["progress"][e, t] = r[e, t] + gamma * v_next - V[t, s[e, t]]
  return out


def frozen_lake_mdp(horizon: int):
  """Gymnasium's slippery FrozenLake-v1 as a TabularMDP from its own transition table
  (`env.unwrapped.P`), under the adapters' default uniform policy. Needs no network."""
  import gymnasium

  env = gymnasium.make("FrozenLake-v1").unwrapped
  S, A = env.observation_space.n, env.action_space.n
  P, r, terminal = np.zeros((S, A, S)), np.zeros((S, A)), np.zeros(S, bool)
  for s in range(S):
    for a in range(A):
      for p, n, reward, done in env.P[s][a]:
        P[s, a, n] += p
        r[s, a] += p * reward
        terminal[n] |= done
  return TabularMDP(
    P=P, r=r, pi=np.full((S, A), 1.0 / A), mu0=np.eye(S)[0], horizon=horizon, terminal=terminal
  )
