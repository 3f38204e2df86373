"""Monte Carlo credit of the policy LM itself, by resampling in process (the text labeler's
estimator, `text.estimate`, with the policy's own sampler in place of an endpoint).

A trace of T steps has prefixes x_0 .. x_T (x_t: the prompt and steps 0 .. t-1; x_T the
whole trace, whose outcome R is known). From each x_t, t < T, the policy draws a pool of K
continuations (the whole completion capped at the run's max_tokens, as the policy's own is),
each verified. With replacement by the policy itself (the step redrawn, then continued):

    keep arm of step t      the pool of x_{t+1} (R itself for the last step)
    replace arm of step t   the pool of x_t
    credit_t = mean(keep) - mean(replace)  ~  Q(x_t, a_t) - V(x_t)

an unbiased estimate of the step's advantage under the policy that samples (on outcome
rewards Q(x_t, a_t) = V(x_{t+1})). It is also VinePPO's Monte Carlo advantage, whose value
estimates are these pools. Pool (i, t) is drawn with keys split(fold_in(fold_in(key, i), t),
K), so a step's label does not depend on which other steps were labelled.
"""

from __future__ import annotations

import jax
import numpy as np

from hindsight.text.estimate import text_step_fields


class Spend:
  """Completions and generated tokens spent (what a source is charged)."""

  def __init__(self, completions: int = 0, tokens: int = 0):
    self.completions, self.tokens = int(completions), int(tokens)

  def __add__(self, other: Spend) -> Spend:
    return Spend(self.completions + other.completions, self.tokens + other.tokens)

  def as_dict(self) -> dict:
    return {"completions": self.completions, "tokens": self.tokens}


def prefix_pools(sampler, state, rollouts, wanted, K: int, max_tokens: int, key, tokenizer,
                 verify) -> tuple[dict, Spend]:  # fmt: skip
  """{(i, t): outcomes float [K]} for every (i, t) of `wanted` (t < the trace's steps), and
  what they cost. rollouts: `rollout.Rollouts`; verify(completion text, trace) -> [0, 1]."""
  wanted = sorted(set(wanted))
  prompts, budgets, keys, owners = [], [], [], []
  for i, t in wanted:
    c = rollouts.completions[i]
    head = c.prefix(t)
    pair = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, i), t), K)
    for k in range(K):
      prompts.append(np.concatenate([rollouts.prompts[i].ids, head]))
      budgets.append(max(max_tokens - len(head), 1))
      keys.append(pair[k])
      owners.append((i, t, head))
  if not prompts:
    return {}, Spend()
  tails = sampler.complete(state, prompts, budgets, jax.numpy.stack(keys))
  eos = np.asarray(sampler.cfg.eos_ids)
  pools: dict = {}
  tokens = 0
  for (i, t, head), tail in zip(owners, tails, strict=True):
    tokens += len(tail)
    words = np.concatenate([head, tail[~np.isin(tail, eos)]])
    outcome = verify(tokenizer.decode(words.tolist()), rollouts.prompts[i].trace)
    pools.setdefault((i, t), []).append(outcome)
  pools = {k: np.asarray(v, np.float32) for k, v in pools.items()}
  return pools, Spend(len(prompts), tokens)


def trace_fields(pools: dict, i: int, T: int, outcome: float, *, tolerance: float = 0.02,
                 confidence: float = 0.95) -> dict:  # fmt: skip
  """Every label field of trace i (`text.estimate.text_step_fields`: credit, its stderr and
  class, [T] each) from its pools at x_0 .. x_{T-1}."""
  phi = [pools[(i, t)] for t in range(T)]
  keep = [*phi[1:], np.array([outcome], np.float32)]
  return text_step_fields(keep, phi, phi, float(outcome), tolerance=tolerance,
                          confidence=confidence)  # fmt: skip


def step_credit(pools: dict, i: int, t: int, T: int, outcome: float) -> float:
  """credit_t of trace i alone: mean(pool of x_{t+1}, or R at the last step) - mean(pool of
  x_t)."""
  keep = float(outcome) if t == T - 1 else float(np.mean(pools[(i, t + 1)]))
  return keep - float(np.mean(pools[(i, t)]))


def step_stderr(pools: dict, i: int, t: int, T: int) -> float:
  """The sample stderr of `step_credit`'s estimate: sqrt(s_keep^2 / K + s_replace^2 / K),
  each pool's sample variance (ddof 1); the last step's keep arm is R itself (no noise)."""
  replace = np.asarray(pools[(i, t)], np.float64)
  var = replace.var(ddof=1) / replace.size
  if t < T - 1:
    keep = np.asarray(pools[(i, t + 1)], np.float64)
    var += keep.var(ddof=1) / keep.size
  return float(np.sqrt(var))


def credit_prefixes(steps, T) -> list[tuple[int, int]]:
  """The pools `step_credit` reads for each (i, t) of `steps` (T[i]: trace i's steps): x_t and
  x_{t+1} (none after the last step, whose keep arm is R), sorted, each once."""
  wanted = set()
  for i, t in steps:
    wanted.add((int(i), int(t)))
    if t + 1 < T[i]:
      wanted.add((int(i), int(t) + 1))
  return sorted(wanted)


def all_prefixes(rollouts) -> list[tuple[int, int]]:
  """(i, t) for every trace i and t < its steps: what labelling every step needs."""
  return [(i, t) for i, c in enumerate(rollouts.completions) for t in range(c.num_steps)]
