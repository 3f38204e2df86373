"""Text steps: each step's text, tokenized (`model.encoders.tokenizer`) and read by a small
convolutional encoder:

  e_i = E_tok[tok_i] + E_pos[i];  h_i = gelu(Conv_k(e)_i) + e_i
  enc = Linear([mean_{i valid} h_i, max_{i valid} h_i])

The convolution (width `kernel`) reads each token with its neighbours, so a step's phrases
matter and not only its bag of tokens; the pooled vector does not depend on the padded token
length L (padding is masked), so one model serves every token bucket. Batches are padded over
steps and over tokens (powers of two from 16, `token_bucket`): few shapes, so few compiles.

Its episodes come in the text plug-in's trace format (`episode_format` "text": steps, text or
step_text with an outcome; `hindsight.text.episodes`), which checks every step against the
longest the model reads (`check_steps`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.data.labels import as_text
from hindsight.errors import HindsightError
from hindsight.model.encoders.base import TextObservations, register_encoder
from hindsight.model.encoders.tokenizer import Tokenizer, make_tokenizer


def token_bucket(n: int) -> int:
  """Tokens a step of n tokens is padded to: the next power of two, at least 16 (few shapes,
  so few compiles)."""
  return max(16, 1 << max(int(n) - 1, 0).bit_length())


class TextModule(nnx.Module):
  """batch["tokens"] int [B, T, L] (0 = padding) -> [B, T, W] (module docstring)."""

  def __init__(self, vocab_size: int, max_tokens: int, width: int, *, rngs: nnx.Rngs, kernel=3):
    self.token_embed = nnx.Embed(vocab_size, width, rngs=rngs)
    self.position_embed = nnx.Embed(max_tokens, width, rngs=rngs)
    self.conv = nnx.Conv(width, width, kernel_size=(kernel,), padding="SAME", rngs=rngs)
    self.out = nnx.Linear(2 * width, width, rngs=rngs)
    self.max_tokens = max_tokens

  def __call__(self, batch: dict) -> jax.Array:
    tokens = batch["tokens"]
    L = tokens.shape[-1]
    lead = tokens.shape[:-1]
    flat = tokens.reshape(-1, L)
    valid = (flat > 0)[..., None]
    e = self.token_embed(flat) + self.position_embed(
      jnp.minimum(jnp.arange(L), self.max_tokens - 1)
    )
    h = jax.nn.gelu(self.conv(e * valid)) + e
    n = jnp.maximum(valid.sum(1), 1)
    mean = jnp.where(valid, h, 0.0).sum(1) / n
    top = jnp.where(valid, h, -1e9).max(1)
    top = jnp.where(valid.any(1), top, 0.0)  # an empty row (padding): zeros, not -1e9
    return self.out(jnp.concatenate([mean, top], -1)).reshape(*lead, -1)


@register_encoder
@dataclasses.dataclass(frozen=True)
class TextEncoder(TextObservations):
  """A `StepEncoder` of text steps (module docstring).

  tokenizer: the tokenizer's record (`Tokenizer.to_json`), so a checkpoint alone restores
    the ids it was trained on.
  step_tokens: the tokens per step training batches are padded to (the bucket of the
    longest training step).
  max_step_tokens: the longest step the model reads, in tokens; a longer one is refused
    with a one-line error.
  """

  tokenizer: str
  step_tokens: int
  max_step_tokens: int

  kind: ClassVar[str] = "text"
  episode_format: ClassVar[str] = "text"
  legacy_params: ClassVar[Mapping[str, tuple]] = {"step_encoder": ()}

  @functools.cached_property
  def tokens(self) -> Tokenizer:
    return Tokenizer.from_json(self.tokenizer)

  @classmethod
  def matches(cls, example: Mapping[str, Any]) -> bool:
    return bool(len(example.get("step_text", ())))

  @classmethod
  def of_texts(cls, texts: Sequence[str], tokenizer: str = "bpe", vocab_size: int = 512):
    """The record for training steps `texts`: a BPE of `vocab_size` ids trained on them
    (`tokenizer` "bpe") or bytes ("bytes"), the token bucket of the longest step
    (`step_tokens`) and twice that as the longest step it reads."""
    tok = make_tokenizer(tokenizer, texts, int(vocab_size))
    longest = max(ids.size for ids in tok.encode_batch(texts))
    step = token_bucket(longest)
    return cls(tok.to_json(), step, 2 * step)

  @classmethod
  def fit(cls, examples: Sequence[Mapping[str, Any]], options: Mapping[str, Any]):
    texts = [as_text(t) for e in examples for t in e.get("step_text", ())]
    return cls.of_texts(texts, options.get("tokenizer", "bpe"), options.get("vocab_size", 512))

  def to_json(self) -> dict[str, Any]:
    return {
      "tokenizer": self.tokenizer,
      "step_tokens": self.step_tokens,
      "max_step_tokens": self.max_step_tokens,
    }

  @classmethod
  def from_json(cls, record: Mapping[str, Any]):
    return cls(str(record["tokenizer"]), int(record["step_tokens"]), int(record["max_step_tokens"]))

  def describe(self) -> str:
    return f"text steps (up to {self.max_step_tokens} tokens)"

  @property
  def signature(self) -> tuple:
    return (self.kind,)  # any trace; each step is checked against its token limit

  def check_steps(self, texts: Sequence[str], where: str, prompt: str = "",
                  names: Sequence[str] | None = None) -> int:  # fmt: skip
    """A one-line error for a step longer than the model reads (`max_step_tokens`), naming
    it `names[i]` (default "step i"); the prompt is not read. Returns the tokens it reads:
    the steps'."""
    del prompt
    total = 0
    for i, ids in enumerate(self.tokens.encode_batch(list(texts))):
      if ids.size > self.max_step_tokens:
        raise HindsightError(
          f"{where}: {names[i] if names else f'step {i}'} is {ids.size} tokens, longer than "
          f"the {self.max_step_tokens} the model reads"
        )
      total += ids.size
    return total

  def step_ids(self, episodes: Sequence[Any]) -> list[list[np.ndarray]]:
    """The token ids of every step of every episode (None rows: []), one batched encode."""
    texts = [t for ep in episodes if ep is not None for t in ep.step_text]
    ids = self.tokens.encode_batch(texts) if texts else []
    out, at = [], 0
    for ep in episodes:
      n = 0 if ep is None else len(ep.step_text)
      out.append(ids[at : at + n])
      at += n
    return out

  def shape(self, episodes: Sequence[Any]) -> int:
    """The token bucket of the longest step of `episodes`."""
    longest = max((ids.size for steps in self.step_ids(episodes) for ids in steps), default=1)
    return token_bucket(longest)

  def shapes(self) -> list[int]:
    return sorted({token_bucket(n) for n in range(1, self.max_step_tokens + 1)})

  def features(self, episodes: Sequence[Any], pad: int, shape: int | None = None) -> dict:
    """tokens int32 [B, T, L]: each step's ids, 0-padded to L = `shape` (default the
    training shape, `step_tokens`; longer steps are cut at L)."""
    L = int(shape or self.step_tokens)
    tokens = np.zeros((len(episodes), pad, L), np.int32)
    for row, steps in enumerate(self.step_ids(episodes)):
      for t, ids in enumerate(steps[:pad]):
        tokens[row, t, : min(ids.size, L)] = ids[:L]
    return {"tokens": tokens}

  def module(self, width: int, *, rngs: nnx.Rngs, hidden: int | None = None) -> TextModule:
    del hidden  # the convolution's width is the model's
    return TextModule(self.tokens.vocab_size, self.max_step_tokens, width, rngs=rngs)
