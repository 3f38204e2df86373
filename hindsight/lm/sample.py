"""Batched sampling from the small language model: one jitted prefill, then a
`lax.while_loop` of one-token steps over a KV cache, every row with its own settings.

Row r continues prompt r (ids [P], right-padded, length n_r) with its own temperature T_r,
nucleus p_r, token budget m_r and key k_r: token i of row r is drawn with
fold_in(k_r, i) from softmax(logits / T_r) restricted to the smallest set of tokens whose
probability reaches p_r (T_r = 0: the argmax). A row stops at EOS or after m_r tokens; the
loop stops when every row has. A row's tokens depend only on its own prompt, settings and
key, so a choice is the same whichever requests it was batched with (up to the float
rounding of batched matmuls).

Compiled programs are keyed by (rows, prompt bucket): `ROW_BUCKETS` x `prompt_buckets`.
This is the static sampler (a batch whose rows start together and run until the longest
ends): the reference the tests and `eval/bench_text.py` hold the engine against. The server
and LM RL sample on `engine.SlotEngine` (continuous batching, shared prefills), which draws
the same tokens with the same per-token step (`decode_step`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.lm.backbone import empty_cache, forward
from hindsight.lm.config import BackboneConfig

ROW_BUCKETS = (1, 4, 16, 64)


def prompt_buckets(max_len: int) -> tuple[int, ...]:
  """Prompt lengths a batch is padded to: powers of two from 32, and max_len."""
  out, p = [], 32
  while p < max_len:
    out.append(p)
    p *= 2
  return (*out, max_len)


def nucleus_sample(key, logits, temperature, top_p):
  """One token from logits [V] at `temperature` (0: argmax) and nucleus `top_p`."""
  scaled = logits / jnp.maximum(temperature, 1e-6)
  order = jnp.argsort(-scaled)
  probs = jax.nn.softmax(scaled[order])
  keep_sorted = jnp.cumsum(probs) - probs < top_p  # the first token is always kept
  keep = jnp.zeros_like(keep_sorted).at[order].set(keep_sorted)
  # Drawn in the vocabulary's own order: at top_p = 1 the same token as `plain_sample`.
  choice = jax.random.categorical(key, jnp.where(keep, scaled, -jnp.inf))
  return jnp.where(temperature <= 0, jnp.argmax(logits), choice).astype(jnp.int32)


def plain_sample(key, logits, temperature, top_p):
  """`nucleus_sample` at top_p = 1 (the same token for the same key) without its sort, most
  of a step's cost on a CPU."""
  del top_p
  choice = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6))
  return jnp.where(temperature <= 0, jnp.argmax(logits), choice).astype(jnp.int32)


def sample_rows(keys, logits, temperature, top_p):
  """One token per row [R]: the sort only when some row asks for a nucleus."""
  return jax.lax.cond(
    jnp.all(top_p >= 1.0),
    jax.vmap(plain_sample),
    jax.vmap(nucleus_sample),
    keys,
    logits,
    temperature,
    top_p,
  )


def ascii_bias(tokenizer, cfg: BackboneConfig) -> np.ndarray:
  """float32 [V]: 0 for tokens whose text is ASCII (and the EOS ids), -inf for the rest. The
  small language model writes ASCII (its training text is); without this a poorly trained one
  can emit half of a UTF-8 character, whose U+FFFD re-encodes to three tokens and can push
  the next prefix past the context."""
  bias = np.full(cfg.vocab_size, -np.inf, np.float32)
  for i in range(min(tokenizer.vocab_size, cfg.vocab_size)):
    text = tokenizer.decode([i])
    if i in cfg.eos_ids or (text and text.isascii()):
      bias[i] = 0.0
  return bias


def is_eos(token, cfg: BackboneConfig):
  """bool of int `token` (any shape): one of the model's end-of-sequence ids."""
  return jnp.isin(token, jnp.asarray(cfg.eos_ids, jnp.int32))


def decode_step(model, cfg: BackboneConfig, cache, rows: dict, bias, window: int | None = None):
  """One token of every live row, and the model run on it. rows: last [R, V] (the next
  token's logits), pos (the next position), count (tokens drawn), budget int [R], done, eos
  bool [R], temperature, top_p [R], keys [R]. Token i of a row is drawn with fold_in(its key,
  i), so a row's draws depend on its own prompt, settings and key only. Returns (cache, rows,
  token int [R], live bool [R]: whether the row drew it)."""
  step_keys = jax.vmap(jax.random.fold_in)(rows["keys"], rows["count"])
  token = sample_rows(step_keys, rows["last"], rows["temperature"], rows["top_p"])
  live = ~rows["done"]
  count = rows["count"] + live
  hit = live & is_eos(token, cfg)
  pos = jnp.minimum(rows["pos"], cfg.max_len - 1)[:, None]
  logits, cache = forward(model, cfg, token[:, None], pos, cache, window=window)
  rows = rows | {
    "count": count,
    "done": rows["done"] | hit | (count >= rows["budget"]),
    "eos": rows["eos"] | hit,
    "pos": rows["pos"] + live,
    "last": logits[:, 0] + bias,
  }
  return cache, rows, token, live


def sampler(graphdef, cfg: BackboneConfig):
  """The jitted `generate` of one model: (state, prompts, lengths, budgets, temperature,
  top_p, keys, bias=None) -> its result, compiled per shape of its arguments."""
  return jax.jit(functools.partial(generate, graphdef, cfg))


def generate(
  graphdef, cfg: BackboneConfig, state, prompts, lengths, budgets, temperature, top_p, keys,
  bias=None,
):  # fmt: skip
  """The sampler's body (`sampler` jits it). prompts int [R, P] (right-padded), lengths [R]
  (>= 1), budgets [R] (tokens at most; lengths + budgets <= max_len), temperature, top_p
  float [R], keys [R] (typed keys), bias float [V] added to every step's logits
  (`ascii_bias`; None: none).
  Returns (tokens int [R, S] (the first count_r are the continuation), count int [R],
  ended_by_eos bool [R])."""
  model = nnx.merge(graphdef, state)
  R = prompts.shape[0]
  S = cfg.max_len
  bias = jnp.zeros(cfg.vocab_size) if bias is None else bias
  logits, cache = forward(model, cfg, prompts, cache=empty_cache(cfg, R))

  rows = {
    "last": logits[jnp.arange(R), lengths - 1] + bias,  # [R, V]: the next token's logits
    "pos": lengths,
    "count": jnp.zeros(R, jnp.int32),
    "budget": budgets,
    "done": budgets <= 0,
    "eos": jnp.zeros(R, bool),
    "temperature": temperature,
    "top_p": top_p,
    "keys": keys,
  }

  def cond(carry, window):
    _, _, r, _ = carry
    # The next position of every live row fits the phase's window (a row's budget keeps it
    # below S, so the last phase, window S, runs until every row is done).
    return ~jnp.all(r["done"]) & (jnp.max(jnp.where(r["done"], 0, r["pos"])) < window)

  def body(carry, window):
    i, cache, r, out = carry
    cache, r, token, live = decode_step(model, cfg, cache, r, bias, window)
    return i + 1, cache, r, out.at[:, i].set(jnp.where(live, token, 0))

  # Phases of growing windows (the prompt buckets above P, then S): a step attends over the
  # cache slots its phase can reach, not all S of them.
  carry = (jnp.int32(0), cache, rows, jnp.zeros((R, S), jnp.int32))
  for window in [w for w in prompt_buckets(S) if w > prompts.shape[1]] or [S]:
    carry = jax.lax.while_loop(
      functools.partial(cond, window=window), functools.partial(body, window=window), carry
    )
  _, _, rows, out = carry
  return out, rows["count"], rows["eos"]


def pad_prompts(prompts: list[np.ndarray], max_len: int) -> tuple[np.ndarray, np.ndarray]:
  """(ids int32 [R, P], lengths [R]): prompts right-padded to their bucket P and R rows
  to the row bucket (extra rows repeat the first prompt and are discarded)."""
  n = len(prompts)
  R = next((r for r in ROW_BUCKETS if r >= n), n)
  P = next(p for p in prompt_buckets(max_len) if p >= max(len(x) for x in prompts))
  ids = np.zeros((R, P), np.int32)
  lengths = np.zeros(R, np.int32)
  for r in range(R):
    x = prompts[r if r < n else 0]
    ids[r, : len(x)] = x
    lengths[r] = len(x)
  return ids, lengths
