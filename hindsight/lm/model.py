"""A small decoder-only transformer in flax.nnx, with a KV cache for sampling.

    x_0 = E_tok[tokens] + E_pos[positions]
    x_{l+1} = x_l + Attn(LN x_l) ; x_{l+1} += MLP(LN x_{l+1})      (pre-LayerNorm, causal)
    logits = Linear(LN x_L)                                         [B, L, V]

One forward serves training (no cache: causal attention over the input) and sampling
(`forward` with a cache of keys and values [depth, B, H, S, Dh]: the input's keys and values
are written at its positions, and each query attends to the cached keys at positions <= its
own). Shapes: B rows, L input tokens, S = max_len cache slots, H heads of Dh = W / H.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hindsight.lm.config import LMConfig


class Layer(nnx.Module):
  def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
    w = cfg.width
    self.cfg = cfg
    self.norm1 = nnx.LayerNorm(w, rngs=rngs)
    self.qkv = nnx.Linear(w, 3 * w, rngs=rngs)
    self.proj = nnx.Linear(w, w, rngs=rngs)
    self.norm2 = nnx.LayerNorm(w, rngs=rngs)
    self.fc1 = nnx.Linear(w, cfg.mlp_ratio * w, rngs=rngs)
    self.fc2 = nnx.Linear(cfg.mlp_ratio * w, w, rngs=rngs)

  def project(self, x):
    """x [B, L, W] -> q, k, v [B, H, L, Dh]."""
    B, L, _ = x.shape
    H, Dh = self.cfg.num_heads, self.cfg.head_dim
    q, k, v = jnp.split(self.qkv(self.norm1(x)), 3, -1)
    return tuple(a.reshape(B, L, H, Dh).transpose(0, 2, 1, 3) for a in (q, k, v))

  def finish(self, x, q, keys, values, mask):
    """x + Attn (queries q [B, H, L, Dh] over keys, values [B, H, S, Dh] where mask
    [B, 1, L, S]), then + MLP."""
    B, L, _ = x.shape
    scores = jnp.einsum("bhld,bhsd->bhls", q, keys) / jnp.sqrt(jnp.float32(self.cfg.head_dim))
    attn = jax.nn.softmax(jnp.where(mask, scores, -1e30), -1)
    h = jnp.einsum("bhls,bhsd->bhld", attn, values).transpose(0, 2, 1, 3).reshape(B, L, -1)
    x = x + self.proj(h)
    return x + self.fc2(jax.nn.gelu(self.fc1(self.norm2(x))))


class LanguageModel(nnx.Module):
  """The decoder (module docstring)."""

  def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.token_embed = nnx.Embed(cfg.vocab_size, cfg.width, rngs=rngs)
    self.position_embed = nnx.Embed(cfg.max_len, cfg.width, rngs=rngs)
    self.layers = nnx.List([Layer(cfg, rngs=rngs) for _ in range(cfg.depth)])
    self.norm = nnx.LayerNorm(cfg.width, rngs=rngs)
    self.head = nnx.Linear(cfg.width, cfg.vocab_size, rngs=rngs)

  def empty_cache(self, rows: int):
    """Zeros (k, v) [depth, rows, H, S, Dh]."""
    c = self.cfg
    shape = (c.depth, rows, c.num_heads, c.max_len, c.head_dim)
    return jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)

  def __call__(self, tokens, positions=None, cache=None, window: int | None = None):
    """tokens int [B, L] -> (logits [B, L, V], the updated cache or None).

    Without a cache: causal attention over the input (positions default to 0 .. L-1).
    With one (`empty_cache`): a prompt (L > 1) is written at positions 0 .. L-1, a single
    token (L = 1) at each row's own position; queries attend to the cached keys at
    positions <= their own. The cache is updated in place by one scatter per layer (inside
    the sampling loop XLA reuses its buffer: no copy of the cache per token). `window`
    (static): queries read only the first `window` slots, which must hold every position they
    attend to; a decode step reads its whole cache, so this is most of its memory traffic."""
    B, L = tokens.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(L), (B, L))
    x = self.token_embed(tokens) + self.position_embed(positions)
    if cache is not None:
      ck, cv = cache
      window = window or ck.shape[3]
      key_pos = jnp.broadcast_to(jnp.arange(window), (B, window))
    for i, layer in enumerate(self.layers):
      q, k, v = layer.project(x)
      if cache is None:
        keys, values, kp = k, v, positions
      else:
        if L == 1:
          rows = jnp.arange(B)
          ck = ck.at[i, rows, :, positions[:, 0]].set(k[:, :, 0])
          cv = cv.at[i, rows, :, positions[:, 0]].set(v[:, :, 0])
        else:
          ck = jax.lax.dynamic_update_slice(ck, k[None], (i, 0, 0, 0, 0))
          cv = jax.lax.dynamic_update_slice(cv, v[None], (i, 0, 0, 0, 0))
        keys, values, kp = ck[i, :, :, :window], cv[i, :, :, :window], key_pos
      mask = kp[:, None, None, :] <= positions[:, None, :, None]  # [B, 1, L, S]
      x = layer.finish(x, q, keys, values, mask)
    logits = self.head(self.norm(x))
    return logits, (None if cache is None else (ck, cv))
