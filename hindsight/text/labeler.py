"""Labels text traces by resampling them through a completions endpoint.

`TextLabeler.label(start, stop)` labels traces start .. stop-1 of the job's JSONL file: it
samples a trace first where the file holds only its prompt, then draws K continuations from
every prefix (and the replace arm's draws), verifies every continuation, and reduces the
outcomes with `hindsight.text.estimate`. The estimands are those of docs/design.md read for
text (docs/text.md):

  policy            step t redrawn from the prefix before it, then continued
  policy_other      the same, keeping only draws whose new step is not a restatement of step
                    t (cosine < --similarity), up to --max-draws x K draws per step
  policy_no_repeat  policy_other, and no later step of the continuation restates step t
                    either (resilience: thought-anchors resample until the content does not
                    come back)
  null              step t replaced by --null-text, then continued
  uniform           has no meaning for text (no finite action set): refused

Every request's seed comes from a jax.random key folded from (seed, trace, arm, prefix), so
a deterministic server (vLLM's batch-invariant mode, the text world) gives the same labels
on every run; the completion cache makes a rerun free either way.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import msgspec
import numpy as np

from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.text.chat_log import from_messages
from hindsight.text.chat_template import load_chat_template
from hindsight.text.client import (
  Budget,
  ChatRoute,
  Completion,
  CompletionCache,
  CompletionClient,
  Draw,
  Sampling,
  api_key_from,
)
from hindsight.text.estimate import text_step_fields
from hindsight.text.options import TextOptions
from hindsight.text.similarity import Similarity
from hindsight.text.tool_syntax import HERMES, layout_from_template
from hindsight.text.trace import (
  TextStep,
  TextTrace,
  check_chunking,
  chunk_text,
  chunked,
  name_of,
  read_traces,
)
from hindsight.text.verify import load_verifier

TEXT_REPLACEMENTS = ("policy", "policy_other", "policy_no_repeat", "null")
ARM_BASE, ARM_POOL, ARM_NULL = 0, 1, 2


def check_text_replacement(replacement: str, options: TextOptions) -> None:
  if replacement not in TEXT_REPLACEMENTS:
    raise HindsightError(
      f"replacement '{replacement}' has no meaning for text traces (choose from "
      f"{', '.join(TEXT_REPLACEMENTS)})"
    )
  if replacement == "null" and not options.null_text.strip():
    raise HindsightError(
      "replacement 'null' on text needs --null-text (the step that replaces step t; deleting "
      "the step and continuing is the `policy` replacement)"
    )


def text_path(env: str) -> str:
  """FILE of `--env text:FILE.jsonl`."""
  path = env.partition(":")[2]
  if not path:
    raise HindsightError("env text needs a trace file: text:FILE.jsonl")
  return path


def prompt_name(trace: TextTrace, episode: int) -> str:
  """What a request sampling the trace from its prompt continues, for messages."""
  return f"trace {name_of(trace, episode)}'s prompt"


def step_name(trace: TextTrace, episode: int, t: int) -> str:
  """What a request from the prefix before step t continues, for messages."""
  return f"trace {name_of(trace, episode)}, step {t}"


@dataclasses.dataclass(frozen=True)
class Ask:
  """Samples lo .. hi-1 of the continuations of `prompt` under request seed `seed`; where:
  what it continues ("trace p3, step 7"), for messages; episode, t: the trace and the step
  whose prefix it continues (an agent trace's environment is forked there)."""

  prompt: str
  seed: int
  lo: int
  hi: int
  where: str
  episode: int = -1
  t: int = 0


def tag_of(step: TextStep) -> str:
  return "tool_call" if step.tool_call is not None else (step.role or "step")


@functools.cache
def _seed_program():
  def seeds(seed, episode, arm, prefixes):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), episode), arm)
    keys = jax.vmap(lambda j: jax.random.fold_in(key, j))(prefixes)
    return jax.vmap(lambda k: jax.random.bits(k, dtype=np.uint32))(keys)

  return jax.jit(seeds)


def request_seeds(seed: int, episode: int, arm: int, count: int) -> np.ndarray:
  """uint32 [count]: the seed of each prefix's requests, from a jax.random key."""
  out = _seed_program()(np.uint32(seed), np.int32(episode), np.int32(arm), np.arange(count))
  return np.asarray(out).astype(np.int64)


@dataclasses.dataclass
class Resamples:
  """One trace and the policy's continuations of its prefixes.

  trace: the trace with its steps; episode: its index; seeds [T]: of each prefix's requests;
  pools [T][K]: the completions continuing x_t (the prompt and steps 0 .. t-1); outcomes
  [T][K]: their verified outcomes; outcome: the trace's own; sampled: the trace itself was
  sampled from its prompt."""

  trace: TextTrace
  episode: int
  seeds: np.ndarray
  pools: list[list[Completion]]
  outcomes: list[np.ndarray]
  outcome: float
  sampled: bool


class TextLabeler:
  """See the module docstring. `open(cache_path)` before `label`."""

  def __init__(self, env: str, episodes: int, config: LabelConfig, options: TextOptions):
    self.path = text_path(env)
    check_text_replacement(config.replacement, options)
    check_chunking(options.chunking)
    if config.exact:
      raise HindsightError("exact needs a tabular MDP (text traces are labeled by resampling)")
    if not config.stratify:
      raise HindsightError("--unstratified has no meaning for text traces")
    self.config, self.options = config, options
    self.template = load_chat_template(options.chat_template) if options.chat_template else None
    self.layout = (layout_from_template(self.template, options.chat_template)
                   if self.template is not None else HERMES)  # fmt: skip
    traces = read_traces(self.path, limit=episodes)
    if len(traces) < episodes:
      raise HindsightError(f"episodes {episodes}: {self.path} holds {len(traces)} traces")
    # Each trace's prompt as messages (the chat route's head of every request): a `messages`
    # trace's own, else its prompt as one user message.
    self.heads: list[list[dict]] = []
    self.traces = []
    for e, trace in enumerate(traces):
      if trace.messages is not None:
        where = f"{self.path}: trace {name_of(trace, e)}"
        trace, head = from_messages(trace, where, self.layout, self.template)
      else:
        head = [{"role": "user", "content": trace.prompt}]
      self.traces.append(trace)
      self.heads.append(head)
    self.check_tools()
    self.verify = self.load_verify()
    self.similarity = Similarity(options.embedding, options.similarity)
    self.sampling = Sampling(options.temperature, options.top_p, options.max_tokens,
                             tuple(options.stop))  # fmt: skip
    roles = {tag_of(s) for t in self.traces for s in t.steps or ()}
    self.tag_names = ("step", *sorted(roles - {"step"}))
    self.client: CompletionClient | None = None

  def check_tools(self) -> None:
    """A trace that calls tools is refused (`agent_trace.refuse_tool_traces`): without --tools
    the model would write the tools' results itself."""
    from hindsight.text.agent_trace import refuse_tool_traces

    refuse_tool_traces(self.traces, self.path, self.layout)

  def load_verify(self):
    return load_verifier(self.options.verifier)

  def open(self, cache_path: str, bar=None) -> None:
    o = self.options
    self.client = CompletionClient(
      o.endpoint,
      o.model,
      self.sampling,
      CompletionCache(cache_path),
      api_key=api_key_from(o.api_key_env),
      concurrency=o.concurrency,
      retries=o.retries,
      timeout=o.timeout,
      budget=Budget(o.budget_completions, o.budget_tokens),
      bar=bar,
      chat=ChatRoute(self.heads, self.traces, self.layout) if o.api == "chat" else None,
    )

  # -- draws ------------------------------------------------------------------------------
  def _blocks(self, ask: Ask, cap: int | None) -> list[Draw]:
    """Draws of samples lo .. hi-1 in the fixed blocks of the request size: the first K in
    blocks of n from 0 (the last cut at K), later ones in blocks of n from K (the last cut
    at the most a step may draw, max_draws x K)."""
    K, n = self.config.num_rollouts, min(self.options.samples_per_request, self.config.num_rollouts)
    most = self.options.max_draws * K
    out = []
    for b in [*range(0, K, n), *range(K, ask.hi, n)]:
      size = min(n, K - b) if b < K else min(n, most - b)
      if b < ask.hi and b + size > ask.lo:
        out.append(Draw(ask.prompt, ask.seed, b, size, cap, ask.where, ask.episode))
    return out

  def caps(self, asks: list[Ask]) -> list[int | None]:
    """Each request's own max_tokens where its prompt leaves less of the model's context
    than --max-tokens (None: --max-tokens), from the endpoint's context and token counts
    (`CompletionClient.context`, `count_tokens`); none where it reports neither. A prompt
    that fills the context is a one-line error naming the trace and step."""
    rooms = self.rooms([a.prompt for a in asks])
    if rooms is None:
      return [None] * len(asks)
    out = []
    for ask, room in zip(asks, rooms, strict=True):
      if room < 1:
        context = self.client.context
        raise HindsightError(
          f"{ask.where}: the text before it is {context - room} tokens, which fills the "
          f"model's context of {context} (nothing is left to continue it): shorten the trace "
          "or serve the model with a longer context"
        )
      out.append(room if room < self.options.max_tokens else None)
    return out

  def rooms(self, prompts: list[str]) -> list[int] | None:
    """What each prompt leaves of the model's context, in tokens (`CompletionClient.context`
    minus `count_tokens`); None where the endpoint reports either not."""
    context = self.client.context
    counts = self.client.count_tokens(prompts) if context else None
    return None if counts is None else [context - n for n in counts]

  def check_context(self) -> None:
    """Before anything is spent: the longest prefix every trace of the file will be continued
    from (the prompt of a trace still to sample) must leave room in the model's context
    (`caps`: one line naming the first trace and step that does not)."""
    asks = []
    for e, trace in enumerate(self.traces):
      if trace.steps is None and trace.text is None:
        asks.append(Ask(trace.prompt, 0, 0, 1, prompt_name(trace, e)))
        continue
      trace = chunked(trace, self.options.chunking, str(e))
      last = len(trace.steps) - 1
      null = self.options.null_text if self.config.replacement == "null" else ""
      asks.append(Ask(trace.prefix(last) + null, 0, 0, 1, step_name(trace, e, last)))
    try:
      self.caps(asks)
    except HindsightError:  # name the first step whose prefix does not fit
      for e, trace in enumerate(self.traces):
        if trace.steps is not None or trace.text is not None:
          trace = chunked(trace, self.options.chunking, str(e))
          self.caps([Ask(trace.prefix(t), 0, 0, 1, step_name(trace, e, t))
                     for t in range(len(trace.steps))])  # fmt: skip
      raise

  def sample(self, asks: list[Ask]) -> list[list]:
    """Completions of every request: [len(asks)][hi - lo]."""
    draws, spans = [], []
    for ask, cap in zip(asks, self.caps(asks), strict=True):
      blocks = self._blocks(ask, cap)
      spans.append((len(draws), len(blocks), ask.lo, ask.hi))
      draws.extend(blocks)
    got = self.client.sample(draws)
    out = []
    for first, count, lo, hi in spans:
      flat = [c for i in range(first, first + count) for c in got[i]]
      base = draws[first].start
      out.append(flat[lo - base : hi - base])
    return out

  # -- labeling ---------------------------------------------------------------------------
  def with_steps(self, traces: list[TextTrace], episodes: range, seed: int) -> list[TextTrace]:
    """Each trace with its steps: its own, its text chunked, or sampled from its prompt (the
    sample's request seed from `seed`)."""
    out = list(traces)
    todo, _, first = self.sample_from_prompts(traces, episodes, seed)
    for i, (completion,) in zip(todo, first, strict=True):
      out[i] = msgspec.structs.replace(traces[i], text=completion.text)
    return [chunked(t, self.options.chunking, str(e)) for t, e in zip(out, episodes, strict=True)]

  def sample_from_prompts(self, traces: list[TextTrace], episodes: range, seed: int):
    """(the indices of the traces given as a prompt alone, their asks, each one's first
    completion [1]): sample 0 of the request seed of its ARM_BASE arm, as a block of n would
    start it."""
    todo = [i for i, t in enumerate(traces) if t.steps is None and t.text is None]
    asks = [Ask(traces[i].prompt, int(request_seeds(seed, episodes[i], ARM_BASE, 1)[0]), 0, 1,
                prompt_name(traces[i], episodes[i]), episodes[i]) for i in todo]  # fmt: skip
    if not asks:
      return todo, asks, []
    draws = [Draw(a.prompt, a.seed, 0, 1, cap, a.where, a.episode)
             for a, cap in zip(asks, self.caps(asks), strict=True)]  # fmt: skip
    return todo, asks, self.client.sample(draws)

  def trace_outcome(self, trace: TextTrace, episode: int) -> float:
    """The trace's own outcome R: the verifier's on what it wrote."""
    del episode
    return self.verify(trace.completion(), trace)

  def outcomes_of(self, trace: TextTrace, t: int, completions, inserted: str = "") -> np.ndarray:
    """Outcomes of continuations of the prefix with t steps (and `inserted` after it)."""
    written = "".join(s.text for s in trace.steps[:t]) + inserted
    return np.array([self.verify(written + c.text, trace) for c in completions], np.float64)

  def _restates(self, step: str, completion: str, anywhere: bool) -> bool:
    """The continuation's first step (or, `anywhere`, any of its steps) restates `step`."""
    chunks = [c.strip() for c in chunk_text(completion, self.options.chunking) if c.strip()]
    if not chunks:
      return False
    return bool(self.similarity.same(step.strip(), chunks if anywhere else chunks[:1]).any())

  def resamples(self, start: int, stop: int, seed: int) -> list[Resamples]:
    """The policy's continuations of every prefix of traces start .. stop-1 (the keep and
    phi arms, and the replace arm under `policy`), verified: what the labels reduce. Every
    request's seed comes from `seed` (module docstring)."""
    K = self.config.num_rollouts
    episodes = range(start, stop)
    sampled = [t.steps is None and t.text is None for t in self.traces[start:stop]]
    traces = self.with_steps(self.traces[start:stop], episodes, seed)
    seeds = [request_seeds(seed, e, ARM_POOL, len(t.steps)) for e, t in
             zip(episodes, traces, strict=True)]  # fmt: skip
    requests = [Ask(t.prefix(j), int(s[j]), 0, K, step_name(t, e, j), e, j)
                for t, s, e in zip(traces, seeds, episodes, strict=True)
                for j in range(len(t.steps))]  # fmt: skip
    got = iter(self.sample(requests))
    out = []
    for e, trace, s, was_sampled in zip(episodes, traces, seeds, sampled, strict=True):
      pools = [next(got) for _ in trace.steps]
      outcomes = [self.outcomes_of(trace, j, pool) for j, pool in enumerate(pools)]
      outcome = self.trace_outcome(trace, e)
      out.append(Resamples(trace, e, s, pools, outcomes, outcome, was_sampled))
    return out

  def label(self, start: int, stop: int, seed: int) -> list[dict]:
    """The label fields of traces start .. stop-1 of the job rooted at `seed`, one dict per
    trace."""
    K, q = self.config.num_rollouts, self.config.replacement
    found = self.resamples(start, stop, seed)
    if q == "null":
      null = self.options.null_text
      requests = [Ask(r.trace.prefix(j) + null, int(s), 0, K,
                      step_name(r.trace, r.episode, j) + " (its null replacement)", r.episode, j)
                  for r in found
                  for j, s in enumerate(request_seeds(seed, r.episode, ARM_NULL,
                                                      len(r.trace.steps)))]  # fmt: skip
      got = iter(self.sample(requests))
      extra = [[next(got) for _ in r.trace.steps] for r in found]
      replace = [[self.outcomes_of(r.trace, j, c, inserted=null) for j, c in enumerate(x)]
                 for r, x in zip(found, extra, strict=True)]  # fmt: skip
    elif q in ("policy_other", "policy_no_repeat"):
      accepted, extra = self._rejection_sample(found, anywhere=q == "policy_no_repeat")
      replace = [[self.outcomes_of(r.trace, j, c) for j, c in enumerate(a)]
                 for r, a in zip(found, accepted, strict=True)]  # fmt: skip
    else:
      replace = [r.outcomes for r in found]
      extra = [[] for _ in found]
    out = []
    for r, rep, more in zip(found, replace, extra, strict=True):
      keep = [*r.outcomes[1:], np.array([r.outcome])]
      fields = text_step_fields(keep, r.outcomes, rep, r.outcome,
                                tolerance=self.config.decorative_tolerance,
                                confidence=self.config.confidence)  # fmt: skip
      # What the labels cost: the pools, the replace arm's own draws, the trace if sampled.
      drawn = sum(map(len, r.pools)) + sum(map(len, more)) + r.sampled
      fields.update(self._trace_arrays(r.trace, r.episode, drawn))
      out.append(fields)
    return out

  def _rejection_sample(self, found: list[Resamples], anywhere: bool):
    """For every step, the first K draws from the prefix before it that do not restate it:
    the pool first, then further blocks from the same prefix (up to max_draws x K draws).
    Returns (the accepted completions [trace][t], the extra draws [trace][t])."""
    K, cap = self.config.num_rollouts, self.options.max_draws * self.config.num_rollouts
    n = min(self.options.samples_per_request, K)
    draws = [[list(p) for p in r.pools] for r in found]
    accepted = [[[] for _ in r.trace.steps] for r in found]
    checked = [[0] * len(r.trace.steps) for r in found]
    while True:
      for i, r in enumerate(found):
        for t, step in enumerate(r.trace.steps):
          for c in draws[i][t][checked[i][t] :]:
            if len(accepted[i][t]) < K and not self._restates(step.text, c.text, anywhere):
              accepted[i][t].append(c)
          checked[i][t] = len(draws[i][t])
      short = [(i, t) for i, r in enumerate(found) for t in range(len(r.trace.steps))
               if len(accepted[i][t]) < K and len(draws[i][t]) < cap]  # fmt: skip
      if not short:
        extra = [[d[K:] for d in per] for per in draws]
        return accepted, extra
      requests = []
      for i, t in short:
        lo, r = len(draws[i][t]), found[i]
        requests.append(Ask(r.trace.prefix(t), int(r.seeds[t]), lo, min(lo + n, cap),
                            step_name(r.trace, r.episode, t), r.episode, t))  # fmt: skip
      for (i, t), more in zip(short, self.sample(requests), strict=True):
        draws[i][t].extend(more)

  def _trace_arrays(self, trace: TextTrace, episode: int, drawn: int) -> dict:
    T = len(trace.steps)
    return {
      "episode": episode,
      "actions": np.full(T, -1, np.int32),
      "observations": (np.arange(T, dtype=np.float32) / T)[:, None],
      "tags": [self.tag_names.index(tag_of(s)) for s in trace.steps],
      "step_text": [s.text for s in trace.steps],
      "prompt": trace.prompt,
      "trace_id": name_of(trace, episode),
      "completions": drawn,
    }
