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

ROWS = sample.ROW_BUCKETS[-1]  # the engine's slots: rows sampled at once


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
  """The policy's own sampler over any number of prompts: the slot engine (`lm.engine`:
  continuous batching, each prompt prefilled once for every row that continues it, so a pool
  of K continuations of a prefix prefills it once) with no ASCII restriction (what is drawn
  is what the policy's log-probabilities score). Row i draws token j with fold_in(keys[i],
  j) as `lm.sample.generate` does, so a completion depends on its prompt, budget and key
  only, not on what it shared a call with (up to float rounding); each call starts from an
  empty engine (`SlotEngine.set_state`), so a call's schedule, and its rounding, depend on
  its rows alone. `by_length` is the engine's (False only for eval/bench_text.py's
  comparison of its two decodes)."""

  def __init__(self, graphdef, cfg, temperature: float = 1.0, slots: int = ROWS,
               by_length: bool = True):  # fmt: skip
    self.graphdef, self.cfg = graphdef, cfg
    self.temperature = float(temperature)
    self.slots = int(slots)
    self.by_length = bool(by_length)
    self._engine = None

  def engine(self, state):
    """The engine, sampling from `state` (built on first use)."""
    import types

    from hindsight.lm.engine import SlotEngine

    if self._engine is None:
      lm = types.SimpleNamespace(graphdef=self.graphdef, cfg=self.cfg, state=state,
                                 tokenizer=None, record={})  # fmt: skip
      self._engine = SlotEngine(lm, self.slots, ascii_only=False, by_length=self.by_length)
    else:
      self._engine.set_state(state)
    return self._engine

  def close(self) -> None:
    """Stops the engine's worker thread (a sampler left open keeps a thread and its KV cache
    for the life of the process); the next call builds a fresh engine."""
    if self._engine is not None:
      self._engine.close()
      self._engine = None

  def complete(self, state, prompts: list[np.ndarray], budgets, keys) -> list[np.ndarray]:
    """Completions int32 [c_i] (EOS included when drawn) of `prompts` (ids each) within
    `budgets` tokens (ints, cut to what the context leaves), row i drawn with keys[i] (a
    typed key array [n])."""
    from hindsight.lm.engine import Row

    S = self.cfg.max_len
    rows = [Row(np.asarray(p, np.int32), int(min(b, S - len(p))), self.temperature, 1.0,
                keys[i], keep_eos=True)
            for i, (p, b) in enumerate(zip(prompts, budgets, strict=True))]  # fmt: skip
    if not rows:
      return []
    return [tokens.astype(np.int32) for tokens, _ in self.engine(state).complete(rows)]


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
