"""Exact credit by dynamic programming for tabular MDPs (docs/design.md, section 2): the oracle.

  Q_t(s, a) = r[s, a] + gamma * sum_s' P[s, a, s'] * c_{t+1}(s') * V_{t+1}(s')
  V_t(s)    = sum_a pi[s, a] Q_t(s, a)
with c_{t+1}(s') = 0 if terminal[s'] or t + 1 == H, else 1 (no value after the end).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class MDPArrays(Protocol):
  """The arrays of a finite-horizon tabular MDP, as the math reads them (the tabular MDP file
  of docs/design.md, section 2; `envs.tabular.TabularMDP` is one): the math takes arrays and
  knows no environment."""

  P: np.ndarray  # float [S, A, S] transition probabilities
  r: np.ndarray  # float [S, A] reward
  pi: np.ndarray  # float [S, A] the policy
  mu0: np.ndarray  # float [S] initial distribution
  terminal: np.ndarray  # bool [S]
  horizon: int  # H


def tabular_values(mdp: MDPArrays, gamma: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
  """Backward induction over the horizon, in float64.

  Returns:
    Q: [H, S, A], Q_t(s, a) for t = 0..H-1.
    V: [H + 1, S], V_t(s); V_H = 0.
  """
  H, (S, A) = mdp.horizon, np.shape(mdp.r)
  Q = np.zeros((H, S, A))
  V = np.zeros((H + 1, S))
  alive_next = (~mdp.terminal).astype(np.float64)
  for t in range(H - 1, -1, -1):
    cont = alive_next * V[t + 1] if t + 1 < H else np.zeros(S)
    Q[t] = mdp.r + gamma * mdp.P @ cont
    V[t] = (mdp.pi * Q[t]).sum(-1)
  return Q, V


def exact_step_credit(q_t, qvals_t, a_t, return_to_go_t):
  """Exact credit fields of one step from its Q-values (works on NumPy or JAX arrays).

  Args:
    q_t: [A] replacement distribution q(. | s_t, a_t).
    qvals_t: [A] Q_t(s_t, .).
    a_t: [] the action taken.
    return_to_go_t: [] G_t of the realised trajectory.

  Returns:
    credit = Q_t(s_t, a_t) - sum_a' q(a') Q_t(s_t, a')
    credit_realized = G_t - sum_a' q(a') Q_t(s_t, a')
  """
  baseline = (q_t * qvals_t).sum(-1)
  return qvals_t[a_t] - baseline, return_to_go_t - baseline
