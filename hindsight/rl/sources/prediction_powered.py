"""Prediction-powered credit (`pp_credit`): the credit model on every step, Monte Carlo
credit of the current policy on a few steps it chooses, unbiased whatever the model gets
wrong (prediction-powered inference, Angelopoulos et al. 2023; PPI++'s tuned weight,
Angelopoulos, Duchi and Zrnic 2023; sampling where the model is unsure, Zrnic and Candes
2024). Per valid step t of an update's episodes:

    A_t = lam f_t + (z_t / p_t) (D_t - lam f_t),      z_t ~ Bernoulli(p_t)

  f_t   the credit model's mixture mean for the taken step (it may read the whole trace)
  p_t   the step's labelling probability: a budget of pp.rho x the valid steps, allocated in
        proportion to e_t = sqrt(s_t^2 + (1 - lam_a)^2 f_t^2), the model's predictive std
        s_t and |f_t| (Neyman allocation: the rectifier's variance is sum_t e_t^2 / p_t),
        floored at pp.p_min and capped at 1 (`allocate`)
  D_t   `mc_credit`'s estimator (K = label.num_rollouts branch pairs under pi_theta) on the
        steps with z_t = 1 only: `Labeler.label_under(..., step_mask=z)` rolls nothing
        elsewhere, so the env steps spent follow sum_t p_t
  lam   PPI++'s power-tuned weight in [0, 1], cross-fitted: the episodes of one half of the
        batch take the weight fitted on the other half's labels (`tuned_weight`), so no
        step's weight reads its own label; pp.lam >= 0 fixes it

Given the trace, z_t is drawn independently of D_t with E[z_t / p_t] = 1, so
E[A_t | trace] = lam f_t + E[D_t | trace] - lam f_t = E[D_t | trace]: `mc_credit`'s signal,
for any f and any lam that does not read the step's own label (docs/rl.md derives it). A
wrong model costs variance, Var(A_t | trace) = Var(D_t) / p_t + (1 / p_t - 1)(mu_t - lam
f_t)^2 with mu_t = E[D_t | trace], never direction.

The signal is one function of what a trainer supplies (`step_signal` on `sources.steps.
Steps`): here the episodes' credit model and the labeler's branches; on a language model
(`lm.rl.sources`) the credit head on the LM's hidden states and K continuations per prefix.

Between update chunks each seed's model is fitted again, from its current parameters, on
the labels the chunk bought (pp.refit_steps; no env step charged beyond them), and the same
labels test it: (z_t / p_t)(f_t - D_t) is an unbiased estimate of the model's bias under
the policy that now samples, tracked per tag with the audit's confidence sequences
(`rl.refresh.gap_test`); a tag whose sequence lies outside +-eval.tolerance raises
`credit_drift`. The record of each chunk says the model's explained variance on the fresh
labels, the weights used and the rectifier's share of the signal's variance.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from hindsight.errors import HindsightError
from hindsight.labeling.engine import Labeler
from hindsight.labeling.spot_check import return_bounds
from hindsight.labeling.trajectories import trajectory_batch
from hindsight.model.fit import fit_credit_model
from hindsight.rl.refresh import gap_ranges, gap_test, tag_slices
from hindsight.rl.sources.base import (
  UNBIASED,
  ConfigNode,
  CreditSource,
  Probe,
  Terms,
  label_config,
  register_config_node,
  register_source,
)
from hindsight.rl.sources.learned import credit_model
from hindsight.rl.sources.steps import Steps, StepSignal, check_rows

# The model batch's fields a refit reads, recorded per update for the host.
_BATCH_FIELDS = ("observations", "actions", "rewards", "mask", "success")


def _pp_config() -> ConfigDict:
  """pp_credit: the labelling budget, its allocation, the weight and the refits."""
  c = ConfigDict()
  c.rho = 0.1  # the share of the valid steps labelled per update (in expectation)
  c.p_min = 0.01  # no valid step's labelling probability is below this (<= rho)
  c.lam = -1.0  # the model's weight: < 0 = power-tuned (PPI++, cross-fitted), else fixed
  # episodes of the initial policy the model first learns from (labeled at K =
  # credit.model_rollouts, charged); 0 = none: f = 0 until the first refit
  c.initial_episodes = 128
  c.refit_steps = 30  # Adam steps fitting the model on each chunk's labels (0 = frozen)
  return c


def _check_pp(c: ConfigDict) -> None:
  pp = c.pp
  if not 0.0 < float(pp.rho) <= 1.0:
    raise HindsightError(f"pp.rho must be in (0, 1], got {pp.rho}")
  if not 0.0 < float(pp.p_min) <= float(pp.rho):
    raise HindsightError(f"pp.p_min must be in (0, pp.rho = {pp.rho}], got {pp.p_min}")
  if float(pp.lam) > 1.0:
    raise HindsightError(f"pp.lam must be < 0 (tuned) or in [0, 1], got {pp.lam}")
  if int(pp.initial_episodes) < 0 or int(pp.refit_steps) < 0:
    raise HindsightError("pp.initial_episodes and pp.refit_steps must be >= 0")


register_config_node(
  ConfigNode(
    "pp",
    _pp_config,
    smoke={"initial_episodes": 32, "refit_steps": 5},
    check=_check_pp,
  )
)


def allocate(score, mask, rho: float, p_min: float, iterations: int = 60) -> jax.Array:
  """Labelling probabilities p [E, H] (0 on padding): p_t = clip(c e_t, p_min, 1) on the
  valid steps, with c found by bisection (of log c) so that sum_t p_t = rho x the valid
  steps. score: e_t >= 0 [E, H]; all-equal scores give p_t = rho. Traceable."""
  e = jnp.where(mask, jnp.maximum(score, 0.0), 0.0) + 1e-12
  budget = rho * jnp.sum(mask)

  def spent(log_c):
    return jnp.sum(jnp.where(mask, jnp.clip(jnp.exp(log_c) * e, p_min, 1.0), 0.0))

  # at c = p_min / max e every step sits at the floor (p_min <= rho: at most the budget);
  # at c = 1 / min e every step is at 1 (at least the budget)
  lo = jnp.log(p_min) - jnp.log(jnp.max(jnp.where(mask, e, 0.0)))
  hi = -jnp.log(jnp.min(jnp.where(mask, e, jnp.inf)))

  def halve(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    over = spent(mid) > budget
    return jnp.where(over, lo, mid), jnp.where(over, mid, hi)

  lo, hi = jax.lax.fori_loop(0, iterations, halve, (lo, hi))
  return jnp.where(mask, jnp.clip(jnp.exp(0.5 * (lo + hi)) * e, p_min, 1.0), 0.0)


def tuned_weight(f, d, z, p, rows) -> jax.Array:
  """PPI++'s weight [] from the labelled steps `z & rows` ([E, H] each): the lam minimising
  sum_t (1 / p_t - 1)(mu_t - lam f_t)^2, the part of the signal's variance it sets, over the
  batch's steps, estimated by weighting each labelled step by 1 / p_t (D_t stands in for
  mu_t: its noise is independent of f_t), clipped to [0, 1]; 0 when the model explains
  nothing (no labelled step, f = 0, or f and D uncorrelated)."""
  w = jnp.where(z & rows, (1.0 / p - 1.0) / p, 0.0)
  num, den = jnp.sum(w * d * f), jnp.sum(w * f * f)
  return jnp.where(den > 0, jnp.clip(num / jnp.where(den > 0, den, 1.0), 0.0, 1.0), 0.0)


def pp_signal(f, d, z, p, lam, mask) -> jax.Array:
  """A_t = lam f_t + (z_t / p_t)(D_t - lam f_t) on the valid steps, 0 elsewhere. lam: [] or
  broadcastable to [E, H]."""
  rectifier = jnp.where(z, (d - lam * f) / jnp.where(z, p, 1.0), 0.0)
  return jnp.where(mask, lam * f + rectifier, 0.0)


@register_source
class PredictionPowered(CreditSource):
  """`pp_credit` (module docstring). aux: {"model": the credit model's state, "on": 1.0
  once it has learned from labels (0: f = 0), "lam": the weight the allocation assumes}."""

  name = "pp_credit"
  summary = "the credit model on every step, MC credit on the pp.rho it is least sure of"
  unbiased = True
  trainers = ("symbolic", "text")
  model = "credit"

  def prepare(self, progress: bool = False) -> None:
    del progress
    task, config = self.task, self.config
    episodes = int(config.pp.initial_episodes)
    self.predictor, self.setup_steps = credit_model(task, config, episodes)
    trained = bool(config.credit.model) or episodes > 0
    self.aux = {
      "model": self.predictor.state,
      "on": jnp.float32(trained),
      "lam": jnp.float32(1.0 if trained else 0.0),
    }
    self.labeler = Labeler(task.env, task.policy, label_config(config))
    self._fn = self.predictor.credit_fn()
    E, H, K = int(config.ppo.episodes), task.env.horizon, int(config.label.num_rollouts)
    # The queue's lanes: a quarter of the most branch pairs the budget can roll (rho E H K;
    # fewer valid steps roll fewer): measured on reasoning at rho 0.1, 256 lanes ran a chunk
    # in 0.48 s, 1,024 in 0.75 s, 4,096 in 1.66 s, 128 in 0.57 s.
    self.lanes = int(np.clip(2 ** np.round(np.log2(max(float(config.pp.rho) * E * H * K / 4, 1))),
                             64, 4096))  # fmt: skip

  def model_outputs(self, aux, traj, batch):
    """(f, s) [E, H]: the model's mixture mean and predictive std on the episodes `traj`
    (`batch`: their `trajectory_batch`), both 0 and the std 1 while the model is off (f = 0,
    uniform allocation)."""
    del traj  # what a model of one's own may read beside the batch
    out = self._fn(aux["model"], batch)
    on = aux["on"]
    return on * out["mean"], on * out["std"] + (1.0 - on)

  def credit_outputs(self, aux, traj, batch):
    batch = trajectory_batch(self.task.env, traj) if batch is None else batch
    return (*self.model_outputs(aux, traj, batch), aux["lam"])

  def terms(self, aux, state, policy_params, traj, key) -> Terms:
    del state
    task = self.task
    batch = trajectory_batch(task.env, traj)
    out = self.step_signal(self.symbolic_steps(aux, policy_params, traj, batch), key)
    # what `between_chunks` reads: the labels bought, the episodes a refit learns from, the
    # tags the rectifier's alarm slices by and the return bounds of its ranges
    record = {**{name: batch[name] for name in _BATCH_FIELDS}, **out.labels,
              "tags": task.step_tags(traj)}  # fmt: skip
    if str(self.config.eval.boundary) == "bounded":
      bound = functools.partial(return_bounds, task.env, task.env_params)
      bounds = jax.vmap(jax.vmap(bound))(traj.states)
      record["width"] = bounds[:, : task.env.horizon, 1] - bounds[:, : task.env.horizon, 0]
    return Terms(out.advantages, out.cost, record=record)

  # -- the math, for every trainer -------------------------------------------------------

  def prediction(self, steps: Steps):
    return steps.credit_model()[0]

  def step_signal(self, steps: Steps, key) -> StepSignal:
    """A_t (module docstring) from the credit model's (f, s, lam) and the branches of the
    steps drawn; `labels` holds f, p, z, D, its stderr (NaN where unknown: no label to fit)
    and noise, and lam, [E, H] each; `checks` (where the trainer keeps a training alarm)
    the labelled steps thinned to a uniform sample."""
    pp, mask = self.config.pp, steps.mask
    E = mask.shape[0]
    f, s, lam_before = steps.credit_model()
    score = jnp.sqrt(jnp.square(s) + jnp.square((1.0 - lam_before) * f))
    p = allocate(score, mask, float(pp.rho), float(pp.p_min))
    k_z, k_label = jax.random.split(key)
    z = jax.random.bernoulli(k_z, p) & mask
    branched = steps.branch(z, k_label)
    finite = jnp.isfinite(branched.credit)
    d = jnp.where(z & finite, branched.credit, 0.0)  # undefined (no alternative): 0
    # An infinite stderr (a tie without return bounds: gymnax) makes no label to fit: NaN.
    known = jnp.isfinite(branched.stderr)
    stderr = jnp.where(z & finite, jnp.where(known, branched.stderr, jnp.nan), 0.0)
    if float(pp.lam) >= 0:
      lam = jnp.full((E, 1), float(pp.lam))
    else:  # cross-fitted: even episodes take odd ones' weight and the reverse (f = 0 while
      # the model is off gives lam = 0)
      even = (jnp.arange(E) % 2 == 0)[:, None]
      lam_even = tuned_weight(f, d, z, p, ~even)
      lam_odd = tuned_weight(f, d, z, p, even)
      lam = jnp.where(even, lam_even, lam_odd)
    labels = {
      "f": f,
      "p": p,
      "z": z,
      "d": d,
      "d_stderr": stderr,
      # the branch pairs' own noise (the stderr above may be raised to a tie bound)
      "d_noise": jnp.where(z & finite, branched.noise, 0.0),
      "lam": jnp.broadcast_to(lam, mask.shape),
    }
    out = StepSignal(pp_signal(f, d, z, p, lam, mask), branched.cost, labels)
    if steps.alarm is not None:
      out.checks = uniform_checks(labels, float(pp.p_min), jax.random.fold_in(key, 7))
    return out

  def probe(self) -> Probe:
    # its own alarm is the rectifier's (between_chunks): the reference only measures it
    return Probe(self.credit_prediction(), UNBIASED, warns=False)

  # -- between chunks -------------------------------------------------------------------

  def between_chunks(self, aux, policy_params, seed_key, update: int, seed: int, record=None):
    """The chunk's labels (`record`, leaves [n, E, H, ...] for this seed) test the model
    that scored them (the rectifier's per-tag confidence sequences) and fit it again: (the
    new aux, {fired, slice, gap, lower, upper, explained_variance, lam, rectifier_share,
    labelled, env_steps 0 (charged in the updates), fine_tuned, warnings})."""
    del policy_params, seed_key
    r = jax.tree.map(np.asarray, jax.device_get(record))
    stats = chunk_statistics(r)
    out = {"env_steps": 0, "fine_tuned": False, "warnings": {}, **stats}
    on = float(aux["on"]) > 0
    cfg = self.config.eval
    valid = r["mask"]
    if on and valid.any():
      y = np.where(r["z"], (r["f"] - r["d"]) / np.where(r["z"], r["p"], 1.0), 0.0)[valid]
      slices, names = tag_slices(self.task.env, {"tags": r["tags"], "credit": r["f"]})
      ranges = None
      if str(cfg.boundary) == "bounded":  # y lies between 0 and (f - D) / p_min
        pm = float(self.config.pp.p_min)
        ranges = gap_ranges(r["f"][valid], r["width"][valid], slices[valid], len(names)) / pm
        ranges = np.stack([np.minimum(ranges[:, 0], 0), np.maximum(ranges[:, 1], 0)], 1)
      index = update // int(cfg.every) - 1
      test = gap_test(y, slices[valid], names, ranges, float(cfg.tolerance), float(cfg.alpha),
                      index, str(cfg.boundary))  # fmt: skip
      test.pop("tags")
      out.update(test)
      if test["fired"]:
        out["warnings"]["credit_drift"] = (
          f"the rectifier puts the credit model's bias on '{test['slice']}' steps at "
          f"{test['gap']:+.3f} [{test['lower']:+.3f}, {test['upper']:+.3f}] under the current "
          f"policy (tolerance {float(cfg.tolerance):g}, alpha {float(cfg.alpha):g} over the "
          f"run): {UNBIASED}"
        )
    else:
      out["fired"] = False
    new = dict(aux)
    if int(self.config.pp.refit_steps) > 0 and r["z"].any():
      fitted = self.refit(aux["model"], r, seed)
      if fitted is not None:  # None: no label to learn from, or a fit that diverged
        new["model"], new["on"], out["fine_tuned"] = fitted, np.float32(1.0), True
    if stats["lam"] is not None:
      new["lam"] = np.float32(stats["lam"])
    return new, out

  def refit(self, model_state, r: dict, seed: int):
    """The model fitted again from `model_state` on the labelled steps of the chunk's
    episodes (`r` leaves [n, E, H, ...]; minibatches from the episodes with a label, each
    read whole). Every chunk's batch has one shape, so the fit compiles once."""
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in r.items()}
    # the labels the model can learn from: finite, with a finite stderr (the loss reads it)
    labelled = flat["z"] & flat["mask"] & np.isfinite(flat["d_stderr"])
    batch = {name: flat[name] for name in _BATCH_FIELDS}
    batch.update(
      credit=np.where(labelled, flat["d"], 0.0).astype(np.float32),
      credit_stderr=np.where(labelled, flat["d_stderr"], 0.0).astype(np.float32),
      progress=np.zeros(labelled.shape, np.float32),
      klass=np.zeros(labelled.shape, np.int32),
      label_mask=labelled,
      class_mask=np.zeros(labelled.shape, bool),  # credit_only labels carry no class
    )
    rows = np.flatnonzero(labelled.any(-1))
    if rows.size == 0:
      return None
    predictor = self.predictor
    fitted = fit_credit_model(
      batch, predictor.spec, predictor.model_config, int(self.config.pp.refit_steps),
      seed=seed, init=model_state, rows_from=rows,
    )  # fmt: skip
    finite = jax.tree.leaves(jax.tree.map(lambda x: bool(np.isfinite(x).all()), fitted.state))
    return fitted.state if all(finite) else None


def uniform_checks(labels: dict, p_min: float, key) -> dict:
  """The training alarm's checks from a batch's labels (host): the labelled steps thinned to
  a uniform sample, each kept with probability p_min / p_t, so every step is checked with
  probability p_min whatever the allocation favoured (p_t >= p_min on every valid step): a
  class's mean gap over them is the policy's, not the allocation's mix."""
  z, p = np.asarray(labels["z"]), np.asarray(labels["p"])
  thin = p_min / np.maximum(p, p_min)
  keep = np.asarray(jax.random.uniform(key, p.shape)) < thin
  return check_rows(*np.nonzero(z & keep), labels["f"], labels["d"])


def labels_vary(spread: float, noise: float, square: float) -> bool:
  """Whether explained variance means anything: the labels' (weighted) sum of squares about
  their mean `spread` exceeds their Monte Carlo noise's `noise` and a millionth of their sum
  of squares `square`. Labels that barely vary (a constant credit up to rounding, or
  spread within noise) make 1 - residual / spread a ratio of two small numbers, of any size
  (-1.4e6 on DeepSea's near-constant labels): undefined there."""
  return bool(spread > max(noise, 1e-6 * square, 0.0))


def chunk_statistics(r: dict) -> dict:
  """What a chunk's labels say of the model (`r`: the records, leaves [n, E, H]):
  explained_variance 1 - sum w (D - f)^2 / sum w (D - mean_w D)^2 over the labelled steps
  (w = 1 / p: the valid steps' population; against noisy labels, so a lower bound of the
  model's), lam (the mean weight used), rectifier_share (the variance of the rectifier
  term over the variance of A, over the valid steps), noise_share (of the rectifier's
  second moment E[(D - lam f)^2 / p], the part that is the labels' own Monte Carlo noise,
  sum_z se^2 / p^2 over sum_z (D - lam f)^2 / p^2 with se the branch pairs' sample stderr:
  near 1, no model can shrink it; near 0, a better model can),
  labelled (steps labelled) and label_share (of the valid steps).
  None where undefined (explained variance: where the labels barely vary, `labels_vary`)."""
  valid, z = r["mask"], r["z"] & r["mask"]
  out = {"explained_variance": None, "lam": None, "rectifier_share": None,
         "noise_share": None, "labelled": int(z.sum()),
         "label_share": float(z.sum() / max(valid.sum(), 1))}  # fmt: skip
  if not valid.any():
    return out
  out["lam"] = float(r["lam"][valid].mean())
  if z.sum() >= 2:
    w, d, f = 1.0 / r["p"][z], r["d"][z], r["f"][z]
    mean = np.sum(w * d) / np.sum(w)
    total = np.sum(w * (d - mean) ** 2)
    # the labels' noise: the branch pairs' sample stderr (an unbiased estimate of it, where
    # the label's stderr may be raised to a conservative tie bound)
    sample = r["d_noise"][z]
    known = np.isfinite(sample)
    if labels_vary(total, np.sum((w * sample**2)[known]), np.sum(w * d**2)):
      out["explained_variance"] = float(1.0 - np.sum(w * (d - f) ** 2) / total)
    second = np.sum((w**2 * (d - r["lam"][z] * f) ** 2)[known])
    if second > 0:
      noise = np.sum((w**2 * sample**2)[known])
      out["noise_share"] = float(min(noise / second, 1.0))
  rect = np.where(z, (r["d"] - r["lam"] * r["f"]) / np.where(z, r["p"], 1.0), 0.0)
  signal = r["lam"] * r["f"] + rect
  var_signal = float(np.var(signal[valid]))
  if var_signal > 0:
    out["rectifier_share"] = float(np.var(rect[valid]) / var_signal)
  return out
