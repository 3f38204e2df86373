"""Per-step credit sources on a language model's completions. Each turns a batch of rollouts
(groups of `grpo.group` completions per prompt, consecutive) into a signal per step, charged
in completions and generated tokens (`rl.credit.Spend`):

  outcome    GRPO's group-standardised reward (R_i - mean_g R) / (std_g R + 1e-6) on every
             step (Tunix's `compute_advantages`): plain GRPO
  mc_credit  each step's interventional credit under the current policy, by resampling
             (`rl.credit`, K = label.num_rollouts per prefix): unbiased, the costly oracle
  pp_credit  the credit head's f_t on every step, Monte Carlo credit D_t on the steps z_t ~
             Bernoulli(p_t) it is least sure of: A_t = lam f_t + (z_t / p_t)(D_t - lam f_t)
             (`rl.sources.prediction_powered`'s allocation, weight and signal): unbiased
             whatever the head gets wrong
  prm        p(x_{t+1}) - p(x_t), the PRM's increments: biased, the hack PRM users report
  shaped     R - p(x_t): the PRM as a shaping potential (a baseline): unbiased

The learned ones read `models.Models` (the PRM and the credit head, fitted on the initial
policy's traces) and report, per step, the credit they predict (`predict`), which every
evaluation point holds against credit resampled at the reference K, and, on some of every
update's training steps, their predicted and Monte Carlo credit (`Signal.checks`: the steps
pp_credit labels, or alarm.steps steps labelled for the PRM's sources), which the training
alarm pools over updates (`rl.alarm`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl.algo_core import compute_advantages

from hindsight.errors import HindsightError
from hindsight.lm.rl.credit import (
  Spend,
  all_prefixes,
  credit_prefixes,
  step_credit,
  step_stderr,
  trace_fields,
)
from hindsight.rl.sources.base import HACKABLE, UNBIASED
from hindsight.rl.sources.prediction_powered import (
  allocate,
  chunk_statistics,
  pp_signal,
  tuned_weight,
)

_SOURCES: dict[str, type] = {}


def register_text_source(cls):
  """Class decorator: makes `cls` (a TextSource) available as config.source = cls.name."""
  _SOURCES[cls.name] = cls
  return cls


def text_sources() -> list[str]:
  return list(_SOURCES)


def source_class(name: str) -> type:
  if name not in _SOURCES:
    raise HindsightError(
      f"source {name!r} is unknown (the text credit sources: {', '.join(_SOURCES)})"
    )
  return _SOURCES[name]


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


class TextSource:
  """The protocol: signal(state, rollouts, key) -> Signal (state: the policy's current
  parameters); predict(rollouts) -> per-trace predicted credit [T_i] (None: no model);
  `setup` the Spend of its models (charged to every run that uses them)."""

  name = ""
  summary = ""
  unbiased = True
  learned = False
  standardised = False  # its signal is standardised already (no grpo.normalize on top)

  def __init__(self, ctx):
    self.ctx = ctx

  @property
  def setup(self) -> Spend:
    return Spend()

  @property
  def consequence(self) -> str:
    return UNBIASED if self.unbiased else HACKABLE

  def signal(self, state, rollouts, key) -> Signal:
    raise NotImplementedError

  def predict(self, rollouts) -> list[np.ndarray] | None:
    return None


def _per_step(rollouts, values) -> list[np.ndarray]:
  pairs = zip(rollouts.completions, values, strict=True)
  return [np.full(c.num_steps, float(v), np.float32) for c, v in pairs]


@register_text_source
class Outcome(TextSource):
  name = "outcome"
  summary = "GRPO: the group-standardised reward on every token"
  standardised = True

  def signal(self, state, rollouts, key):
    adv = compute_advantages(rollouts.rewards.astype(np.float64), int(self.ctx.config.grpo.group))
    return Signal(_per_step(rollouts, adv), Spend())


@register_text_source
class MonteCarloCredit(TextSource):
  name = "mc_credit"
  summary = "each step's credit under the current policy, K continuations per prefix"

  def signal(self, state, rollouts, key):
    ctx = self.ctx
    pools, spend = ctx.pools(state, rollouts, all_prefixes(rollouts),
                             int(ctx.config.label.num_rollouts), key)  # fmt: skip
    steps = []
    for i, c in enumerate(rollouts.completions):
      credit = trace_fields(pools, i, c.num_steps, rollouts.rewards[i])["credit"]
      steps.append(np.where(np.isfinite(credit), credit, 0.0).astype(np.float32))
    return Signal(steps, spend)


class _Modelled(TextSource):
  learned = True

  @property
  def setup(self) -> Spend:
    return self.ctx.models().spend_for(self.name)


class _PRMSource(_Modelled):
  """A source of the PRM: the credit it predicts is the PRM's increments. Its signal comes
  with alarm.steps of the batch's steps, drawn uniformly, Monte Carlo labelled for the
  training alarm (charged to the run)."""

  def predict(self, rollouts):
    return [np.diff(p).astype(np.float32) for p in self.ctx.models().prm_values(rollouts)]

  def signal(self, state, rollouts, key):
    signal = self.prm_signal(rollouts)
    ctx, n = self.ctx, int(self.ctx.config.alarm.steps)
    T = [c.num_steps for c in rollouts.completions]
    steps = [(i, t) for i, n_i in enumerate(T) for t in range(n_i)]
    if n <= 0 or not steps:
      return signal
    k_pick, k_label = jax.random.split(key)
    picks = np.sort(np.asarray(jax.random.choice(k_pick, len(steps), (min(n, len(steps)),),
                                                 replace=False)))  # fmt: skip
    chosen = [steps[j] for j in picks]
    K = int(ctx.config.label.num_rollouts)
    pools, spend = ctx.pools(state, rollouts, credit_prefixes(chosen, T), K, k_label)
    pred, R = self.predict(rollouts), rollouts.rewards
    checks = {"trace": [i for i, _ in chosen], "step": [t for _, t in chosen],
              "pred": [float(pred[i][t]) for i, t in chosen],
              "ref": [step_credit(pools, i, t, T[i], R[i]) for i, t in chosen]}  # fmt: skip
    record = {**signal.record, "alarm_completions": spend.completions}
    return dataclasses.replace(signal, spend=signal.spend + spend, record=record, checks=checks)

  def prm_signal(self, rollouts) -> Signal:
    raise NotImplementedError


@register_text_source
class ProcessReward(_PRMSource):
  name = "prm"
  summary = "the PRM's increments p(x_{t+1}) - p(x_t)"
  unbiased = False

  def prm_signal(self, rollouts):
    return Signal(self.predict(rollouts), Spend())


@register_text_source
class Shaped(_PRMSource):
  name = "shaped"
  summary = "R - p(x_t): the PRM as a shaping potential"

  def prm_signal(self, rollouts):
    values = self.ctx.models().prm_values(rollouts)
    pairs = zip(values, rollouts.rewards, strict=True)
    return Signal([(r - p[:-1]).astype(np.float32) for p, r in pairs], Spend())


def padded(values: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """(x float32 [E, T_max], mask bool [E, T_max]) of per-trace arrays."""
  T = max(len(v) for v in values)
  x = np.zeros((len(values), T), np.float32)
  mask = np.zeros((len(values), T), bool)
  for i, v in enumerate(values):
    x[i, : len(v)], mask[i, : len(v)] = v, True
  return x, mask


@register_text_source
class PredictionPoweredCredit(_Modelled):
  name = "pp_credit"
  summary = "the credit head on every step, MC credit on the pp.rho it is least sure of"

  def signal(self, state, rollouts, key):
    ctx, pp = self.ctx, self.ctx.config.pp
    values = ctx.models().credit_values(rollouts)
    f, mask = padded([v[0] for v in values])
    s, _ = padded([v[1] for v in values])
    score = np.sqrt(np.square(s) + np.square(f))  # Neyman: the rectifier's sd at lam = 0
    p = np.asarray(allocate(jnp.asarray(score), jnp.asarray(mask), float(pp.rho),
                            float(pp.p_min)))  # fmt: skip
    k_z, k_label = jax.random.split(key)
    z = np.asarray(jax.random.bernoulli(k_z, p)) & mask
    T = [c.num_steps for c in rollouts.completions]
    wanted = credit_prefixes(zip(*np.nonzero(z), strict=True), T)
    pools, spend = ctx.pools(state, rollouts, wanted, int(ctx.config.label.num_rollouts),
                             k_label)  # fmt: skip
    d, d_noise = np.zeros_like(f), np.full_like(f, np.nan)
    for i, t in zip(*np.nonzero(z), strict=True):
      d[i, t] = step_credit(pools, int(i), int(t), T[i], rollouts.rewards[i])
      d_noise[i, t] = step_stderr(pools, int(i), int(t), T[i])
    E = len(T)
    if float(pp.lam) >= 0:
      lam = np.full((E, 1), float(pp.lam), np.float32)
    else:  # cross-fitted: even traces take the odd ones' weight and the reverse
      even = (np.arange(E) % 2 == 0)[:, None]
      args = (jnp.asarray(f), jnp.asarray(d), jnp.asarray(z), jnp.asarray(p))
      lam_even = np.asarray(tuned_weight(*args, jnp.asarray(~even)))
      lam_odd = np.asarray(tuned_weight(*args, jnp.asarray(even)))
      lam = np.where(even, lam_even, lam_odd).astype(np.float32)
    adv = np.asarray(pp_signal(f, d, z, p, lam, mask))
    # The symbolic source's statistics of the batch: the head's explained variance on the
    # labels (weighted 1 / p), lam, and the variance split: the rectifier's share of the
    # signal's variance (1 - it: the model's) and the labels' own Monte Carlo noise's share
    # of the rectifier's (the rest: allocation and the head's error).
    lam_steps = np.broadcast_to(lam, mask.shape)
    record = chunk_statistics({"mask": mask, "z": z, "p": np.where(mask, p, 1.0), "d": d,
                               "f": f, "lam": lam_steps, "d_noise": d_noise})  # fmt: skip
    # The training alarm's checks: the labelled steps thinned to a uniform sample (each kept
    # with probability p_min / p_t, so every step is checked with probability p_min whatever
    # the allocation favoured): a class's mean gap over them is the policy's, not the mix's.
    thin = float(pp.p_min) / np.maximum(p, float(pp.p_min))  # p_t >= p_min on every step
    keep = np.asarray(jax.random.uniform(jax.random.fold_in(key, 7), p.shape)) < thin
    zi, zt = np.nonzero(z & keep)
    checks = {"trace": zi.tolist(), "step": zt.tolist(), "pred": f[zi, zt].tolist(),
              "ref": d[zi, zt].tolist()}  # fmt: skip
    return Signal([adv[i, : T[i]] for i in range(E)], spend, record, checks)

  def predict(self, rollouts):
    return [f for f, _ in self.ctx.models().credit_values(rollouts)]
