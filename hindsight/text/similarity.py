"""Is a resampled chunk the same content as the one it replaces? Cosine similarity of
sentence embeddings, as thought-anchors' counterfactual importance uses (cosine < 0.8:
"semantically different").

The built-in embedding (`lexical`) runs offline with nothing to download: a bag of lowercase
words and character trigrams within words (scikit-learn's `char_wb` analyzer, counted
exactly rather than hashed), cosine over counts. It catches a restatement that reuses the
wording of the chunk it restates and misses a paraphrase that shares no words; a user who has
a sentence encoder installed names it instead: `--embedding MODULE:FN`, FN(list[str]) ->
array [n, d] (rows need not be normalised).
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from hindsight.errors import HindsightError

DEFAULT_THRESHOLD = 0.8
_WORD = re.compile(r"\w+")


def _features(text: str) -> collections.Counter:
  words = _WORD.findall(text.lower())
  grams: collections.Counter = collections.Counter(words)
  for w in words:
    padded = f" {w} "
    grams.update(padded[i : i + 3] for i in range(len(padded) - 2))
  return grams


def _cosine(a: collections.Counter, b: collections.Counter) -> float:
  if not a or not b:
    return 1.0 if not a and not b else 0.0
  small, large = (a, b) if len(a) <= len(b) else (b, a)
  dot = sum(v * large.get(k, 0) for k, v in small.items())
  norm = math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values()))
  return dot / norm


class Similarity:
  """cosines(text, others) -> float [n]: the similarity of each of `others` to `text`."""

  def __init__(self, spec: str = "lexical", threshold: float = DEFAULT_THRESHOLD):
    if not 0.0 < threshold <= 1.0:
      raise HindsightError(f"similarity must be in (0, 1], got {threshold}")
    self.spec, self.threshold = spec, threshold
    self._embed: Callable[[list[str]], np.ndarray] | None = None
    if spec != "lexical":
      from hindsight.plugins import import_function

      self._embed = import_function(spec, "--embedding")[1]

  def cosines(self, text: str, others: Sequence[str]) -> np.ndarray:
    if not others:
      return np.zeros((0,), np.float64)
    if self._embed is None:
      mine = _features(text)
      return np.array([_cosine(mine, _features(o)) for o in others])
    try:
      vectors = np.asarray(self._embed([text, *others]), np.float64)
    except Exception as e:  # user code: any failure is named, once
      raise HindsightError(f"embedding {self.spec} raised {type(e).__name__}: {e}") from None
    if vectors.ndim != 2 or vectors.shape[0] != len(others) + 1:
      raise HindsightError(
        f"embedding {self.spec}: expected an array [n, d] for n texts, got {vectors.shape}"
      )
    norms = np.linalg.norm(vectors, axis=1)
    norms = np.where(norms > 0, norms, 1.0)
    unit = vectors / norms[:, None]
    return unit[1:] @ unit[0]

  def same(self, text: str, others: Sequence[str]) -> np.ndarray:
    """bool [n]: each of `others` restates `text` (cosine >= the threshold)."""
    return self.cosines(text, others) >= self.threshold
