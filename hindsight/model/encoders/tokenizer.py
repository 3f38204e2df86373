"""Tokenizers that need no download: raw bytes, or a byte-level BPE trained on the label data.

Both map any Python string to int ids and back, byte for byte:

  bytes   id = byte + 2 (ids 0 and 1 are PAD and EOS), vocabulary 258
  bpe     a byte-level BPE (`tokenizers`, Hugging Face) trained on the texts given, with PAD
          and EOS as ids 0 and 1; every byte is in its alphabet, so nothing is unknown
  hf      a language model's own `tokenizer.json` (a Hugging Face folder, `hindsight.lm.hf`):
          its ids as they are; its end-of-sequence ids are the model config's

`Tokenizer.to_json()` is what a checkpoint stores (the text encoder's record, the small language
model's record): `Tokenizer.from_json` rebuilds the same ids with nothing to fetch. The credit
model and the small language model (`hindsight.lm`) share this one home.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from hindsight.errors import HindsightError

PAD, EOS = 0, 1
SPECIAL = ("<pad>", "<eos>")
_BYTE_OFFSET = len(SPECIAL)


class Tokenizer:
  """Text <-> int ids (module docstring). Build with `bytes_tokenizer()` or `train_bpe`."""

  def __init__(self, kind: str, bpe_json: str = ""):
    if kind not in ("bytes", "bpe", "hf"):
      raise HindsightError(f"tokenizer {kind!r}: expected bytes, bpe or hf")
    self.kind, self.bpe_json = kind, bpe_json
    self._bpe = None
    if kind != "bytes":
      from tokenizers import Tokenizer as HfTokenizer

      try:
        self._bpe = HfTokenizer.from_str(bpe_json)
      except Exception as e:  # the library raises its own exception types
        raise HindsightError(f"the stored BPE tokenizer is unreadable ({e})") from None

  @property
  def vocab_size(self) -> int:
    if self._bpe is None:
      return 256 + _BYTE_OFFSET
    return int(self._bpe.get_vocab_size(with_added_tokens=True))

  def encode(self, text: str, start: bool = False) -> np.ndarray:
    """int32 [n] ids of `text` (no PAD, no EOS)."""
    return self.encode_batch([text], start)[0]

  def encode_batch(self, texts: list[str], start: bool = False) -> list[np.ndarray]:
    """int32 ids of each text. `start`: the texts begin a sequence, and a Hugging Face
    tokenizer adds what its post-processor puts there (Llama 3's <|begin_of_text|>); a
    continuation or a step gets none. A text that is not valid Unicode (a lone surrogate
    from a broken decode) raises a one-line HindsightError."""
    for i, t in enumerate(texts):
      try:
        t.encode("utf-8")
      except UnicodeEncodeError:
        raise HindsightError(f"text {i} is not valid UTF-8") from None
    if self._bpe is None:
      return [
        np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32) + _BYTE_OFFSET for t in texts
      ]
    specials = start and self.kind == "hf"
    return [
      np.asarray(e.ids, np.int32)
      for e in self._bpe.encode_batch(texts, add_special_tokens=specials)
    ]

  def decode(self, ids, keep_special: bool = False) -> str:
    """The text of `ids` (PAD, EOS and a Hugging Face tokenizer's special tokens dropped, or
    with `keep_special` a Hugging Face tokenizer's special tokens kept as their text: a chat
    template's markers); bytes of an unfinished UTF-8 character become U+FFFD."""
    if self.kind == "hf":
      return self._bpe.decode([int(i) for i in ids], skip_special_tokens=not keep_special)
    ids = [int(i) for i in ids if int(i) >= _BYTE_OFFSET]
    if self._bpe is None:
      return bytes(i - _BYTE_OFFSET for i in ids).decode("utf-8", errors="replace")
    return self._bpe.decode(ids, skip_special_tokens=True)

  def to_json(self) -> str:
    return json.dumps({"kind": self.kind, "bpe": self.bpe_json}, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> Tokenizer:
    return _cached_tokenizer(text)

  def __eq__(self, other) -> bool:
    return isinstance(other, Tokenizer) and self.to_json() == other.to_json()

  def __hash__(self) -> int:
    return hash(self.to_json())


@functools.lru_cache(maxsize=8)
def _cached_tokenizer(text: str) -> Tokenizer:
  try:
    record = json.loads(text)
    return Tokenizer(record["kind"], record.get("bpe", ""))
  except (ValueError, KeyError, TypeError):
    raise HindsightError("the stored tokenizer record is unreadable") from None


def bytes_tokenizer() -> Tokenizer:
  return Tokenizer("bytes")


def train_bpe(texts, vocab_size: int = 512) -> Tokenizer:
  """A byte-level BPE of `vocab_size` ids (PAD, EOS, the 256 bytes, then merges) trained on
  `texts`. The trainer is deterministic: the same texts give the same tokenizer."""
  from tokenizers import Tokenizer as HfTokenizer
  from tokenizers import decoders, models, pre_tokenizers, trainers

  if vocab_size < 256 + _BYTE_OFFSET:
    raise HindsightError(f"BPE vocabulary {vocab_size}: at least {256 + _BYTE_OFFSET} (the bytes)")
  tok = HfTokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size,
    special_tokens=list(SPECIAL),
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(list(texts), trainer)
  return Tokenizer("bpe", tok.to_str())


def make_tokenizer(kind: str, texts=(), vocab_size: int = 512) -> Tokenizer:
  """ "bytes" or "bpe" (trained on `texts`)."""
  if kind == "bytes":
    return bytes_tokenizer()
  if kind == "bpe":
    return train_bpe(texts, vocab_size)
  raise HindsightError(f"tokenizer {kind!r}: expected bytes or bpe")
