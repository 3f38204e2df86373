"""The language model: a Qwen2 or Llama 3 decoder built by Tunix (`google-tunix`, the `llm`
extra), run by one forward of our own that serves training, the credit model's hidden states
and sampling with a per-row KV cache.

Parameters live in Tunix's modules (`tunix.models.qwen2.model.Qwen2`, `...llama3.model.Llama3`),
so Tunix's safetensors loader, its sharding annotations (fsdp, tp) and its trainers read them
as they are. The forward is ours for two reasons: Tunix's KV cache writes every row at one
shared index (`cache['end_index'][0]`), and continuous batching needs each row at its own
position; and its Llama 3 applies rotary positions at base 1e6 whatever the config says, with
no Llama 3.1 frequency scaling. For rows b, positions p, layers l:

  x = E[tokens]
  h = RMSNorm(x);  q, k, v = h Wq (+ bq), h Wk (+ bk), h Wv (+ bv)      [B, L, N|K, H]
  q, k = RoPE(q, p), RoPE(k, p)
  x += Wo softmax(q k^T / sqrt(H) + mask) v      (query head n reads key head n // (N / K))
  x += W_down (silu(RMSNorm(x) W_gate) * RMSNorm(x) W_up)
  logits = RMSNorm(x) E^T (tied) or RMSNorm(x) W_out                    [B, L, V]

The mask lets a query at position p read keys at positions <= p: causal over the input, or,
with a cache of keys and values [depth, B, S, K, H], the row's own cached positions.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.errors import HindsightError
from hindsight.lm.config import BackboneConfig

NEG_INF = -1e30


def require_llm():
  """Tunix's model modules; a one-line error naming the extra when it is not installed."""
  try:
    from tunix.models.llama3 import model as llama3
    from tunix.models.qwen2 import model as qwen2
  except ImportError:
    raise HindsightError(
      "the language model needs the llm extra: pip install 'hindsight[llm]' (google-tunix)"
    ) from None
  return qwen2, llama3


@functools.cache
def _hashable(cls):
  """`cls` (a Tunix ModelConfig: a mutable dataclass, so unhashable) with a hash: the modules
  keep their config in the graph, and a graph whose static half hashes can be a jit's static
  argument (as the credit model's is)."""
  return type(cls.__name__, (cls,), {"__hash__": lambda self: hash(repr(self))})


def tunix_config(cfg: BackboneConfig, dtype=jnp.float32):
  """Tunix's ModelConfig of `cfg`: float32 weights, computing in `dtype` (Tunix's Qwen2
  layers cast their inputs and weights to it, its norms compute in float32 and cast back;
  its Llama 3 has no compute dtype: float32 only, a one-line error otherwise)."""
  qwen2, llama3 = require_llm()
  common = dict(
    num_layers=cfg.depth, vocab_size=cfg.vocab_size, embed_dim=cfg.width, hidden_dim=cfg.hidden,
    num_heads=cfg.num_heads, head_dim=cfg.head_dim, num_kv_heads=cfg.num_kv_heads,
    rope_theta=cfg.rope_theta, norm_eps=cfg.norm_eps,
  )  # fmt: skip
  if cfg.arch == "qwen2":
    return _hashable(qwen2.ModelConfig)(**common, use_tied_embedding=cfg.tied, dtype=dtype)
  if jnp.dtype(dtype) != jnp.float32:
    raise HindsightError(
      f"a {jnp.dtype(dtype).name} backbone: Tunix's Llama 3 computes in float32 only "
      "(model.compute_dtype=bfloat16 applies to a Qwen2 backbone)"
    )
  return _hashable(llama3.ModelConfig)(**common, weight_tying=cfg.tied)


def model_class(cfg: BackboneConfig):
  qwen2, llama3 = require_llm()
  return qwen2.Qwen2 if cfg.arch == "qwen2" else llama3.Llama3


def build(cfg: BackboneConfig, key: jax.Array, dtype=jnp.float32) -> nnx.Module:
  """A Tunix decoder of `cfg` computing in `dtype` with fresh float32 weights drawn from
  `key`: every matrix N(0, 0.02^2), as Hugging Face initialises these families, norms 1,
  biases 0. (Tunix's own initialisers start the MLP at zero, where its gradients are zero
  too: it would never train.)"""
  model = model_class(cfg)(tunix_config(cfg, dtype), rngs=nnx.Rngs(params=key))
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state)

  def fresh(i, path, x):
    name = jax.tree_util.keystr(path)
    if "norm" in name:
      return jnp.ones_like(x)
    if "bias" in name:
      return jnp.zeros_like(x)
    return 0.02 * jax.random.normal(jax.random.fold_in(key, i), x.shape, x.dtype)

  new = [fresh(i, p, x) for i, (p, x) in enumerate(leaves)]
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, new))
  return model


def abstract(cfg: BackboneConfig) -> nnx.Module:
  """The decoder's structure with no arrays allocated (ShapeDtypeStructs)."""
  return nnx.eval_shape(lambda: model_class(cfg)(tunix_config(cfg), rngs=nnx.Rngs(params=0)))


def rope(x: jax.Array, positions: jax.Array, cfg: BackboneConfig) -> jax.Array:
  """Rotary positions on x [B, L, heads, H] at int positions [B, L] (the halves convention
  of Hugging Face's checkpoints: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin))."""
  H = x.shape[-1]
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, H, 2, dtype=np.float64) / H))
  if cfg.rope_scaling:
    inv = _llama31_frequencies(inv, *cfg.rope_scaling)
  angle = positions[..., None].astype(jnp.float32) * jnp.asarray(inv, jnp.float32)
  sin, cos = jnp.sin(angle)[:, :, None], jnp.cos(angle)[:, :, None]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


def _llama31_frequencies(inv, factor, low_freq_factor, high_freq_factor, original_max):
  """Llama 3.1's rescaled rotary frequencies (`rope_scaling.rope_type` "llama3"): long
  wavelengths divided by `factor`, short ones kept, a smooth blend between."""
  wavelength = 2 * math.pi / inv
  low, high = original_max / low_freq_factor, original_max / high_freq_factor
  smooth = (original_max / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
  blended = (1 - smooth) * inv / factor + smooth * inv
  return np.where(wavelength > low, inv / factor, np.where(wavelength < high, inv, blended))


def _project(attn, h, positions, cfg: BackboneConfig):
  """q [B, L, N, H], k, v [B, L, K, H] of normalised inputs h [B, L, D], rotated."""
  q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
  if cfg.arch == "qwen2":  # biases in the compute dtype (a float32 one would promote)
    q = q + attn.q_bias[...].reshape(q.shape[-2:]).astype(q.dtype)
    k = k + attn.k_bias[...].reshape(k.shape[-2:]).astype(k.dtype)
    v = v + attn.v_bias[...].reshape(v.shape[-2:]).astype(v.dtype)
  return rope(q, positions, cfg), rope(k, positions, cfg), v


def _attend(attn, q, keys, values, mask, cfg: BackboneConfig):
  """Wo softmax(q k^T / sqrt(H) | mask) v: q [B, L, N, H] over keys, values [B, S, K, H]
  where mask [B, L, S] -> [B, L, D]."""
  B, L, N, H = q.shape
  K = cfg.num_kv_heads
  if L == 1:
    return attn.o_proj(_attend_one(q, keys, values, mask))
  q = q.reshape(B, L, K, N // K, H)
  scores = jnp.einsum("blkgh,bskh->bkgls", q, keys).astype(jnp.float32) / math.sqrt(H)
  scores = jnp.where(mask[:, None, None], scores, NEG_INF)
  weights = jax.nn.softmax(scores, -1).astype(values.dtype)
  out = jnp.einsum("bkgls,bskh->blkgh", weights, values).reshape(B, L, N, H)
  return attn.o_proj(out)


def _attend_one(q, keys, values, mask):
  """`_attend`'s softmax(q k^T / sqrt(H) | mask) v for one query per row (a decode step):
  q [B, 1, N, H], keys, values [B, S, K, H], mask [B, 1, S] -> [B, 1, N, H]. The same sums as
  the einsums', written as products reduced over H and then over S: with one query there is
  no matrix to multiply, and a CPU's XLA runs these as one pass over the keys (and one over
  the values) where its batched dots of [N / K, H] x [H, S] take about twice as long."""
  B, _, N, H = q.shape
  K = keys.shape[2]
  q = q.reshape(B, 1, K, N // K, H).astype(jnp.float32)
  scores = jnp.sum(q * keys[:, :, :, None, :].astype(jnp.float32), -1) / math.sqrt(H)
  scores = jnp.where(mask[:, 0, :, None, None], scores, NEG_INF)  # [B, S, K, N / K]
  weights = jax.nn.softmax(scores, 1).astype(values.dtype)
  out = jnp.sum(weights[..., None] * values[:, :, :, None, :], 1)  # [B, K, N / K, H]
  return out.reshape(B, 1, N, H)


def forward(
  model,
  cfg: BackboneConfig,
  tokens: jax.Array,
  positions: jax.Array | None = None,
  cache=None,
  *,
  window: int | None = None,
  hidden: bool = False,
):
  """tokens int [B, L] -> (logits float32 [B, L, V] (or, with `hidden`, the final normalised
  states [B, L, D]), the updated cache or None).

  Without a cache: causal attention over the input (positions default to 0 .. L-1; right
  padding is never read by a real token). With one (`empty_cache`): a prompt (L > 1, no
  positions) is written at slots 0 .. L-1; tokens at given positions (a single token, or
  the rest of a prompt whose start the cache holds already) at those slots of their row
  (slots past the cache are dropped); each query reads the cached slots at positions <= its
  own. `window` (static): queries read only the first `window` slots, which must hold every
  position they attend to (a decode step's memory traffic is its cache read)."""
  B, L = tokens.shape
  from_start = positions is None  # a prompt from slot 0: one contiguous write per layer
  if from_start:
    positions = jnp.broadcast_to(jnp.arange(L), (B, L))
  x = model.embedder.encode(tokens)
  if cache is not None:
    ck, cv = cache
    window = window or ck.shape[2]
    key_pos = jnp.broadcast_to(jnp.arange(window), (B, window))
  for i, layer in enumerate(model.layers):
    q, k, v = _project(layer.attn, layer.input_layernorm(x), positions, cfg)
    if cache is None:
      keys, values, kp = k, v, positions
    else:
      if L == 1:
        rows = jnp.arange(B)
        ck = ck.at[i, rows, positions[:, 0]].set(k[:, 0].astype(ck.dtype))
        cv = cv.at[i, rows, positions[:, 0]].set(v[:, 0].astype(cv.dtype))
      elif from_start:
        ck = jax.lax.dynamic_update_slice(ck, k[None].astype(ck.dtype), (i, 0, 0, 0, 0))
        cv = jax.lax.dynamic_update_slice(cv, v[None].astype(cv.dtype), (i, 0, 0, 0, 0))
      else:
        rows = jnp.arange(B)[:, None]
        ck = ck.at[i, rows, positions].set(k.astype(ck.dtype), mode="drop")
        cv = cv.at[i, rows, positions].set(v.astype(cv.dtype), mode="drop")
      keys, values, kp = ck[i, :, :window], cv[i, :, :window], key_pos
    mask = kp[:, None, :] <= positions[:, :, None]  # [B, L, S]
    x = x + _attend(layer.attn, q, keys, values, mask, cfg)
    x = x + layer.mlp(layer.post_attention_layernorm(x))
  x = model.final_norm(x)
  if hidden:
    out = x
  elif cfg.tied:
    out = model.embedder.decode(x)
  else:
    out = model.lm_head(x)
  return out.astype(jnp.float32), (None if cache is None else (ck, cv))


def empty_cache(cfg: BackboneConfig, rows: int, dtype=jnp.float32):
  """Zeros (k, v) [depth, rows, S, K, H]."""
  shape = (cfg.depth, rows, cfg.max_len, cfg.num_kv_heads, cfg.head_dim)
  return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def parameter_count(model) -> int:
  return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


class StepStates(nnx.Module):
  """The LM-backbone step encoder's module (`credit_encoder.BackboneEncoder`): the decoder's
  final states at each step's last token, mapped to the credit model's width.
  batch["sequence"] int [B, N], batch["step_end"] int [B, T] -> [B, T, W]. The decoder
  computes in `dtype` (bfloat16: its matmuls, attention and residual stream; its weights,
  norms' statistics and softmax stay float32), its states return in float32."""

  def __init__(self, cfg: BackboneConfig, width: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
    self.cfg = cfg
    self.backbone = build(cfg, rngs.params(), dtype)
    self.out = nnx.Linear(cfg.width, width, rngs=rngs)

  def __call__(self, batch: dict) -> jax.Array:
    h, _ = forward(self.backbone, self.cfg, batch["sequence"], hidden=True)  # [B, N, D]
    at_end = jnp.take_along_axis(h, batch["step_end"][..., None], axis=1)  # [B, T, D]
    return self.out(at_end)
