"""A tool world with exact credit: an agent that must fetch facts with tool calls, write a
ledger and submit it, its scripted policy as the "language model" (docs/agents-text.md).

A prompt names a task (three boxes of apples; their total is the answer) under a task number.
The number fixes the box counts (the environment's secret, read only by `lookup`) and the
agent's latent competence c (uniform on [0, 1)); a reader of the trace sees neither. Every
step of the agent is one sentence or one tool call (`tool_syntax`):

  restate                 a thought that changes nothing (decorative)
  sum                     "Adding the counts read so far (17 + 5) gives 22.": right only when
                          all three counts were read (load-bearing then)
  search(query), read()   calls whose results are never used (decorative)
  lookup(box)             reads a count: the answer needs all three (load-bearing), a count
                          read again changes nothing (decorative)
  write(value)            writes the last sum to the ledger (right iff that sum was)
  write(2 x value)        a write that corrupts the ledger ("apples may count twice"): harmful,
                          recovered when a later write puts the sum back
  submit()                irreversible: ends the episode, outcome 1 iff the ledger holds the total

The environment (`ToolWorldEnv`) executes the calls on a state of its own (the ledger); the
agent knows what the observations told it. The state after any prefix is a function of the
prefix, (facts read, the last sum's class, the ledger's class): 72 configurations x 12 steps,
which makes the credit exact by dynamic programming (`exact_credit`), and lets the server
(`worlds.server`, `create_app(tools=True)`) continue any prefix by parsing it back.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re

import numpy as np

from hindsight.agentic.tools import ToolEnv, ToolError
from hindsight.errors import HindsightError
from hindsight.text.tool_syntax import (
  ToolCall,
  call_from_json,
  pieces,
  render_call,
  render_result,
)
from hindsight.worlds.world import sampling_probs

MODEL_NAME = "hindsight-tool-world"
HORIZON = 12
RESTATE, SUM, SEARCH, READ, LOOKUP0, LOOKUP1, LOOKUP2, WRITE, WRITE_DOUBLE, SUBMIT = range(10)
NUM_ACTIONS = 10
IS_CALL = np.arange(NUM_ACTIONS) >= SEARCH
TAG_OF_ACTION = ("restate", "sum", "search", "read", "lookup", "lookup", "lookup", "write",
                 "write_double", "submit")  # fmt: skip
RESTATE_TEXT = "Restating the task: the answer is the total of the three boxes."
_SUM = re.compile(r"Adding the counts read so far \(([^)]*)\) gives (-?\d+)\.")
_HEADER = re.compile(r"Task (\d+): three boxes hold 1 to (\d+) apples each;")
_FACT = re.compile(r"box ([123]) holds (\d+) apples")
MOST = 59  # box counts are 1 .. MOST (the small LM's tasks: 1 .. 5, sums it can learn)

# A configuration: facts read (3 bits), the last sum and the ledger (0 none / empty, 1 right,
# 2 wrong): facts + 8 * sum + 24 * ledger.
NUM_CONFIGS = 72
NONE, RIGHT, WRONG = 0, 1, 2


def config(facts: int, summed: int, ledger: int) -> int:
  return facts + 8 * summed + 24 * ledger


def unpack(cfg: int) -> tuple[int, int, int]:
  return cfg % 8, cfg // 8 % 3, cfg // 24


def _digest(text: str) -> bytes:
  return hashlib.sha256(text.encode()).digest()


@dataclasses.dataclass(frozen=True)
class Task:
  """A task: its number and the most apples a box holds (the prompt states both)."""

  number: int
  most: int = MOST

  @property
  def counts(self) -> tuple[int, int, int]:
    """Three counts in 1 .. most, none the sum of the other two: then no doubled partial sum
    is the total, and the ledger is right exactly when the DP's configuration says so (a
    hash of the number, redrawn until that holds; 1, 1, 1 always does)."""
    for attempt in range(64):
      d = _digest(f"hindsight-tool-world:counts:{self.number}:{attempt}")
      counts = tuple(1 + int.from_bytes(d[4 * i : 4 * i + 4], "little") % self.most
                     for i in range(3))  # fmt: skip
      if all(2 * c != sum(counts) for c in counts):
        return counts
    return (1, 1, 1)

  @property
  def total(self) -> int:
    return sum(self.counts)

  @property
  def competence(self) -> float:
    """The latent c: uniform on [0, 1) over task numbers (a hash of the number)."""
    d = _digest(f"hindsight-tool-world:competence:{self.number}")
    return int.from_bytes(d[:8], "little") / 2.0**64

  def prompt(self) -> str:
    return (
      f"Task {self.number}: three boxes hold 1 to {self.most} apples each; the tool lookup(box) "
      "tells how many are in box 1, 2 or 3. Write their total to the ledger with write(value) "
      "and submit() it (read() shows the ledger, search(query) searches the notes). Call a "
      "tool by writing its name and arguments as JSON between tool_call tags.\n"
    )


def parse_task(text: str) -> Task | None:
  m = _HEADER.match(text)
  return Task(int(m.group(1)), int(m.group(2))) if m else None


def _next_config(cfg: int, action: int) -> int:
  facts, summed, ledger = unpack(cfg)
  if LOOKUP0 <= action <= LOOKUP2:
    facts |= 1 << (action - LOOKUP0)
  elif action == SUM:
    summed = RIGHT if facts == 7 else WRONG
  elif action == WRITE:
    ledger = RIGHT if summed == RIGHT else WRONG
  elif action == WRITE_DOUBLE:
    ledger = WRONG
  return config(facts, summed, ledger)


NEXT_CONFIG = np.array([[_next_config(x, a) for a in range(NUM_ACTIONS)]
                        for x in range(NUM_CONFIGS)])  # fmt: skip
TERMINAL = np.arange(NUM_ACTIONS) == SUBMIT
# The outcome of submitting in each configuration: 1 iff the ledger holds the total.
SUBMIT_REWARD = np.array([float(unpack(x)[2] == RIGHT) for x in range(NUM_CONFIGS)])


@functools.lru_cache(maxsize=4096)
def policy_table(competence: float) -> np.ndarray:
  """pi(a | config) of the scripted agent at competence c, float64 [72, 10]."""
  c = competence
  pi = np.zeros((NUM_CONFIGS, NUM_ACTIONS))
  for x in range(NUM_CONFIGS):
    facts, summed, ledger = unpack(x)
    w = np.zeros(NUM_ACTIONS)
    w[RESTATE] = 0.05 + 0.25 * (1 - c)
    w[SEARCH] = 0.02 + 0.25 * (1 - c)
    w[READ] = 0.03 + 0.05 * (ledger != NONE)
    for i in range(3):
      w[LOOKUP0 + i] = 0.03 if facts >> i & 1 else 0.9
    if facts == 7 and summed != RIGHT:
      w[SUM] = 1.2
    else:
      w[SUM] = 0.06 if summed == NONE else 0.02
    if summed == RIGHT and ledger != RIGHT:
      w[WRITE] = 1.2
    else:
      w[WRITE] = 0.1 if summed == WRONG and ledger == NONE else 0.02
    w[WRITE_DOUBLE] = (0.35 if ledger == RIGHT else 0.03) * (1 - c) + 0.01
    if ledger == RIGHT:
      w[SUBMIT] = 0.6 + 0.6 * c
    else:
      w[SUBMIT] = 0.02 + 0.08 * (1 - c) * (ledger == WRONG)
    pi[x] = w / w.sum()
  return pi


@functools.lru_cache(maxsize=512)
def value_tables(competence: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(pi [X, A], V [H + 1, X], Q [H, X, A]) by backward induction: Q_t(x, a) = r(x, a) if a
  ends the episode, else V_{t+1}(x'); V_t(x) = sum_a pi(a | x) Q_t(x, a); V_H = 0 (the
  horizon passed without a submit)."""
  pi = policy_table(competence)
  V = np.zeros((HORIZON + 1, NUM_CONFIGS))
  Q = np.zeros((HORIZON, NUM_CONFIGS, NUM_ACTIONS))
  for t in range(HORIZON - 1, -1, -1):
    Q[t] = np.where(TERMINAL[None], SUBMIT_REWARD[:, None], V[t + 1][NEXT_CONFIG])
    V[t] = (pi * Q[t]).sum(1)
  return pi, V, Q


# -- the agent's text --------------------------------------------------------------------------
@dataclasses.dataclass
class AgentState:
  """What a prefix implies: the task, the configuration, the time, the last sum written."""

  task: Task
  config: int = 0
  time: int = 0
  done: bool = False
  last_sum: int = 0
  actions: list = dataclasses.field(default_factory=list)

  def advance(self, action: int, value: int | None = None) -> None:
    if action == SUM and value is not None:
      self.last_sum = value
    self.config = int(NEXT_CONFIG[self.config, action])
    self.time += 1
    self.actions.append(action)
    self.done = bool(TERMINAL[action]) or self.time >= HORIZON


def known_sum(task: Task, facts: int) -> tuple[str, int]:
  terms = [n for i, n in enumerate(task.counts) if facts >> i & 1]
  return " + ".join(map(str, terms)) or "none", sum(terms)


def render(state: AgentState, action: int) -> tuple[str, int | None]:
  """(the agent's text of `action` from `state`, the sum it computes if any)."""
  if action == RESTATE:
    return RESTATE_TEXT, None
  if action == SUM:
    terms, value = known_sum(state.task, unpack(state.config)[0])
    return f"Adding the counts read so far ({terms}) gives {value}.", value
  if action == SEARCH:
    return render_call("search", {"query": "apples in boxes"}), None
  if action == READ:
    return render_call("read", {}), None
  if LOOKUP0 <= action <= LOOKUP2:
    return render_call("lookup", {"box": action - LOOKUP0 + 1}), None
  if action == WRITE:
    return render_call("write", {"value": state.last_sum}), None
  if action == WRITE_DOUBLE:
    return render_call("write", {"value": 2 * state.last_sum}), None
  return render_call("submit", {}), None


def _integer(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def action_of_call(state: AgentState, call: ToolCall) -> int:
  """The world's action a call is (an unknown or malformed call changes nothing: SEARCH)."""
  box = call.arguments.get("box")
  if call.name == "lookup" and _integer(box) and box in (1, 2, 3):
    return LOOKUP0 + box - 1
  if call.name == "write":
    value = call.arguments.get("value")
    if value == state.last_sum:
      return WRITE
    return WRITE_DOUBLE  # any other value leaves the ledger wrong
  return {"read": READ, "submit": SUBMIT}.get(call.name, SEARCH)


def action_of_thought(state: AgentState, text: str) -> tuple[int, int | None]:
  """(the world's action a thought is, its sum): anything but a sum changes nothing."""
  m = _SUM.search(text)
  if m:
    return SUM, int(m.group(2))
  return RESTATE, None


def parse_steps(task: Task, step_texts) -> AgentState:
  """The state after the agent's steps (each a thought, or a call and its result)."""
  state = AgentState(task)
  for text in step_texts:
    if state.done:
      break
    call = next((p for kind, p in pieces(text) if kind == "call"), None)
    if call is not None:
      parsed = call_from_json(call[len("<tool_call>") : -len("</tool_call>")])
      action = action_of_call(state, parsed) if isinstance(parsed, ToolCall) else SEARCH
      state.advance(action)
    else:
      state.advance(*action_of_thought(state, text))
  return state


def parse_prefix(prompt: str) -> AgentState:
  """The state after a prompt: the task header and the agent's text after it, cut into the
  agent's steps as the labels cut it (`agent.agent_steps`: thoughts by sentences, calls;
  the results between them are the environment's)."""
  from hindsight.text.agent_trace import agent_steps

  task = parse_task(prompt)
  if task is None:
    raise HindsightError("not a tool-world prompt: it must begin with the task header")
  rest = prompt[len(task.prompt()) :] if prompt.startswith(task.prompt()) else ""
  steps = [s.text for s in agent_steps(rest, "sentences", unit="chunks") if s.role != "tool"]
  return parse_steps(task, steps)


def continue_turn(
  state: AgentState, rng: np.random.Generator, temperature: float = 1.0, top_p: float = 1.0
) -> str:
  """The agent's next turn from `state` (advanced in place): thoughts up to and including
  its next call, or to the horizon; "" when the episode is over."""
  pi = policy_table(state.task.competence)
  out = ""
  while not state.done:
    action = int(rng.choice(NUM_ACTIONS, p=sampling_probs(pi[state.config], temperature, top_p)))
    text, value = render(state, action)
    state.advance(action, value)
    if IS_CALL[action]:
      return out + text
    out += text + " "
  return out


# -- the environment ---------------------------------------------------------------------------
@dataclasses.dataclass
class Ledger:
  """The environment's state: the counts, the ledger, what was submitted, the calls made."""

  counts: tuple
  ledger: int | None = None
  submitted: int | None = None
  calls: list = dataclasses.field(default_factory=list)


class ToolWorldEnv(ToolEnv):
  """The world's tools (module docstring), branched `branching` (functional by default: its
  state is a small dataclass; `replay` and `snapshot` give the same labels)."""

  # Its exact credit is per choice (a thought, a call): each its own agent step.
  agent_steps = "chunks"

  def __init__(self, branching: str = "functional"):
    self.branching = branching

  def reset(self, trace, seed: int) -> Ledger:
    del seed  # the world is deterministic: the task number fixes everything
    task = parse_task(trace.prompt)
    if task is None:
      raise HindsightError(f"trace {trace.id or '?'}: not a tool-world prompt")
    return Ledger(task.counts)

  def step(self, state: Ledger, call: ToolCall):
    state.calls.append(call.name)
    args = call.arguments
    if call.name == "lookup":
      box = args.get("box")
      if not _integer(box) or box not in (1, 2, 3):
        raise ToolError("lookup takes box 1, 2 or 3")
      return state, f"box {box} holds {state.counts[box - 1]} apples", False
    if call.name == "search":
      return state, "no notes match", False
    if call.name == "read":
      held = "is empty" if state.ledger is None else f"holds {state.ledger}"
      return state, f"the ledger {held}", False
    if call.name == "write":
      value = args.get("value")
      if not _integer(value):
        raise ToolError("write takes an integer value")
      state.ledger = value
      return state, f"the ledger now holds {value}", False
    if call.name == "submit":
      state.submitted = state.ledger
      return state, f"submitted {state.ledger}", True
    raise ToolError(f"no tool '{call.name}' (lookup, search, read, write, submit)")

  def snapshot(self, state: Ledger) -> str:
    return json.dumps(dataclasses.asdict(state))

  def restore(self, blob: str) -> Ledger:
    d = json.loads(blob)
    return Ledger(tuple(d["counts"]), d["ledger"], d["submitted"], d["calls"])

  def outcome(self, state: Ledger) -> float:
    return float(state.submitted is not None and state.submitted == sum(state.counts))


def replayed() -> ToolWorldEnv:
  """The tool world branched by replaying its (deterministic) tools (`--tools
  hindsight.worlds.tool_world:replayed`)."""
  return ToolWorldEnv("replay")


def snapshotted() -> ToolWorldEnv:
  """The tool world branched by snapshot and restore."""
  return ToolWorldEnv("snapshot")


# -- traces ------------------------------------------------------------------------------------
def tasks(seed: int, count: int, most: int = MOST) -> list[Task]:
  """`count` distinct task numbers drawn from `seed` with a jax.random key."""
  import jax

  if most < 1:
    raise HindsightError(f"the most apples a box holds must be >= 1, got {most}")
  from hindsight.draws import distinct_integers

  # jax.random.choice without replacement, bit for bit
  numbers = distinct_integers(jax.random.key(seed), 10**6, count)
  return [Task(int(n), most) for n in numbers]


def prompt_traces(seed: int, count: int, most: int = MOST):
  """Prompt-only traces (the labeler samples each from the endpoint, tools executed)."""
  from hindsight.text.trace import TextTrace

  return [TextTrace(prompt=t.prompt(), id=f"task_{t.number}", reference=str(t.total))
          for t in tasks(seed, count, most)]  # fmt: skip


def play(task: Task, rng: np.random.Generator):
  """One whole trace of the scripted agent with the environment (no server): its steps,
  the calls' results as steps of role `tool`, and its outcome."""
  from hindsight.text.trace import TextStep, TextTrace

  env, state = ToolWorldEnv(), AgentState(task)
  ledger = env.reset(TextTrace(prompt=task.prompt()), 0)
  steps: list[TextStep] = []
  while not state.done:
    turn = continue_turn(state, rng)
    for kind, piece in pieces(turn):
      if kind == "call":
        call = call_from_json(piece[len("<tool_call>") : -len("</tool_call>")])
        steps.append(TextStep(text=piece, tool_call={"name": call.name,
                                                     "arguments": call.arguments}))  # fmt: skip
        ledger, observation, _ = env.step(ledger, call)
        steps.append(TextStep(text=render_result(observation), role="tool"))
      else:
        from hindsight.text.trace import chunk_text

        steps.extend(TextStep(text=c) for c in chunk_text(piece) if c.strip())
  return TextTrace(prompt=task.prompt(), steps=steps, id=f"task_{task.number}",
                   reference=str(task.total), outcome=env.outcome(ledger))  # fmt: skip


def sample_traces(seed: int, count: int, most: int = MOST):
  """Whole traces of the scripted agent (`play`), one generator per task from `seed`."""
  import jax

  out = []
  for i, task in enumerate(tasks(seed, count, most)):
    key = jax.random.fold_in(jax.random.key(seed), i)
    out.append(play(task, np.random.default_rng(np.asarray(jax.random.key_data(key)))))
  return out


# -- exact credit ------------------------------------------------------------------------------
REPLACEMENTS = ("policy", "null")


def exact_credit(
  task: Task, actions: list[int], replacement: str = "policy", competence: float | None = None
) -> dict:
  """The exact label fields [T] of a trace of the world's actions (the agent's steps), with
  the competence the task number fixes: credit_t = Q_t(x_t, a_t) - E[Q_t(x_t, A')] for A' the
  replacement (policy: A' ~ pi(. | x_t), null: the restatement), progress_t = Q_t(x_t, a_t)
  - V_t(x_t), phi_t = V_t(x_t), credit_realized_t = G - E[Q_t(x_t, A')]."""
  if replacement not in REPLACEMENTS:
    raise HindsightError(
      f"the tool world's exact credit has no replacement '{replacement}' (choose from "
      f"{', '.join(REPLACEMENTS)})"
    )
  _, V, Q = value_tables(task.competence if competence is None else competence)
  T = len(actions)
  xs, x = [], 0
  for a in actions:
    xs.append(x)
    x = int(NEXT_CONFIG[x, a])
  G = float(SUBMIT_REWARD[xs[-1]]) if actions and actions[-1] == SUBMIT else 0.0
  out = {k: np.zeros(T) for k in ("credit", "credit_realized", "progress", "phi")}
  for t, (x, a) in enumerate(zip(xs, actions, strict=True)):
    rep = V[t, x] if replacement == "policy" else Q[t, x, RESTATE]
    out["credit"][t], out["credit_realized"][t] = Q[t, x, a] - rep, G - rep
    out["progress"][t], out["phi"][t] = Q[t, x, a] - V[t, x], V[t, x]
  out["undefined"] = np.zeros(T, bool)
  return out


def observer(task: Task, actions: list[int], replacement: str = "policy", grid: int = 128):
  """What a Bayes observer of the trace, who does not know the competence c, predicts:
  (E[credit_t | the whole trace] [T], P(success | the first t steps) [T + 1]). Over a grid
  of c (midpoints of `grid` cells of [0, 1), the prior), the weights after t steps are
  w_t(c) ~ prod_{s<t} pi_c(a_s | x_s); P(success | x_t) = sum_c w_t(c) V_t^c(x_t), and after
  the last step it is the outcome itself. Its increments are a progress reward model's
  step scores at their best (the essay's P(success | history))."""
  cs = (np.arange(grid) + 0.5) / grid
  xs, x = [], 0
  for a in actions:
    xs.append(x)
    x = int(NEXT_CONFIG[x, a])
  T = len(actions)
  log_pi = np.stack([np.log(np.maximum(value_tables(float(c))[0][xs, actions], 1e-300))
                     for c in cs])  # fmt: skip
  log_w = np.concatenate([np.zeros((grid, 1)), np.cumsum(log_pi, 1)], 1)  # [grid, T + 1]
  w = np.exp(log_w - log_w.max(0))
  w /= w.sum(0)
  values = np.stack([value_tables(float(c))[1][np.arange(T), xs] for c in cs])  # [grid, T]
  p_success = np.empty(T + 1)
  p_success[:T] = (w[:, :T] * values).sum(0)
  p_success[T] = float(SUBMIT_REWARD[xs[-1]]) if actions and actions[-1] == SUBMIT else 0.0
  credits = np.stack([exact_credit(task, actions, replacement, float(c))["credit"] for c in cs])
  return (w[:, T, None] * credits).sum(0), p_success


def exact_labels(prompt: str, step_texts, replacement: str) -> dict:
  """`exact_credit` of a labeled trace: its prompt and its agent steps' texts."""
  task = parse_task(prompt)
  if task is None:
    raise HindsightError("not a tool-world trace: a prompt lacks the task header")
  state = parse_steps(task, step_texts)
  if len(state.actions) != len(step_texts):
    raise HindsightError("a tool-world trace goes on after its submit or past the horizon")
  return exact_credit(task, state.actions, replacement)


def step_tags(prompt: str, step_texts) -> list[str]:
  """The world's name of each agent step's action (TAG_OF_ACTION)."""
  state = parse_steps(parse_task(prompt), step_texts)
  return [TAG_OF_ACTION[a] for a in state.actions]
