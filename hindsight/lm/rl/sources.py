"""The credit sources on a language model's completions: the registered sources
(`rl.sources`) that list "text" among their trainers, each one class for both trainers,
bound here to a run (`TextSource`). A batch is groups of `grpo.group` completions per prompt,
consecutive; the source's math reads it as `rl.sources.steps.Steps`:

  mask, outcome   the traces' steps [E, T_max] and rewards R [E]; groups = grpo.group
  branch          Monte Carlo credit under the current policy by resampling
                  (`lm.rl.credit`, K = label.num_rollouts continuations per prefix, drawn
                  through the run's sampler: the cluster's rollout worker)
  history         the PRM's p(x_0) .. p(x_T) (`lm.rl.models`, fitted on the initial policy)
  credit_model    the credit head's (f_t, s_t) and the weight lam of its last batch
  alarm           alarm.steps: the steps a PRM source labels for the training alarm

and is charged in completions and generated tokens (`Spend`):

  outcome    GRPO's group-standardised reward (R_i - mean_g R) / (std_g R + 1e-6) on every
             step (Tunix's `compute_advantages`): plain GRPO
  mc_credit  each step's interventional credit under the current policy: unbiased, the
             costly oracle
  pp_credit  the credit head's f_t on every step, Monte Carlo credit D_t on the steps z_t ~
             Bernoulli(p_t) it is least sure of: A_t = lam f_t + (z_t / p_t)(D_t - lam f_t):
             unbiased whatever the head gets wrong
  prm        p(x_{t+1}) - p(x_t), the PRM's increments: biased, the hack PRM users report
  shaped     R - p(x_t): the PRM as a shaping potential (a baseline): unbiased

The learned ones report, per step, the credit they predict (`predict`), which every
evaluation point holds against credit resampled at the reference K, and, on some of every
update's training steps, their predicted and Monte Carlo credit (`Signal.checks`: the steps
pp_credit labels, thinned to a uniform sample, or alarm.steps steps labelled for the PRM's
sources), which the training alarm pools over updates (`rl.alarm`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np

from hindsight.errors import HindsightError
from hindsight.lm.rl.credit import (
  Spend,
  all_prefixes,
  credit_prefixes,
  step_credit,
  step_stderr,
  trace_fields,
)
from hindsight.rl.sources import base
from hindsight.rl.sources.base import HACKABLE, UNBIASED
from hindsight.rl.sources.prediction_powered import chunk_statistics
from hindsight.rl.sources.steps import Branched, Steps

TEXT = "text"


def text_sources() -> list[str]:
  """The registered sources a language model can train on."""
  return [n for n in base.registered_sources() if TEXT in base.source_class(n).trainers]


def source_class(name: str):
  """A factory ctx -> `TextSource` for the source `name` (`MODULE:NAME` imports MODULE
  first), or a one-line error naming the text sources."""
  known = f"the text credit sources: {', '.join(text_sources())}"
  try:
    cls = base.source_class(name)
  except HindsightError as e:
    if "cannot import" in str(e):
      raise
    raise HindsightError(f"source {name!r} is unknown ({known})") from None
  if TEXT not in cls.trainers:
    raise HindsightError(f"source {name!r} does not train a language model ({known})")
  if cls.step_signal is base.CreditSource.step_signal:
    raise HindsightError(f"source {name!r} lists 'text' among its trainers but has no "
                         "step_signal (the math the language-model trainer calls)")  # fmt: skip
  return functools.partial(TextSource, cls)


@dataclasses.dataclass
class Signal:
  """A source's answer for one batch: steps[i] float [T_i] per trace, what it spent, a
  record of scalars for the run's log, and the training alarm's checks (None: none):
  {"trace", "step": int [n], "pred", "ref": float [n]}, the model's and the Monte Carlo
  credit of n of the batch's steps."""

  steps: list[np.ndarray]
  spend: Spend
  record: dict = dataclasses.field(default_factory=dict)
  checks: dict | None = None
  labels: dict = dataclasses.field(default_factory=dict)  # `StepSignal.labels`, NumPy [E, T_max]


def padded(values: list[np.ndarray], dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
  """(x [E, T_max], mask bool [E, T_max]) of per-trace arrays (0 on padding)."""
  T = max(len(v) for v in values)
  x = np.zeros((len(values), T), dtype)
  mask = np.zeros((len(values), T), bool)
  for i, v in enumerate(values):
    x[i, : len(v)], mask[i, : len(v)] = v, True
  return x, mask


class TextSource:
  """A registered source bound to a run's context (`lm.rl.context.Context`, or anything with
  its `config`, `pools` and `models`): signal(state, rollouts, key) -> Signal (state: the
  policy's current parameters); predict(rollouts) -> per-trace predicted credit [T_i] (None:
  no model); `setup` the Spend of its models (charged to every run that uses them).

  A source of the credit model keeps each seed's head current (`models.OnlineHead`):
  `start_seed` makes (or restores) the seed's head, `between_updates` adds the labels an
  update bought and refits it, `seed_state` is what a checkpoint keeps of it."""

  def __init__(self, cls: type[base.CreditSource], ctx):
    self.ctx = ctx
    self.impl = cls(None, ctx.config)  # the math; no symbolic task
    self.name, self.summary, self.unbiased = cls.name, cls.summary, cls.unbiased
    self.learned = cls.model is not None
    self.standardised = cls.standardised
    self.online = None  # the current seed's OnlineHead (a source of the credit model)

  # -- a seed's own head ---------------------------------------------------------------------

  def start_seed(self, state: dict | None = None) -> None:
    """A new seed's credit head: the fitted one, or `state` (a checkpoint's `seed_state`)."""
    from hindsight.lm.rl.models import OnlineHead

    if self.impl.model == "credit":
      self.online = OnlineHead(self.ctx.models().head, int(self.ctx.config.pp.buffer), state)

  def seed_state(self) -> dict | None:
    return None if self.online is None else self.online.state

  def between_updates(self, rollouts, signal: Signal) -> dict:
    """After an update: its labelled steps (z) join the seed's buffer and the head is fitted
    again (pp.refit_steps); the log's fields ({} for a source without a head)."""
    from hindsight.lm.rl.models import credit_inputs

    if self.online is None or not signal.labels:
      return {}
    labels = signal.labels
    # the labels a fit can read: bought (z), with a finite stderr (an undefined credit has
    # none), as the symbolic source's refit takes them
    z = labels["z"] & self.steps_mask(rollouts) & np.isfinite(labels["d_stderr"])
    features = self.ctx.models().features(rollouts)
    rows = [credit_inputs(features[i], rollouts.rewards[i])[t] for i, t in np.argwhere(z)]
    if signal.record.get("lam") is not None:  # the weight the next allocation assumes
      self.online.state = {**self.online.state, "lam": jnp.float32(signal.record["lam"])}
    loss = None
    if rows:  # no label bought, nothing new to fit
      self.online.add(np.stack(rows), labels["d"][z])
      loss = self.online.refit(int(self.ctx.config.pp.refit_steps))
    return {"refit_loss": loss, "buffer": min(int(self.online.state["count"]),
                                              self.online.capacity)}  # fmt: skip

  @staticmethod
  def steps_mask(rollouts) -> np.ndarray:
    return padded([np.zeros(c.num_steps) for c in rollouts.completions])[1]

  @property
  def setup(self) -> Spend:
    return self.ctx.models().spend_for(self.name) if self.learned else Spend()

  @property
  def consequence(self) -> str:
    return UNBIASED if self.unbiased else HACKABLE

  def steps(self, state, rollouts) -> Steps:
    """The batch as the source's math reads it (module docstring)."""
    ctx, cfg = self.ctx, self.ctx.config
    T = [c.num_steps for c in rollouts.completions]
    mask = self.steps_mask(rollouts)
    K = int(cfg.label.num_rollouts)

    def branch(z, key) -> Branched:
      if z is None:  # every step: the label fields of whole traces
        pools, spend = ctx.pools(state, rollouts, all_prefixes(rollouts), K, key)
        fields = [trace_fields(pools, i, t, rollouts.rewards[i]) for i, t in enumerate(T)]
        credit = padded([f["credit"] for f in fields], np.float64)[0]
        stderr = padded([f["credit_stderr"] for f in fields], np.float64)[0]
        noise = padded([[step_stderr(pools, i, t, n) for t in range(n)] for i, n in enumerate(T)],
                       np.float64)[0]  # fmt: skip
        return Branched(credit, stderr, noise, spend)
      chosen = list(zip(*np.nonzero(np.asarray(z) & mask), strict=True))
      pools, spend = ctx.pools(state, rollouts, credit_prefixes(chosen, T), K, key)
      credit = np.full(mask.shape, np.nan)
      stderr = np.full(mask.shape, np.nan)
      for i, t in chosen:
        credit[i, t] = step_credit(pools, int(i), int(t), T[i], rollouts.rewards[i])
        stderr[i, t] = step_stderr(pools, int(i), int(t), T[i])  # the sample stderr: no bound
      return Branched(credit, stderr, stderr, spend)

    # each model read once per batch (a PRM source's signal and its alarm checks both ask)
    @functools.cache
    def history():
      p = ctx.models().prm_values(rollouts)
      return padded(p)[0]

    @functools.cache
    def credit_model():
      if self.online is None:  # the head as fitted, and no weight assumed (lam 0)
        values, lam = ctx.models().credit_values(rollouts), 0.0
      else:
        head = self.online.head
        values = head(ctx.models().features(rollouts), rollouts.rewards)
        lam = self.online.state["lam"]
      f, s = padded([v[0] for v in values])[0], padded([v[1] for v in values])[0]
      return f, s, np.float32(lam)

    alarm = int(cfg.alarm.steps) if hasattr(cfg, "alarm") else None
    return Steps(mask=mask, outcome=np.asarray(rollouts.rewards, np.float64), branch=branch,
                 zero=Spend(),
                 groups=int(cfg.grpo.group), history=history, credit_model=credit_model,
                 alarm=alarm)  # fmt: skip

  def signal(self, state, rollouts, key) -> Signal:
    steps = self.steps(state, rollouts)
    out = self.impl.step_signal(steps, key)
    advantages = np.asarray(out.advantages, np.float32)
    record = dict(out.record)
    if "alarm_cost" in record:
      record["alarm_completions"] = record.pop("alarm_cost").completions
    labels = {k: np.asarray(v) for k, v in out.labels.items()}
    if labels:  # the symbolic source's statistics of the batch (`chunk_statistics`)
      record.update(chunk_statistics({"mask": steps.mask, **labels,
                                      "p": np.where(steps.mask, labels["p"], 1.0)}))  # fmt: skip
    T = [c.num_steps for c in rollouts.completions]
    return Signal([advantages[i, :t] for i, t in enumerate(T)], out.cost, record, out.checks,
                  labels)  # fmt: skip

  def predict(self, rollouts) -> list[np.ndarray] | None:
    if not self.learned:
      return None
    pred = np.asarray(self.impl.prediction(self.steps(None, rollouts)), np.float32)
    return [pred[i, : c.num_steps] for i, c in enumerate(rollouts.completions)]
