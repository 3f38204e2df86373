"""What a trainer hands a credit source, whatever it trains: the batch's steps, their outcomes,
the source's models read on them, and a branch function (`Steps`); and what the source gives
back (`StepSignal`). A source's math is written once against these (`CreditSource.
step_signal`); each trainer supplies them its own way:

  symbolic (`rl.trainer`)  inside the update's jit: jax arrays; branch = the labeler's
                           `label_under` under the current policy; cost = env steps (int32 [])
  text (`lm.rl.sources`)   on the host: NumPy arrays; branch = pools of K continuations of
                           each prefix drawn through the rollout worker; cost = completions
                           and tokens (`lm.rl.credit.Spend`)

Shapes: E episodes (traces) padded to H steps; `mask` [E, H] marks the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

Array = Any  # a jax array inside the symbolic update, a NumPy array on the LM host
Cost = Any  # what a source is charged: env steps (int32 []) or a `Spend`


@dataclasses.dataclass(frozen=True)
class Branched:
  """Monte Carlo interventional credit of the steps asked for, under the current policy:
  credit_t = mean(keep arm) - mean(replace arm) over K branch pairs, [E, H] each
  (meaningless on the steps not asked for: mask them out; NaN where undefined).

  credit: the estimate D_t; stderr: its standard error (possibly raised to a conservative
  bound on ties, NaN where unknown); noise: the branch pairs' own sample standard error (an
  unbiased estimate of the label's Monte Carlo noise); cost: what the branches cost."""

  credit: Array
  stderr: Array
  noise: Array
  cost: Cost


@dataclasses.dataclass(frozen=True)
class Steps:
  """One batch, as a source's math reads it (module docstring).

  mask: bool [E, H]; outcome: R float [E], the episode's return.
  branch(z, key) -> `Branched`: credit of the steps with z [E, H] True (None: every valid
    step), the keys of a step's branches depending on (key, episode, step) only.
  zero: the cost of nothing (a source that spends nothing returns it).
  groups: G > 0 when the episodes come in consecutive groups of G sharing a prompt (GRPO);
    0: the batch is one group.
  history() -> p float [E, H + 1]: the source's process reward model, p[:, t] = P(success |
    the history before step t), p[:, 0] its value before any step (None: no PRM).
  credit_model() -> (f, s, lam): the credit model's mean f_t and predictive std s_t [E, H]
    for the taken steps, and the weight lam [] its last batch was given (None: no model).
  alarm: how many steps a PRM source labels for the training alarm (`Signal.checks`); None
    where the trainer keeps no such alarm (its checks are then not computed). Host only.
  """

  mask: Array
  outcome: Array
  branch: Callable[[Array | None, Any], Branched]
  zero: Cost
  groups: int = 0
  history: Callable[[], Array] | None = None
  credit_model: Callable[[], tuple[Array, Array, Array]] | None = None
  alarm: int | None = None


def check_rows(i, t, pred, ref) -> dict:
  """`StepSignal.checks` of the steps (i[n], t[n]): their predicted and Monte Carlo credit
  read off pred and ref [E, H] (host arrays)."""
  pred, ref = np.asarray(pred), np.asarray(ref)
  return {"trace": np.asarray(i).tolist(), "step": np.asarray(t).tolist(),
          "pred": pred[i, t].astype(float).tolist(),
          "ref": ref[i, t].astype(float).tolist()}  # fmt: skip


@dataclasses.dataclass
class StepSignal:
  """A source's answer for one batch: advantages A float [E, H] (0 on padding), what it
  cost, `labels`: per-step arrays [E, H] of what it bought and weighed (pp_credit's f, p, z,
  D, its stderrs and lam; {} for most), `record`: scalars for the run's log, and `checks`:
  the training alarm's {"trace", "step": int [n], "pred", "ref": float [n]} (the model's and
  the Monte Carlo credit of n steps; None: none)."""

  advantages: Array
  cost: Cost
  labels: dict = dataclasses.field(default_factory=dict)
  record: dict = dataclasses.field(default_factory=dict)
  checks: dict | None = None
