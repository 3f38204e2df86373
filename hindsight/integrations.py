"""Per-step credit in the advantage registries of the frameworks that train language models
with RL: verl's `@register_adv_est` and Tunix's `register_advantage_estimator`. Nothing here
imports verl, torch or Tunix: the math is NumPy, and each estimator hands back the array type
it was given (a torch tensor to verl, a jax array to Tunix). docs/serving.md shows the few
lines that register them.

The per-step credit reaches the estimator as verl's token-level rewards [B, L] already carry
a PRM's step scores: each step's credit on the step's last response token, 0 elsewhere
(`step_end_rewards` writes a row from the served credit and the steps' last tokens,
`step_token_ends`). A step whose credit is exactly 0 is written as the smallest positive
float32 (1.4e-45, a change no update can see), so every step's end is marked and a token's
step is the one whose end is the first marked position at or after it, on the response mask
or off it. A multi-turn agent's response mask is 0 on the tool results the policy did not
write (verl's `verl/experimental/agent_loop/tool_agent_loop.py` appends each tool response
with mask 0; Tunix's agentic `conversation_masks` do the same), and an agent step ends inside
its own tool result: its credit goes to its call's tokens, up to its last token on the mask,
and the result's tokens take none. The marks need the rows as written: a KL penalty folded
into the rewards (verl's `use_kl_in_reward`), or rows cast to bfloat16 (which flushes 1.4e-45
to 0), loses them.

  source "credit"   A[b, l] = the credit of the step token l belongs to (0 past the last
                    marked end, and off the response mask)
  source "outcome"  the group's outcome baseline: R_b = the row's sum, off the mask too
                    (verl's outcome reward sits on the last token, which may be a tool
                    result's), A[b, l] = R_b - mean over b's group
                    (the samples sharing its prompt, `index`) of R, divided by the group's
                    std (ddof 1) + eps with `norm_by_std` (GRPO), on every response token
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

TINY = float(np.finfo(np.float32).smallest_subnormal)  # marks a step end of credit exactly 0
SOURCES = ("credit", "outcome")


def step_token_ends(step_chars: Sequence[int], token_char_ends: Sequence[int]) -> list[int]:
  """The index of each step's last response token: step k ends at the last token whose text
  ends at or before the end of steps 0 .. k (step_chars[k]: step k's length in characters;
  token_char_ends[j]: where token j's text ends, as a tokenizer's offset mapping gives it).
  A step no token ends in shares the previous step's end."""
  ends, j = [], -1
  cut = 0
  for n in step_chars:
    cut += int(n)
    while j + 1 < len(token_char_ends) and token_char_ends[j + 1] <= cut:
      j += 1
    ends.append(max(j, 0))
  return ends


def step_end_rewards(step_credit: Sequence[float], step_ends: Sequence[int], length: int):
  """float32 [length]: each step's credit on its last token (`step_token_ends`), 0 elsewhere;
  exactly 0 written as TINY (module docstring). Two steps that end on one token: the later
  one's credit."""
  row = np.zeros(length, np.float32)
  for credit, end in zip(step_credit, step_ends, strict=True):
    if not 0 <= end < length:
      raise ValueError(f"a step ends at token {end}, outside the response's {length} tokens")
    row[end] = TINY if credit == 0 else credit
  return row


def spread_over_steps(rewards, mask) -> np.ndarray:
  """[B, L]: each token on the mask gets the reward at the first marked (nonzero) position at
  or after it in its row, the mark on the mask or off it; tokens past the row's last marked
  position, and off the mask, 0."""
  rewards = np.asarray(rewards, np.float64)
  mask = np.asarray(mask).astype(bool)
  out = np.zeros(rewards.shape, np.float64)
  for b in range(rewards.shape[0]):
    # Marks off the mask count: an agent step ends inside its tool result, which verl's and
    # Tunix's agent loops mask out, and its credit belongs to the call's tokens before it.
    marked = np.flatnonzero(rewards[b] != 0)
    if not marked.size:
      continue
    # for each position, the first marked position at or after it
    nxt = np.searchsorted(marked, np.arange(rewards.shape[1]))
    inside = nxt < marked.size
    out[b, inside] = rewards[b, marked[nxt[inside]]]
  out[np.abs(out) <= TINY] = 0.0  # a marked zero is zero
  return np.where(mask, out, 0.0)


def group_outcome_advantages(outcome, index=None, norm_by_std: bool = False, eps: float = 1e-6):
  """[B]: R_b - mean of R over b's group (the samples with b's `index`; None: one group),
  divided by the group's std (ddof 1) + eps with `norm_by_std`; a group of one keeps R_b
  (as verl's GRPO has it)."""
  R = np.asarray(outcome, np.float64)
  if index is None:
    groups = np.zeros(len(R), int)
  else:
    groups = np.unique(_numpy(index), return_inverse=True)[1]
  out = R.copy()  # a group of one keeps its R (verl's GRPO: mean 0, std 1 there)
  for g in np.unique(groups):
    members = groups == g
    if members.sum() < 2:
      continue
    centred = R[members] - R[members].mean()
    if norm_by_std:
      centred = centred / (R[members].std(ddof=1) + eps)
    out[members] = centred
  return out


def credit_advantages(token_level_rewards, response_mask, index=None, source: str = "credit",
                      norm_by_std: bool = False, outcome=None,
                      eps: float = 1e-6) -> np.ndarray:  # fmt: skip
  """[B, L] advantages from step-end rewards (module docstring), NumPy in and out; the
  outcome source's R is `outcome` [B] where given, else each row's sum."""
  if source not in SOURCES:
    raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
  mask = np.asarray(response_mask).astype(bool)
  if source == "credit":
    return spread_over_steps(token_level_rewards, mask)
  rewards = np.asarray(token_level_rewards, np.float64)
  # verl's GRPO sums the whole row: its agent loop puts the outcome on the last token, on the
  # mask or off it (`verl/trainer/ppo/core_algos.py`, `compute_grpo_outcome_advantage`)
  R = rewards.sum(-1) if outcome is None else np.asarray(outcome, float)
  return np.where(mask, group_outcome_advantages(R, index, norm_by_std, eps)[:, None], 0.0)


def _numpy(x) -> np.ndarray:
  """A torch tensor, jax array or array-like as NumPy (on the host)."""
  if hasattr(x, "detach"):  # torch
    return x.detach().float().cpu().numpy()
  return np.asarray(x)


def _like(values: np.ndarray, template) -> Any:
  """`values` as the type (and for torch the dtype and device) of `template`."""
  if hasattr(template, "detach"):
    import torch

    return torch.as_tensor(values, dtype=template.dtype, device=template.device)
  if type(template).__module__.startswith("jax"):
    import jax.numpy as jnp

    return jnp.asarray(values, jnp.float32)
  return values.astype(np.float32)


def verl_estimator(token_level_rewards, response_mask, index=None, config=None,
                   source: str = "credit", **_) -> tuple[Any, Any]:  # fmt: skip
  """verl's advantage estimator signature (`@register_adv_est`): (advantages, returns)
  [bs, L], equal (a Monte Carlo estimator has no critic). `config.norm_adv_by_std_in_grpo`
  (verl's GRPO setting) scales the outcome source's by the group's std."""
  norm = bool(getattr(config, "norm_adv_by_std_in_grpo", False)) if config is not None else False
  adv = credit_advantages(_numpy(token_level_rewards), _numpy(response_mask), index, source,
                          norm)  # fmt: skip
  out = _like(adv, token_level_rewards)
  return out, out


def tunix_estimator(rewards, num_generations: int, step_rewards=None, completion_mask=None,
                    source: str = "credit", eps: float = 1e-6):  # fmt: skip
  """Tunix's advantage estimator signature (`register_advantage_estimator`): called as
  Tunix's GRPO learner calls it, (rewards [B], num_generations), the group's outcome
  baseline [B] (GRPO's z-score over each prompt's consecutive `num_generations`
  completions); with the step-end rewards [B, T] of the completions and their mask, the
  per-token advantages [B, T] of `source` (Tunix's GRPO loss takes [B, T] advantages)."""
  index = np.arange(len(_numpy(rewards))) // int(num_generations)
  if step_rewards is None:
    adv = group_outcome_advantages(_numpy(rewards), index, norm_by_std=True, eps=eps)
    return _like(adv, rewards)
  mask = np.ones(np.shape(step_rewards), bool) if completion_mask is None else completion_mask
  adv = credit_advantages(_numpy(step_rewards), _numpy(mask), index, source, norm_by_std=True,
                          outcome=_numpy(rewards), eps=eps)  # fmt: skip
  return _like(adv, step_rewards)
