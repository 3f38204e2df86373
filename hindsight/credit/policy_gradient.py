"""What a credit signal does to a policy gradient, against the exact gradient of a tabular MDP.

Policy: pi(a | s) = softmax(theta[s])_a (theta = log pi), stationary over a horizon H.
For one episode and per-step credits C_t the estimator is
  g = sum_t C_t grad_theta log pi(a_t | s_t),  grad_theta[s, b] log pi(a | s') =
      1[s = s'] (1[b = a] - pi(b | s')),
and the exact gradient of J = E[sum_t gamma^t r_t] (finite horizon, time-dependent Q_t) is
  g*[s, b] = sum_t gamma^t d_t(s) pi(b | s) (Q_t(s, b) - V_t(s)),
d_t(s) = P(s_t = s, the episode still running at t) (`occupancy`). Credit C_t = G_t, R, or
Q_t(s_t, a_t) - b(s_t) for any baseline b independent of a_t gives an unbiased estimator;
credit under `policy_other` is A(s, a) / (1 - pi(a | s)), an action-dependent scaling, so
it is biased.

Statistics over N per-episode estimates g_i (the COCOA paper's definitions, so numbers
compare): with E g = mean_i g_i and mean over the parameters,
  bias_db   = 20 log10(|g* - E g| / |g*|)
  variance  = mean_params var_i(g_i) / mean_params(g*^2)
  snr_db    = 10 log10(|g*|^2 / mean_i |g_i - g*|^2)
and bias_floor_db = 20 log10(sqrt(trace Cov(g) / N) / |g*|), the bias an unbiased estimator
shows from N samples alone: a bias_db near its floor is not resolved from sampling noise.
"""

from __future__ import annotations

import numpy as np

from hindsight.credit.exact import MDPArrays, tabular_values


def occupancy(mdp: MDPArrays, pi: np.ndarray | None = None) -> np.ndarray:
  """d [H, S]: probability that step t happens in state s (forward pass)."""
  pi = mdp.pi if pi is None else pi
  H, S = mdp.horizon, np.shape(mdp.mu0)[0]
  d = np.zeros((H, S))
  d[0] = mdp.mu0
  alive = (~mdp.terminal).astype(np.float64)
  for t in range(H - 1):
    d[t + 1] = np.einsum("s,sa,sap->p", d[t], pi, mdp.P) * alive
  return d


def expected_return(mdp: MDPArrays, logits: np.ndarray, gamma: float = 1.0) -> float:
  """J(theta) for pi = softmax(logits): E[sum_t gamma^t r_t] from mu0."""
  pi = _softmax(logits)
  d = occupancy(mdp, pi)
  discount = gamma ** np.arange(mdp.horizon)
  return float(np.einsum("t,ts,sa,sa->", discount, d, pi, mdp.r))


def exact_gradient(mdp: MDPArrays, gamma: float = 1.0) -> np.ndarray:
  """g* [S, A] (module docstring), at theta = log pi."""
  Q, V = tabular_values(mdp, gamma)
  d = occupancy(mdp)
  discount = gamma ** np.arange(mdp.horizon)
  advantage = Q - V[:-1, :, None]  # [H, S, A]
  return np.einsum("t,ts,sa,tsa->sa", discount, d, mdp.pi, advantage)


def episode_gradients(
  states: np.ndarray, actions: np.ndarray, mask: np.ndarray, credit: np.ndarray, pi: np.ndarray
) -> np.ndarray:
  """g_i [N, S * A] from per-step credits (states, actions, mask, credit [N, H]); steps with
  a non-finite credit (an undefined label) contribute nothing."""
  N, H = actions.shape
  S, A = pi.shape
  c = np.where(mask & np.isfinite(credit), credit, 0.0)
  score = np.eye(A)[actions] - pi[states]  # [N, H, A] grad of log pi(a_t | s_t) in theta[s_t]
  g = np.zeros((N, S, A))
  rows = np.repeat(np.arange(N), H)
  np.add.at(g, (rows, states.reshape(-1)), (c[..., None] * score).reshape(N * H, A))
  return g.reshape(N, S * A)


def gradient_stats(g: np.ndarray, g_star: np.ndarray) -> dict:
  """bias_db, bias_floor_db, variance, snr_db of estimates g [N, P] against g* [P]."""
  g_star = g_star.reshape(-1)
  norm2 = float(np.sum(np.square(g_star)))
  mean = g.mean(0)
  var = g.var(0, ddof=1)
  bias = float(np.linalg.norm(g_star - mean))
  return {
    "bias_db": 20 * np.log10(max(bias, 1e-300) / np.sqrt(norm2)),
    "bias_floor_db": 20 * np.log10(np.sqrt(var.sum() / g.shape[0]) / np.sqrt(norm2)),
    "variance": float(var.mean() / np.mean(np.square(g_star))),
    "snr_db": 10 * np.log10(norm2 / float(np.mean(np.sum(np.square(g - g_star), 1)))),
    "episodes": int(g.shape[0]),
  }


def _softmax(logits: np.ndarray) -> np.ndarray:
  z = np.exp(logits - logits.max(-1, keepdims=True))
  return z / z.sum(-1, keepdims=True)
