"""The credit model's loss: heteroscedastic Gaussian NLL on noisy labels plus class CE.

The labels y_t are Monte Carlo estimates with standard error e_t, so the label is modelled as
y_t ~ N(mu_t, s_t^2 + e_t^2): the model's own spread s_t^2 plus the label's noise (which the
model should not try to explain). In units of the dataset's value scale c (so one learning
rate fits credits of any size):

  nll_t = 1/2 [ log 2 pi v_t + (y_t - mu_t)^2 / v_t ],   v_t = (s_t^2 + e_t^2) / c^2 + eps
  loss  = sum_t m^y_t w_t nll_t / sum_t m^y_t + w_cls sum_t m_t CE(k_t, logits_t) / sum_t m_t
          + w_0 sum_t m^y_t BCE(z_t, zero_logit_t) / sum_t m^y_t

m_t marks steps with a class label (every valid step but the unlabeled steps of an audit's
partial dataset: `class_mask`), m^y_t valid steps with a finite label, z_t labels that are
exactly 0 with stderr 0 (the replacement could not differ; see `credit_model`), and with
`zero_ties` also every label exactly 0 because all K branch pairs tied. A tie carries the tie
bound as its stderr (the truth may be small but not 0), and how often a step ties depends
on K; where the truth ties too (key_to_door: the K_ref = 1024 reference ties on 88.8% of the
steps, the K=32 labels on 88%) a model whose median ties there ranks like the truth
(Spearman against the reference 0.467 -> 0.788; docs/results.md, "What limits the model"). Shapes
[B, T] (logits [B, T, C]).

w_t = stop_gradient(v_t)^beta is the beta-NLL weight (Seitzer et al. 2022, "On the Pitfalls of
Heteroscedastic Uncertainty Estimation"). With beta = 0 (the plain NLL) a step's pull on the
mean is divided by its variance, so the model can buy a low loss by declaring the rare large
credits (a key worth 10 among thousands of exact zeros) noisy and fitting only the zeros; it
did exactly that on key_to_door. beta = 0.5 keeps the variance head and removes that trade.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

# In units of the value scale: no step is known better than 1% of the credits' spread (labels
# with zero stderr, e.g. a step whose every branch ties, would otherwise pull the variance to 0).
VARIANCE_FLOOR = 1e-4


def total_variance(log_var, stderr, scale):
  """v_t = (exp(log_var) + stderr^2) / scale^2 + floor, [B, T]."""
  return (jnp.exp(log_var) + jnp.square(stderr)) / jnp.square(scale) + VARIANCE_FLOOR


def gaussian_nll(mean, log_var, y, stderr, scale):
  """Per-step NLL of y ~ N(mean, exp(log_var) + stderr^2), in units of `scale`. [B, T]."""
  var = total_variance(log_var, stderr, scale)
  z2 = jnp.square((y - mean) / scale) / var
  return 0.5 * (jnp.log(2.0 * jnp.pi * var) + z2)


def masked_mean(x, mask):
  m = mask.astype(x.dtype)
  return jnp.sum(x * m) / jnp.maximum(jnp.sum(m), 1.0)


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The loss's weights and switches (config.loss; hindsight/default_config.py comments each)."""

  class_weight: float = 0.1  # the klass cross-entropy beside the Gaussian NLL
  beta: float = 0.5  # beta-NLL exponent (0: the plain NLL)
  zero_weight: float = 0.1  # the P(credit exactly 0) cross-entropy
  agent_weight: float = 1.0  # the agent-level Shapley NLL (multi-agent datasets)
  no_label_noise: bool = False  # labels treated as exact (no e_t^2 in the NLL; ablation)
  sample_noise: bool = False  # e_t: the label's sample stderr, not its (tie-bounded) stderr
  zero_ties: bool = False  # P(exactly 0) also learns labels whose branch pairs all tied

  def loss_kwargs(self) -> dict:
    """The keyword arguments of `credit_loss`."""
    return {
      "class_weight": float(self.class_weight),
      "beta": float(self.beta),
      "zero_weight": float(self.zero_weight),
      "agent_weight": float(self.agent_weight),
      "label_noise": not self.no_label_noise,
      "sample_noise": bool(self.sample_noise),
      "zero_ties": bool(self.zero_ties),
    }


def credit_loss(
  out: dict,
  batch: dict,
  scale: jax.Array,
  class_weight: float,
  beta: float = 0.5,
  zero_weight: float = 0.1,
  agent_weight: float = 1.0,
  label_noise: bool = True,
  zero_ties: bool = False,
  sample_noise: bool = False,
):
  """Scalar loss and its parts {loss, nll, ce, zero_bce, accuracy, mae} as masked means over
  the batch (mae of the point prediction), plus the counts they are means over
  {label_steps, steps}.

  label_noise=False drops e_t^2 from v_t (the labels treated as exact: an ablation).
  sample_noise: e_t is the label's sample stderr (batch "credit_noise") rather than its
  stderr, which is the conservative tie bound where nearly all branches agreed (module
  docstring).
  zero_ties: z_t = 1 for every label exactly 0 (all K branch pairs tied, or a step whose
  replacement cannot differ); False: only labels 0 with stderr 0 (the latter alone)."""
  stderr = batch["credit_noise"] if sample_noise else batch["credit_stderr"]
  stderr = stderr if label_noise else jnp.zeros_like(stderr)
  nll = gaussian_nll(out["mu"], out["log_var"], batch["credit"], stderr, scale)
  weight = jax.lax.stop_gradient(total_variance(out["log_var"], stderr, scale) ** beta)
  ce = optax.softmax_cross_entropy_with_integer_labels(out["logits"], batch["klass"])
  nll_mean = masked_mean(nll, batch["label_mask"])
  ce_mean = masked_mean(ce, batch.get("class_mask", batch["mask"]))
  exact_zero = batch["credit"] == 0.0
  if not zero_ties:
    exact_zero &= batch["credit_stderr"] == 0.0
  zero_bce = masked_mean(
    optax.sigmoid_binary_cross_entropy(out["zero_logit"], exact_zero.astype(jnp.float32)),
    batch["label_mask"],
  )
  metrics = {
    "nll": nll_mean,
    "ce": ce_mean,
    "zero_bce": zero_bce,
    "accuracy": masked_mean(
      (jnp.argmax(out["logits"], -1) == batch["klass"]).astype(jnp.float32),
      batch.get("class_mask", batch["mask"]),
    ),
    "mae": masked_mean(jnp.abs(out["credit"] - batch["credit"]), batch["label_mask"]),
  }
  loss = (
    masked_mean(weight * nll, batch["label_mask"]) + class_weight * ce_mean + zero_weight * zero_bce
  )
  if "agent_shapley" in out:
    # Agent-level Shapley values: the same beta-NLL, over real episodes' agents.
    agent_nll = gaussian_nll(
      out["agent_shapley"],
      out["agent_log_var"],
      batch["agent_shapley"],
      batch["agent_shapley_stderr"],
      scale,
    )
    agent_w = jax.lax.stop_gradient(
      total_variance(out["agent_log_var"], batch["agent_shapley_stderr"], scale) ** beta
    )
    rows = jnp.broadcast_to(batch["agent_mask"][:, None], agent_nll.shape)
    metrics["agent_nll"] = masked_mean(agent_nll, rows)
    metrics["agent_mae"] = masked_mean(jnp.abs(out["agent_shapley"] - batch["agent_shapley"]), rows)
    metrics["agent_rows"] = jnp.sum(rows.astype(jnp.float32))
    loss = loss + agent_weight * masked_mean(agent_w * agent_nll, rows)
  metrics["loss"] = loss
  # Step counts, so means over several batches can be weighted correctly.
  metrics["label_steps"] = jnp.sum(batch["label_mask"].astype(jnp.float32))
  metrics["steps"] = jnp.sum(batch.get("class_mask", batch["mask"]).astype(jnp.float32))
  return loss, metrics
