"""A text world with exact credit: `reasoning` (hindsight.envs.reasoning) written as sentences,
its scripted policy as the "language model".

A prompt states a problem (three boxes of apples; how many in all?) under a problem number.
The number fixes the agent's latent competence c (a hash of it, uniform on [0, 1)): the model
conditions on it, a reader of the trace does not see it, as in `reasoning`. Every step is one
sentence, chosen by `ReasoningPolicy` from the state the text so far implies:

  restate, verify, search       decorative sentences (nothing changes)
  fact i                        reads box i's count (the answer needs all three)
  write                         drafts the sum from the counts read so far, once, for good
  hypothesis / correction       a wrong idea (double counting) and its repair
  answer                        "So the answer, ..., is \\boxed{N}."; N is the sum with probability
                                0.9 (correct draft), 0.3 (correct draft under the wrong
                                idea), 0.05 (anything else), and off by one otherwise

The world has no hidden randomness beyond the text: facts are never forgotten (`reasoning`
with forget = 0) and the answer's correctness is written in the answer itself, so the state
after any prefix is a function of the prefix. That is what makes the credit exact
(`TextWorld.exact_credit`, dynamic programming over the 64 configurations x 20 times), and
what lets a server continue any prefix by parsing it back (`hindsight.worlds.server`).

The answer sentence is one content class whether it is right or wrong (the two renderings
differ in one number, and the lexical similarity calls them the same content), so
`policy_other` draws from pi restricted to the other classes, as the text labeler's rejection
of similar chunks does. The test suite checks that the similarity agrees with these classes
on every rendering.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re

import numpy as np

from hindsight.envs import reasoning as rz
from hindsight.errors import HindsightError
from hindsight.text.trace import chunk_text
from hindsight.text.verify import last_boxed, same_answer

MODEL_NAME = "hindsight-text-world"
HORIZON = 20
# Actions of the world: reasoning's 0..8, and its answer split by what it says.
ANSWER_RIGHT, ANSWER_WRONG = rz.ANSWER, rz.ANSWER + 1
NUM_ACTIONS = 11
CLASS_OF_ACTION = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9])
TAG_OF_ACTION = [*(rz.TAG_NAMES[i] for i in rz._TAG_OF_ACTION), "answer"]
FACT_SENTENCES = (
  "Reading the first label, box one holds {}.",
  "Next, box two is marked {}.",
  "Finally the last box says {}.",
)
_HEADER = re.compile(
  r"Problem (\d+): three boxes hold (\d+), (\d+) and (\d+) apples\. How many apples are there"
)
# What each sentence starts with: how a prefix is parsed back to actions.
_OPENINGS = (
  (rz.RESTATE, "Restating the task"),
  (rz.VERIFY, "Let me double-check"),
  (rz.SEARCH, "I could search"),
  (rz.FACT0, "Reading the first label"),
  (rz.FACT1, "Next, box two"),
  (rz.FACT2, "Finally the last box"),
  (rz.WRITE, "Drafting"),
  (rz.HYPOTHESIS, "Maybe some apples"),
  (rz.CORRECT, "No wait"),
  (ANSWER_RIGHT, "So the answer"),
)


@dataclasses.dataclass(frozen=True)
class Problem:
  number: int
  counts: tuple[int, int, int]

  @property
  def total(self) -> int:
    return sum(self.counts)

  @property
  def competence(self) -> float:
    """The latent c: uniform on [0, 1) over problem numbers (a hash of the number)."""
    digest = hashlib.sha256(f"hindsight-text-world:{self.number}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2.0**64

  def prompt(self) -> str:
    a, b, c = self.counts
    return (
      f"Problem {self.number}: three boxes hold {a}, {b} and {c} apples. How many apples are "
      "there in all? Reason step by step and end with the answer as \\boxed{N}.\n"
    )


def parse_problem(text: str) -> Problem | None:
  m = _HEADER.match(text)
  if m is None:
    return None
  return Problem(int(m.group(1)), (int(m.group(2)), int(m.group(3)), int(m.group(4))))


# A configuration: facts held (3 bits), drafted, draft correct, wrong idea: index
# facts | drafted << 3 | correct << 4 | wrong << 5.
NUM_CONFIGS = 64


def _config(facts: int, drafted: bool, correct: bool, wrong: bool) -> int:
  return facts | int(drafted) << 3 | int(correct) << 4 | int(wrong) << 5


def _unpack(cfg: int) -> tuple[int, bool, bool, bool]:
  return cfg & 7, bool(cfg >> 3 & 1), bool(cfg >> 4 & 1), bool(cfg >> 5 & 1)


def _next_config(cfg: int, action: int) -> int:
  """The configuration after `action` (answers end the episode: returned unchanged)."""
  facts, drafted, correct, wrong = _unpack(cfg)
  if rz.FACT0 <= action < rz.FACT0 + rz.NUM_FACTS:
    facts |= 1 << (action - rz.FACT0)
  elif action == rz.WRITE and not drafted:
    drafted, correct = True, facts == 7
  elif action == rz.HYPOTHESIS:
    wrong = True
  elif action == rz.CORRECT:
    wrong = False
  return _config(facts, drafted, correct, wrong)


NEXT_CONFIG = np.array([[_next_config(c, a) for a in range(NUM_ACTIONS)] for c in range(64)])
TERMINAL = np.zeros(NUM_ACTIONS, bool)
TERMINAL[[ANSWER_RIGHT, ANSWER_WRONG]] = True
REWARD = np.zeros(NUM_ACTIONS)
REWARD[ANSWER_RIGHT] = 1.0


@functools.lru_cache(maxsize=4096)
def policy_table(competence: float) -> np.ndarray:
  """pi(a | config) for the 11 actions, float64 [64, 11]: `ReasoningPolicy.probs` (one
  jitted call over the 64 configurations), its answer split by the chance it is right."""
  import jax.numpy as jnp

  program, params = _probs_program()
  probs = program(jnp.float32(competence))
  pi = np.asarray(probs, np.float64)
  pi /= pi.sum(1, keepdims=True)
  cfg = np.arange(NUM_CONFIGS)
  drafted, correct, wrong = cfg >> 3 & 1, cfg >> 4 & 1, cfg >> 5 & 1
  p_right = np.where(
    drafted & correct,
    np.where(wrong, float(params.p_wrong), float(params.p_correct)),
    float(params.p_else),
  )
  answer = pi[:, rz.ANSWER]
  return np.concatenate(
    [pi[:, : rz.ANSWER], (answer * p_right)[:, None], (answer * (1 - p_right))[:, None]], 1
  )


@functools.cache
def _probs_program():
  """(competence -> pi [64, 10] jitted, the environment's params): compiled once."""
  import jax
  import jax.numpy as jnp

  env, policy = rz.Reasoning(forget=0.0), rz.ReasoningPolicy()
  params = env.default_params()
  cfg = np.arange(NUM_CONFIGS)
  one = env.reset(jax.random.key(0), params)
  states = jax.tree.map(lambda x: jnp.broadcast_to(x, (NUM_CONFIGS, *x.shape)), one).replace(
    facts=jnp.asarray((cfg[:, None] >> np.arange(3)) & 1, bool),
    drafted=jnp.asarray(cfg >> 3 & 1, bool),
    draft_correct=jnp.asarray(cfg >> 4 & 1, bool),
    wrong=jnp.asarray(cfg >> 5 & 1, bool),
  )

  def probs(competence):
    batch = states.replace(competence=jnp.full((NUM_CONFIGS,), competence, jnp.float32))
    return jax.vmap(policy.probs, in_axes=(None, 0, None))(policy.default_params(), batch, params)

  return jax.jit(probs), params


def render(problem: Problem, cfg: int, action: int) -> str:
  """The sentence of `action` in configuration `cfg` (no surrounding whitespace)."""
  a, b, c = problem.counts
  if action == rz.RESTATE:
    return "Restating the task: we want the total number of apples in all three boxes."
  if action == rz.VERIFY:
    return "Let me double-check that everything so far is consistent."
  if action == rz.SEARCH:
    return "I could search for a similar worked example first."
  if rz.FACT0 <= action < rz.FACT0 + rz.NUM_FACTS:
    i = action - rz.FACT0
    return FACT_SENTENCES[i].format(problem.counts[i])
  if action == rz.WRITE:
    facts = _unpack(cfg)[0]
    terms = [str(n) if facts >> i & 1 else "?" for i, n in enumerate((a, b, c))]
    known = sum(n for i, n in enumerate((a, b, c)) if facts >> i & 1)
    return f"Drafting {' + '.join(terms)} = {known}."
  if action == rz.HYPOTHESIS:
    return "Maybe some apples sit in two boxes at once, so they count twice."
  if action == rz.CORRECT:
    return "No wait, the boxes are separate and nothing is counted twice."
  right = problem.total if action == ANSWER_RIGHT else problem.total - 1
  return f"So the answer, the total of the three boxes, is \\boxed{{{right}}}."


def parse_action(problem: Problem, sentence: str) -> int:
  """The action a sentence of the world renders (its opening; an answer by its number);
  anything the world does not know reads as a restatement (it changes nothing)."""
  s = sentence.strip()
  for action, opening in _OPENINGS:
    if s.startswith(opening):
      if action == ANSWER_RIGHT:
        return ANSWER_RIGHT if same_answer(last_boxed(s), str(problem.total)) else ANSWER_WRONG
      return action
  return rz.RESTATE


# The sentence classes of the world (`sentence_tag`), and the decorative ones: restatements,
# empty checks and unused searches change nothing the answer needs.
SENTENCE_TAGS = ("restate", "verify", "search", "fact", "write", "wrong_hypothesis",
                 "correction", "answer", "other")  # fmt: skip
DECORATIVE_TAGS = ("restate", "verify", "search")


def sentence_tag(problem: Problem, sentence: str) -> str:
  """The class of one sentence (`SENTENCE_TAGS`): by its opening, as `parse_action` reads
  it, but "other" for a sentence the world does not write (a model's own words)."""
  s = sentence.strip()
  for action, opening in _OPENINGS:
    if s.startswith(opening):
      tag = TAG_OF_ACTION[action]
      return "search" if tag == "search_unused" else tag
  return "other"


@dataclasses.dataclass
class WorldState:
  """What a prefix implies: the problem, the configuration, the time, whether it ended."""

  problem: Problem
  config: int
  time: int
  done: bool
  actions: list[int]


def parse_prefix(prompt: str, sentences: list[str] | None = None) -> WorldState:
  """The state after `prompt` (a problem header and, after it, the world's sentences, split
  by the thought-anchors rule) or after the header and the given `sentences`."""
  problem = parse_problem(prompt)
  if problem is None:
    raise HindsightError("not a text-world prompt: it must begin with the problem header")
  if sentences is None:
    rest = prompt[len(problem.prompt()) :] if prompt.startswith(problem.prompt()) else ""
    sentences = chunk_text(rest) if rest.strip() else []
  cfg, time, done, actions = 0, 0, False, []
  for sentence in sentences:
    if done:
      break
    action = parse_action(problem, sentence)
    actions.append(action)
    cfg = int(NEXT_CONFIG[cfg, action])
    time += 1
    done = bool(TERMINAL[action]) or time >= HORIZON
  return WorldState(problem, cfg, time, done, actions)


def sampling_probs(pi: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
  """pi [A] at a temperature and nucleus top_p, as a completions server samples tokens."""
  if temperature <= 0:
    out = np.zeros_like(pi)
    out[np.argmax(pi)] = 1.0
    return out
  logits = np.log(np.maximum(pi, 1e-300)) / temperature
  p = np.exp(logits - logits.max()) * (pi > 0)
  p /= p.sum()
  if top_p < 1.0:
    order = np.argsort(-p, kind="stable")
    keep = np.cumsum(p[order]) - p[order] < top_p
    mask = np.zeros_like(p, bool)
    mask[order[keep]] = True
    p = np.where(mask, p, 0.0)
    p /= p.sum()
  return p


def continue_prefix(
  state: WorldState, rng: np.random.Generator, temperature: float = 1.0, top_p: float = 1.0
) -> list[str]:
  """Sentences the policy writes from `state` to the end of the episode (possibly none)."""
  pi = policy_table(state.problem.competence)
  cfg, time, out = state.config, state.time, []
  done = state.done
  while not done:
    action = int(rng.choice(NUM_ACTIONS, p=sampling_probs(pi[cfg], temperature, top_p)))
    out.append(render(state.problem, cfg, action))
    cfg = int(NEXT_CONFIG[cfg, action])
    time += 1
    done = bool(TERMINAL[action]) or time >= HORIZON
  return out


COUNTS = (3, 60)  # box counts are drawn from [3, 60)


def problems(seed: int, count: int, counts: tuple[int, int] = COUNTS) -> list[Problem]:
  """`count` problems (numbers and box counts in [lo, hi) = `counts`) drawn from `seed` with a
  jax.random key."""
  import jax

  from hindsight.draws import distinct_integers

  key = jax.random.key(seed)
  numbers = distinct_integers(key, 10**6, count)  # jax.random.choice without replacement
  lo, hi = counts
  counts = np.asarray(jax.random.randint(jax.random.fold_in(key, 1), (count, 3), lo, hi))
  return [Problem(int(n), tuple(int(x) for x in c)) for n, c in zip(numbers, counts, strict=True)]


def prompt_traces(seed: int, count: int, counts: tuple[int, int] = COUNTS):
  """Prompt-only traces (the labeler samples each trace from the endpoint first)."""
  from hindsight.text.trace import TextTrace

  return [
    TextTrace(prompt=p.prompt(), id=f"problem_{p.number}", reference=str(p.total))
    for p in problems(seed, count, counts)
  ]


def sample_traces(seed: int, count: int, counts: tuple[int, int] = COUNTS):
  """Whole traces sampled by the world itself (no server), as the JSONL format holds them."""
  import jax

  from hindsight.text.trace import TextStep, TextTrace

  out = []
  for i, p in enumerate(problems(seed, count, counts)):
    rng = np.random.default_rng(np.asarray(jax.random.key_data(jax.random.key(seed + i))))
    state = parse_prefix(p.prompt(), [])
    sentences = continue_prefix(state, rng)
    steps = [TextStep(text=s + ("" if j == len(sentences) - 1 else " "))
             for j, s in enumerate(sentences)]  # fmt: skip
    out.append(TextTrace(prompt=p.prompt(), steps=steps, id=f"problem_{p.number}",
                         reference=str(p.total)))  # fmt: skip
  return out


@functools.lru_cache(maxsize=512)
def _value_tables(competence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(pi [X, A], V [H + 1, X], Q [H, X, A]) of the policy at `competence`, by backward
  induction (exact_credit's recursion; they depend on nothing else)."""
  pi = policy_table(competence)
  V = np.zeros((HORIZON + 1, NUM_CONFIGS))
  Q = np.zeros((HORIZON, NUM_CONFIGS, NUM_ACTIONS))
  for t in range(HORIZON - 1, -1, -1):
    Q[t] = REWARD[None] + np.where(TERMINAL[None], 0.0, V[t + 1][NEXT_CONFIG])
    V[t] = (pi * Q[t]).sum(1)
  return pi, V, Q


def observer_credit(
  problem: Problem, actions: list[int], replacement: str = "policy", grid: int = 128
) -> np.ndarray:
  """E[credit_t | the text] [T]: the exact credit a Bayes observer of the trace predicts,
  who does not know the competence c the problem number fixes. Over a grid of c (midpoints
  of `grid` cells of [0, 1), the prior), weights w(c) ~ prod_t pi_c(a_t | x_t) (the trace's
  own actions, its answer's correctness included), and credit_t = sum_c w(c) credit_t(c)."""
  cs = (np.arange(grid) + 0.5) / grid
  cfgs, cfg = [], 0
  for a in actions:
    cfgs.append(cfg)
    cfg = int(NEXT_CONFIG[cfg, a])
  log_w = np.array([
    np.sum(np.log(np.maximum(_value_tables(float(c))[0][cfgs, actions], 1e-300))) for c in cs
  ])  # fmt: skip
  w = np.exp(log_w - log_w.max())
  w /= w.sum()
  credits = np.stack([exact_credit(problem, actions, replacement, float(c))["credit"] for c in cs])
  return np.nansum(w[:, None] * credits, 0)


def exact_credit(
  problem: Problem, actions: list[int], replacement: str = "policy", competence: float | None = None
) -> dict[str, np.ndarray]:
  """Exact labels of one trace of the world by dynamic programming, [T] each.

  With V_t(x) = sum_a pi(a | x) Q_t(x, a), Q_t(x, a) = r(a) + [a not an answer] V_{t+1}(x'),
  V_H = 0, at the trace's configurations x_t and actions a_t:
    credit           Q_t(x_t, a_t) - E_{a' ~ q} Q_t(x_t, a')   (q: the replacement)
    credit_realized  G(tau) - E_{a' ~ q} Q_t(x_t, a')
    progress         Q_t(x_t, a_t) - V_t(x_t)
    phi              V_t(x_t), the policy's value before step t (what `progress` subtracts)
    undefined        q does not exist (policy_other / no_repeat: every action is a_t's class)
  policy_other: pi restricted to classes other than a_t's; null: the restatement;
  policy_no_repeat: E[G | the next action and every later one avoid a_t's class], the
  event the text labeler's rejection conditions on, from W = E[G 1{avoid}] and
  P = P(avoid) by the same recursion. `competence` replaces the problem's own (what a
  reader who does not know it would assume, `observer_credit`).
  """
  c = problem.competence if competence is None else competence
  pi, V, Q = _value_tables(float(c))
  T = len(actions)
  cfgs, cfg = [], 0
  for a in actions:
    cfgs.append(cfg)
    cfg = int(NEXT_CONFIG[cfg, a])
  G = float(REWARD[actions[-1]]) if actions else 0.0
  credit, realized, progress, phi = np.zeros(T), np.zeros(T), np.zeros(T), np.zeros(T)
  undefined = np.zeros(T, bool)
  for t, (x, a) in enumerate(zip(cfgs, actions, strict=True)):
    q_taken = Q[t, x, a]
    if replacement == "policy":
      rep = V[t, x]
    elif replacement == "null":
      rep = Q[t, x, rz.RESTATE]
    elif replacement == "policy_other":
      other = CLASS_OF_ACTION[a] != CLASS_OF_ACTION
      mass = pi[x, other].sum()
      undefined[t] = mass <= 0
      rep = (pi[x, other] * Q[t, x, other]).sum() / mass if mass > 0 else np.nan
    elif replacement == "policy_no_repeat":
      rep, ok = _avoiding_value(pi, CLASS_OF_ACTION[a], t, x)
      undefined[t] = not ok
    else:
      raise HindsightError(f"the text world has no replacement '{replacement}'")
    credit[t], realized[t] = q_taken - rep, G - rep
    progress[t], phi[t] = q_taken - V[t, x], V[t, x]
  credit[undefined] = np.nan
  realized[undefined] = np.nan
  return {"credit": credit, "credit_realized": realized, "progress": progress, "phi": phi,
          "undefined": undefined}  # fmt: skip


def _avoiding_value(pi, klass: int, t0: int, x0: int) -> tuple[float, bool]:
  """E[G | every action from t0 on avoids `klass`] from configuration x0, and whether that
  event has positive probability."""
  allowed = klass != CLASS_OF_ACTION
  W = np.zeros((HORIZON + 1, NUM_CONFIGS))
  P = np.ones((HORIZON + 1, NUM_CONFIGS))
  for t in range(HORIZON - 1, t0 - 1, -1):
    w_next = np.where(TERMINAL[None], REWARD[None], W[t + 1][NEXT_CONFIG])
    p_next = np.where(TERMINAL[None], 1.0, P[t + 1][NEXT_CONFIG])
    W[t] = (pi * allowed * w_next).sum(1)
    P[t] = (pi * allowed * p_next).sum(1)
  if P[t0, x0] <= 0:
    return float("nan"), False
  return float(W[t0, x0] / P[t0, x0]), True
