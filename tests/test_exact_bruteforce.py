"""The DP oracle against brute-force enumeration of every continuation on a tiny MDP."""

import itertools

import numpy as np

from hindsight.credit import tabular_values
from hindsight.envs import random_mdp


def _brute_q(mdp, t, s, a):
  """E[G_t | s_t = s, do(a_t = a)] by summing over every (action, next state) path."""
  H, S, A = mdp.horizon, mdp.num_states, mdp.num_actions
  total = 0.0
  steps = H - t
  # A path: next states s_{t+1..}, actions a_{t+1..}; probability-weighted return.
  for next_states in itertools.product(range(S), repeat=steps):
    for actions in itertools.product(range(A), repeat=steps - 1):
      prob, ret, cur, act = 1.0, 0.0, s, a
      for k in range(steps):
        ret += mdp.r[cur, act]
        prob *= mdp.P[cur, act, next_states[k]]
        cur = next_states[k]
        if mdp.terminal[cur] or t + k + 1 == H:
          # The path ended: the remaining choices must be "unused" (count them once).
          unused = all(x == 0 for x in next_states[k + 1 :]) and all(x == 0 for x in actions[k:])
          prob = prob if unused else 0.0
          break
        act = actions[k]
        prob *= mdp.pi[cur, act]
      total += prob * ret
  return total


def test_dp_equals_enumeration():
  mdp = random_mdp(4, num_states=3, num_actions=2, horizon=3, branching=2)
  Q, V = tabular_values(mdp)
  for t in range(mdp.horizon):
    for s in range(mdp.num_states):
      for a in range(mdp.num_actions):
        assert np.isclose(Q[t, s, a], _brute_q(mdp, t, s, a), atol=1e-10), (t, s, a)
  np.testing.assert_allclose(V[: mdp.horizon], (mdp.pi[None] * Q).sum(-1))
  assert np.all(V[mdp.horizon] == 0)
