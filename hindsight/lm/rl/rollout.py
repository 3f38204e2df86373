"""The policy's completions, read as steps: sampling in process, the step each token belongs
to, and the verifier's outcome.

A completion is the token ids the policy drew after a prompt (its EOS included when it
stopped there). Its text is cut into steps by the text path's sentence rule
(`text.trace.chunk_text`, "".join(steps) == text), and each token belongs to the step that
holds its last character, so a token's whitespace before a word goes with the word's step and
the EOS with the last step:

    token_step[j] = min{ s : ends[s] > last_char(j) },   ends = cumsum(len(step_s))

The prefix x_t ("the prompt and steps 0 .. t-1") is the prompt's ids followed by the
completion's tokens with token_step < t: a branch continues the very tokens the policy drew,
never a re-encoding of their text.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from hindsight.lm import sample
from hindsight.text.trace import TextTrace, chunk_text

ROWS = sample.ROW_BUCKETS[-1]  # rows of one sampler call


@dataclasses.dataclass
class Completion:
  """One sampled completion. ids int32 [C]; token_step int32 [C] (the step of each token);
  steps: the step texts ("".join(steps) == text; one empty step when nothing was written)."""

  ids: np.ndarray
  text: str
  steps: list[str]
  token_step: np.ndarray
  eos: bool

  @property
  def num_steps(self) -> int:
    return len(self.steps)

  def prefix(self, t: int) -> np.ndarray:
    """The completion's tokens before step t (t = num_steps: all of them)."""
    return self.ids[self.token_step < t]


def split_steps(tokenizer, ids: np.ndarray, eos_ids) -> tuple[str, list[str], np.ndarray]:
  """(text, steps, token_step [C]) of completion `ids` (module docstring)."""
  ids = np.asarray(ids, np.int32)
  eos = np.isin(ids, np.asarray(eos_ids, np.int32))
  words = ids[~eos]
  text = tokenizer.decode(words.tolist())
  steps = chunk_text(text) if text.strip() else []
  if not steps:
    steps = [text]
  ends = np.cumsum([len(s) for s in steps])
  # Characters decoded through each token (a byte-level token may end mid-character, so the
  # running length is made monotone and capped at the text's).
  decoded = np.array([len(tokenizer.decode(words[: j + 1].tolist())) for j in range(len(words))])
  decoded = np.minimum(np.maximum.accumulate(decoded) if len(decoded) else decoded, len(text))
  word_step = np.searchsorted(ends, np.maximum(decoded - 1, 0), side="right")
  token_step = np.full(len(ids), len(steps) - 1, np.int32)  # EOS: the last step
  token_step[~eos] = np.minimum(word_step, len(steps) - 1)
  return text, steps, token_step


def read_completion(tokenizer, ids: np.ndarray, eos_ids) -> Completion:
  ids = np.asarray(ids, np.int32)
  text, steps, token_step = split_steps(tokenizer, ids, eos_ids)
  eos = bool(len(ids)) and bool(np.isin(ids[-1], np.asarray(eos_ids)))
  return Completion(ids, text, steps, token_step, eos)


class PolicySampler:
  """The policy's own sampler (`lm.sample.generate`) over any number of prompts: rows sorted
  by length into calls of `ROWS`, each row with its own key, so a completion depends on its
  prompt, budget and key only (not on what it was batched with, up to float rounding). Rows
  of one prompt in a call share its prefill (`sample.shared_prompts`): a pool of K
  continuations of a prefix prefills it once (`share_prefills=False`: every row its own,
  for comparison)."""

  def __init__(self, graphdef, cfg, temperature: float = 1.0, share_prefills: bool = True):
    self.cfg = cfg
    self.temperature = float(temperature)
    self.share_prefills = bool(share_prefills)
    self._generate = sample.sampler(graphdef, cfg)

  def complete(self, state, prompts: list[np.ndarray], budgets, keys) -> list[np.ndarray]:
    """Completions int32 [c_i] (EOS included when drawn) of `prompts` (ids each) within
    `budgets` tokens (ints), row i drawn with keys[i] (a typed key array [n])."""
    n = len(prompts)
    out: list[np.ndarray] = [np.zeros(0, np.int32)] * n
    order = sorted(range(n), key=lambda i: len(prompts[i]))
    for lo in range(0, n, ROWS):
      rows = order[lo : lo + ROWS]
      ids, lengths, src = sample.shared_prompts([prompts[i] for i in rows], self.cfg.max_len)
      if not self.share_prefills:
        ids, lengths, src = ids[src], lengths[src], None
      R = lengths.size if src is None else src.size
      pick = np.array(rows + [rows[0]] * (R - len(rows)))
      budget = np.array([budgets[i] for i in pick], np.int32)
      row_lengths = lengths if src is None else lengths[src]
      budget = np.minimum(budget, self.cfg.max_len - row_lengths).astype(np.int32)
      tokens, count, _ = self._generate(
        state, ids, lengths, budget, np.full(R, self.temperature, np.float32),
        np.ones(R, np.float32), keys[pick], None, src,
      )  # fmt: skip
      tokens, count = np.asarray(tokens), np.asarray(count)
      for r, i in enumerate(rows):
        out[i] = tokens[r, : count[r]].astype(np.int32)
    return out


@dataclasses.dataclass
class Prompt:
  """A prompt to complete: its trace (prompt text, id, reference for the verifier), its ids,
  and the text world's problem when it is one (None: a user's prompt)."""

  trace: TextTrace
  ids: np.ndarray
  problem: object = None


@dataclasses.dataclass
class Rollouts:
  """Completions of prompts: completions[i] continues prompts[i]; rewards float [n]."""

  prompts: list[Prompt]
  completions: list[Completion]
  rewards: np.ndarray
  cache: dict = dataclasses.field(default_factory=dict)  # what models read of it (features)

  @property
  def tokens(self) -> int:
    return int(sum(len(c.ids) for c in self.completions))


def rollout(sampler: PolicySampler, state, prompts: list[Prompt], max_tokens: int, key,
            tokenizer, verify) -> Rollouts:  # fmt: skip
  """One completion of each prompt (row i drawn with fold_in(key, i)), read and verified."""
  keys = jax.random.split(key, len(prompts))
  ids = sampler.complete(state, [p.ids for p in prompts], [max_tokens] * len(prompts), keys)
  eos = sampler.cfg.eos_ids
  completions = [read_completion(tokenizer, x, eos) for x in ids]
  rewards = np.array(
    [verify(c.text, p.trace) for p, c in zip(prompts, completions, strict=True)], np.float32
  )
  return Rollouts(prompts, completions, rewards)
