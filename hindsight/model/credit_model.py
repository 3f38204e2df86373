"""The credit model: every step's interventional credit from the whole trajectory at once.

Per-step token (width W):
  x_t = enc(o_t) + E_a[a_t] + E_pos[t] + Linear([r_t, G_t, R, success, t/n, n/T_max])
where enc is the data's step encoder (`model.encoders`, from the DataSpec: an embedding of
discrete ids, an MLP over standardised features with a hidden layer of 2W, or a text step's
tokens convolved and pooled), G_t the return-to-go, R the episode return (rewards, G_t and
R are divided by `value_scale`) and n the episode length. The outcome is in every token: the
model judges steps in hindsight, and attention is bidirectional over the episode's valid steps
(padding is masked out as keys).

Heads per step, in label units: credit mean mu_t, credit log-variance log s_t^2, the logit
of p0_t = P(credit exactly 0) and class logits over KLASS_NAMES. One call scores all steps of a
[B, T] batch. Multi-agent datasets (`DataSpec.num_agents` = n > 0) add an embedding of the
acting agent to each token and a head per agent over the mean of its own steps' states:
predicted Shapley value phi_i and its log-variance, [B, n].

Why p0: under common random numbers a step whose replacement changes nothing gets a credit of
exactly 0 (every branch pair ties), and such steps can be most of an episode (88% of
key_to_door's). Labels are then a point mass at 0 plus a continuous part, and the point
prediction reported is that mixture's median: 0 where p0_t > 1/2, else mu_t. A continuous
output can never tie, which caps its Spearman against such labels (0.55 on key_to_door even
for the labels plus 1e-3 noise); the median keeps the ties the labels have.
"""

from __future__ import annotations

import dataclasses
import inspect

import jax
import jax.numpy as jnp
from flax import nnx

from hindsight.model.spec import DataSpec
from hindsight.model.variables import Constant

NUM_SCALAR_FEATURES = 6
# The attribute that holds the step encoder's module (its parameters' path prefix; it sorts
# where the encoders' own parameters sat before they were a module, so the parameters keep
# their order in the state tree).
ENCODER = "obs_encoder"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  width: int = 64  # token width W
  depth: int = 2  # transformer blocks
  num_heads: int = 4
  mlp_ratio: int = 4  # block MLP hidden = mlp_ratio * W
  dropout: float = 0.0  # on attention outputs and MLPs, training only
  # "bfloat16": the blocks' matmuls and attention in bfloat16 (parameters, layer norms, the
  # residual stream and the heads stay float32); "" = float32 throughout.
  compute_dtype: str = ""

  def __post_init__(self):
    if self.compute_dtype not in ("", "float32", "bfloat16"):
      raise ValueError(f"compute_dtype {self.compute_dtype!r}: expected '', float32 or bfloat16")

  @property
  def dtype(self):
    return jnp.bfloat16 if self.compute_dtype == "bfloat16" else jnp.float32


class Block(nnx.Module):
  """Pre-LayerNorm transformer block: x + MHA(LN x), then x + MLP(LN x)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    w, dt = cfg.width, cfg.dtype
    self.norm1 = nnx.LayerNorm(w, rngs=rngs)
    self.attn = nnx.MultiHeadAttention(
      num_heads=cfg.num_heads, in_features=w, decode=False, dtype=dt, rngs=rngs
    )
    self.norm2 = nnx.LayerNorm(w, rngs=rngs)
    self.fc1 = nnx.Linear(w, cfg.mlp_ratio * w, dtype=dt, rngs=rngs)
    self.fc2 = nnx.Linear(cfg.mlp_ratio * w, w, dtype=dt, rngs=rngs)
    self.dropout = nnx.Dropout(cfg.dropout)

  def __call__(self, x, key_mask, *, rngs: nnx.Rngs | None):
    """key_mask: bool [B, T] (every query attends to the valid steps) or a full attention
    mask [B, 1, T, T] (queries x keys; a causal model's)."""
    deterministic = rngs is None
    mask = key_mask[:, None, None, :] if key_mask.ndim == 2 else key_mask
    # The residual stream stays float32: bfloat16 branch outputs are added to it in float32.
    h = self.attn(self.norm1(x), mask=mask, deterministic=True).astype(x.dtype)
    x = x + self.dropout(h, deterministic=deterministic, rngs=rngs)
    h = self.fc2(jax.nn.gelu(self.fc1(self.norm2(x)))).astype(x.dtype)
    return x + self.dropout(h, deterministic=deterministic, rngs=rngs)


class CreditModel(nnx.Module):
  """Transformer over the steps of a trajectory; see the module docstring."""

  def __init__(self, cfg: ModelConfig, spec: DataSpec, *, rngs: nnx.Rngs):
    w = cfg.width
    self.spec = spec
    # Built first: its parameters draw the first keys of `rngs`, as they always have.
    # The compute dtype reaches a kind whose module takes it (the LM backbone); the others
    # (a plug-in's among them) keep the protocol's float32 module.
    takes_dtype = "dtype" in inspect.signature(spec.encoder.module).parameters
    dtype = {"dtype": cfg.dtype} if takes_dtype else {}
    self.obs_encoder = spec.encoder.module(w, rngs=rngs, hidden=2 * w, **dtype)
    self.value_scale = Constant(jnp.float32(spec.value_scale))
    self.action_embed = nnx.Embed(spec.num_actions, w, rngs=rngs)
    self.position_embed = nnx.Embed(spec.max_length, w, rngs=rngs)
    self.scalars = nnx.Linear(NUM_SCALAR_FEATURES, w, rngs=rngs)
    self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.depth)])
    self.norm = nnx.LayerNorm(w, rngs=rngs)
    # Zero-initialised heads: training starts from mean 0, unit variance, uniform classes.
    self.head = nnx.Linear(
      w, 3 + spec.num_classes, kernel_init=nnx.initializers.zeros_init(), rngs=rngs
    )
    if spec.num_agents:
      # Who acted at each step, and a head over each agent's own steps (mean-pooled).
      self.agent_embed = nnx.Embed(spec.num_agents, w, rngs=rngs)
      self.agent_head = nnx.Linear(w, 2, kernel_init=nnx.initializers.zeros_init(), rngs=rngs)

  def __call__(self, batch: dict, *, dropout_key: jax.Array | None = None) -> dict:
    """Scores every step of `batch` (see `hindsight.model.batching.make_batch`).

    Returns, in label units, float [B, T] each: "mu" mu_t (the continuous part's mean),
    "log_var" log s_t^2, "zero_logit" logit p0_t and "credit" the point prediction (0 where
    p0_t > 1/2, else mu_t); and "logits" [B, T, C]. Values at padded steps are meaningless:
    mask them.
    """
    mask = batch["mask"]
    B, T = mask.shape
    m = mask.astype(jnp.float32)
    scale = self.value_scale[...]
    r = batch["rewards"] * m / scale
    rtg = jnp.flip(jnp.cumsum(jnp.flip(r, -1), -1), -1)
    n = m.sum(-1, keepdims=True)
    t = jnp.arange(T, dtype=jnp.float32)[None, :]
    scalars = jnp.stack(
      [
        r,
        rtg,
        jnp.broadcast_to(rtg[:, :1], (B, T)),
        jnp.broadcast_to(batch["success"][:, None], (B, T)),
        t / jnp.maximum(n, 1.0),
        jnp.broadcast_to(n / self.spec.max_length, (B, T)),
      ],
      -1,
    )
    x = (
      self.obs_encoder(batch)
      + self.action_embed(batch["actions"])
      + self.position_embed(jnp.minimum(jnp.arange(T), self.spec.max_length - 1))[None]
      + self.scalars(scalars)
    )
    if self.spec.num_agents:
      x = x + self.agent_embed(batch["agent"])
    rngs = None if dropout_key is None else nnx.Rngs(dropout=dropout_key)
    for block in self.blocks:
      x = block(x, mask, rngs=rngs)
    h = self.norm(x)
    out = self.head(h)
    mu = out[..., 0] * scale
    zero_logit = out[..., 2]
    result = {
      "mu": mu,
      "log_var": out[..., 1] + 2.0 * jnp.log(scale),
      "zero_logit": zero_logit,
      "credit": jnp.where(zero_logit > 0.0, 0.0, mu),
      "logits": out[..., 3:],
    }
    if self.spec.num_agents:
      # phi_i from the mean of agent i's own step states: [B, n, W] -> [B, n].
      own = jax.nn.one_hot(batch["agent"], self.spec.num_agents) * m[..., None]  # [B, T, n]
      pooled = jnp.einsum("btn,btw->bnw", own, h) / jnp.maximum(own.sum(1), 1.0)[..., None]
      agent_out = self.agent_head(pooled)
      result["agent_shapley"] = agent_out[..., 0] * scale
      result["agent_log_var"] = agent_out[..., 1] + 2.0 * jnp.log(scale)
    return result


def encoder_layout(state: nnx.State, encoder, legacy: bool) -> nnx.State:
  """A model state with the step encoder's parameters moved between the module layout
  (under ENCODER) and the flat layout of checkpoints saved before encoders were modules
  (checkpoint format 2: `obs_embed`, `obs_fc1`, ..., `step_encoder` at the top level,
  `StepEncoder.legacy_params`); `legacy` says which way. Works on abstract states too."""
  moves = [((old,), (ENCODER, *inner)) for old, inner in encoder.legacy_params.items()]
  if legacy:
    moves = [(new, old) for old, new in moves]
  out = []
  for path, leaf in nnx.to_flat_state(state):
    for src, dst in moves:
      if path[: len(src)] == src:
        path = dst + path[len(src) :]
        break
    out.append((path, leaf))
  return nnx.from_flat_state(out)
