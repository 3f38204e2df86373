"""A step encoder on a language model's backbone: the credit model reads a text trace as the
policy wrote it, prompt and steps as one token sequence through a Qwen2 / Llama 3 decoder,
and each step's vector is the decoder's final state at that step's last token (as process
reward models are served: Math-Shepherd, Qwen2.5-Math-PRM read the state at each step's
separator). For a trace with prompt tokens x_0 .. x_{P-1} and step t ending at token e_t:

  h = Decoder(prompt ++ step_0 ++ ... ++ step_{T-1})        [B, N, D]  (causal)
  enc_t = Linear(h[e_t])                                     [B, T, W]

so step t's vector has read the prompt and every step up to and including t, and nothing
after (the credit model's own transformer over steps sees the rest). The decoder starts from
the policy's weights (`data.lm_init = "pretrained"`, a `hindsight lm train` workdir or a
Hugging Face folder named by `data.lm`) or from random ones ("random"); without `data.lm` it
is a small random Qwen2 on a BPE trained on the training split (`data.lm_width`).

Registered as the step encoder `lm_backbone` by the `lm_backbone` plug-in (this module; JAX is
imported only by the module it builds, `backbone.StepStates`), chosen by `data.encoder =
"lm_backbone"` (configs/text_lm.py); its episodes are the text trace format of docs/text.md,
prompt included.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from hindsight.errors import HindsightError, note
from hindsight.lm.config import BackboneConfig
from hindsight.model.encoders.base import TextObservations, register_encoder
from hindsight.model.encoders.tokenizer import Tokenizer, make_tokenizer

KIND = "lm_backbone"
MIN_BUCKET = 64


def sequence_bucket(n: int) -> int:
  """Tokens a trace of n tokens is padded to: the next power of two, at least 64."""
  return max(MIN_BUCKET, 1 << max(int(n) - 1, 0).bit_length())


@functools.lru_cache(maxsize=2)
def _pretrained(source: str, max_len: int):
  from hindsight.lm.train import load_lm

  return load_lm(source, max_len)


@register_encoder
@dataclasses.dataclass(frozen=True)
class BackboneEncoder(TextObservations):
  """A `StepEncoder` of text traces read by a decoder (module docstring).

  backbone: the decoder's BackboneConfig as JSON; tokenizer: its tokenizer's record.
  init: "pretrained" (the parameters of `source` at the start of training) or "random".
  source: the model folder the backbone and tokenizer came from ("" for a fresh one).
  sequence_tokens: the tokens training batches are padded to (the longest training trace's
    bucket); max_tokens: the longest trace (prompt and steps) it reads: the decoder's context
    (a fresh decoder's is twice the longest training trace's bucket).
  """

  backbone: str
  tokenizer: str
  init: str
  source: str
  sequence_tokens: int
  max_tokens: int

  kind: ClassVar[str] = KIND
  episode_format: ClassVar[str] = "text"
  legacy_params: ClassVar[Mapping[str, tuple]] = {}

  @functools.cached_property
  def cfg(self) -> BackboneConfig:
    return BackboneConfig.from_json(json.loads(self.backbone))

  @functools.cached_property
  def tokens(self) -> Tokenizer:
    return Tokenizer.from_json(self.tokenizer)

  # -- fitting --------------------------------------------------------------------------
  @classmethod
  def matches(cls, example: Mapping[str, Any]) -> bool:
    del example
    return False  # chosen by name (data.encoder), never detected

  @classmethod
  def fit(cls, examples: Sequence[Mapping[str, Any]], options: Mapping[str, Any]):
    """Options: `lm` (a model folder; "" a fresh small Qwen2), `lm_init` ("pretrained" or
    "random"), `lm_width` (the fresh model's width), `tokenizer` and `vocab_size` (its
    tokenizer)."""
    from hindsight.data.labels import as_text

    prompts = [as_text(e.get("prompt", "")) for e in examples]
    steps = [[as_text(t) for t in e.get("step_text", ())] for e in examples]
    if not any(steps):
      raise HindsightError(f"step encoder {KIND}: the labels hold no text traces")
    source = str(options.get("lm", "") or "")
    source = os.path.abspath(source) if source else ""  # read again when training starts
    init = str(options.get("lm_init", "pretrained"))
    if init not in ("pretrained", "random"):
      raise HindsightError(f"data.lm_init {init!r}: expected pretrained or random")
    if source:
      lm = _pretrained(source, None)
      cfg, tok = lm.cfg, lm.tokenizer
    else:
      init = "random"
      texts = [*prompts, *(t for s in steps for t in s)]
      tok = make_tokenizer(options.get("tokenizer", "bpe"), texts, options.get("vocab_size", 512))
      w = int(options.get("lm_width", 64))
      cfg = BackboneConfig("qwen2", tok.vocab_size, w, 2, 4, 2, w // 4, 3 * w, max_len=4096)
    record = cls(json.dumps(cfg.to_json()), tok.to_json(), init, source, MIN_BUCKET, cfg.max_len)
    longest = max(record.trace_lengths(prompts, steps))
    bucket = sequence_bucket(longest)
    # A policy's decoder reads what its context holds; a fresh one (rotary positions have no
    # table, so any context is its own) twice the longest training trace's bucket.
    max_tokens = cfg.max_len if source else min(cfg.max_len, 2 * bucket)
    if longest > max_tokens:
      raise HindsightError(
        f"a training trace is {longest} tokens, longer than the backbone's context {cfg.max_len}"
      )
    if not source:
      cfg = dataclasses.replace(cfg, max_len=max_tokens)
    note(f"step encoder {KIND}: reads traces of up to {max_tokens} tokens, prompt and steps (the "
         f"decoder's context); the longest training trace is {longest}")  # fmt: skip
    return dataclasses.replace(
      record,
      backbone=json.dumps(cfg.to_json()),
      sequence_tokens=min(bucket, max_tokens),
      max_tokens=max_tokens,
    )

  def initial_params(self):
    """The backbone's starting parameters (an nnx.State of the module's `backbone`) where
    they are pretrained (what training puts in place of the random ones), else None."""
    if self.init != "pretrained" or not self.source:
      return None
    import jax
    from flax import nnx

    # Host copies: training donates its state, and the cached model must outlive that.
    state = nnx.state(_pretrained(self.source, None).model, nnx.Param)
    return jax.tree.map(lambda x: np.array(x, copy=True), state)

  # -- record ---------------------------------------------------------------------------
  def to_json(self) -> dict[str, Any]:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  @classmethod
  def from_json(cls, record: Mapping[str, Any]):
    return cls(str(record["backbone"]), str(record["tokenizer"]), str(record["init"]),
               str(record["source"]), int(record["sequence_tokens"]),
               int(record["max_tokens"]))  # fmt: skip

  def describe(self) -> str:
    c = self.cfg
    return (f"text traces through a {c.arch} decoder ({c.depth} layers, width {c.width}; up to "
            f"{self.max_tokens} tokens)")  # fmt: skip

  @property
  def signature(self) -> tuple:
    return ("text",)  # any trace; each is checked against its token limit

  # -- host -------------------------------------------------------------------------------
  def _encode(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]):
    """[(prompt ids, [step ids])] of each trace, one batched encode."""
    ids = self.tokens.encode_batch(list(prompts), start=True)
    ids += self.tokens.encode_batch([t for s in steps for t in s])
    out, at = [], len(prompts)
    for i, s in enumerate(steps):
      out.append((ids[i], ids[at : at + len(s)]))
      at += len(s)
    return out

  def trace_lengths(self, prompts, steps) -> list[int]:
    return [p.size + sum(x.size for x in s) for p, s in self._encode(prompts, steps)]

  def check_steps(self, texts: Sequence[str], where: str, prompt: str = "",
                  names: Sequence[str] | None = None) -> int:  # fmt: skip
    """One-line errors: a step with no tokens, or a trace (prompt and steps) longer than the
    model reads (`max_tokens`), a step named `names[i]` (default "step i"). Returns the
    tokens it reads: the prompt's and the steps'."""
    ((p, ids),) = self._encode([prompt], [list(texts)])
    for i, x in enumerate(ids):
      if x.size > self.max_tokens:
        raise HindsightError(
          f"{where}: {names[i] if names else f'step {i}'} is {x.size} tokens, longer than "
          f"the {self.max_tokens} the model reads"
        )
    total = p.size + sum(x.size for x in ids)
    if total > self.max_tokens:
      raise HindsightError(
        f"{where}: the trace is {total} tokens (prompt and steps), longer than the "
        f"{self.max_tokens} the model reads"
      )
    return int(total)

  def _rows(self, episodes: Sequence[Any]):
    live = [ep for ep in episodes if ep is not None]
    encoded = iter(self._encode([ep.prompt for ep in live], [list(ep.step_text) for ep in live]))
    return [None if ep is None else next(encoded) for ep in episodes]

  def shape(self, episodes: Sequence[Any]) -> int:
    """The token bucket of the longest trace of `episodes`."""
    longest = max((p.size + sum(x.size for x in s) for r in self._rows(episodes) if r
                   for p, s in [r]), default=1)  # fmt: skip
    return min(sequence_bucket(longest), self.max_tokens)

  def shapes(self) -> list[int]:
    out, n = [], MIN_BUCKET
    while n < self.max_tokens:
      out.append(n)
      n *= 2
    return [*out, self.max_tokens]

  def features(self, episodes: Sequence[Any], pad: int, shape: int | None = None) -> dict:
    """sequence int32 [B, N]: each trace's prompt and steps (pad id after; N = `shape`,
    default the training shape; a longer trace is cut at N); step_end int32 [B, pad]: the
    position of each step's last token (0 on padding steps)."""
    N = int(shape or self.sequence_tokens)
    seq = np.full((len(episodes), N), self.cfg.pad_id, np.int32)
    ends = np.zeros((len(episodes), pad), np.int32)
    for row, r in enumerate(self._rows(episodes)):
      if r is None:
        continue
      p, steps = r
      flat = np.concatenate([p, *steps])[:N]
      seq[row, : flat.size] = flat
      end = p.size + np.cumsum([x.size for x in steps]) - 1
      n = min(len(steps), pad)
      ends[row, :n] = np.clip(end[:n], 0, N - 1)
    return {"sequence": seq, "step_end": ends}

  # -- device -----------------------------------------------------------------------------
  def module(self, width: int, *, rngs, hidden: int | None = None, dtype=None):
    """`backbone.StepStates` (module docstring's enc_t), computing in `dtype` (the credit
    model's `model.compute_dtype`; None: float32)."""
    import jax.numpy as jnp

    from hindsight.lm.backbone import StepStates

    del hidden  # the decoder's width is its own
    return StepStates(self.cfg, width, rngs=rngs, dtype=dtype or jnp.float32)
