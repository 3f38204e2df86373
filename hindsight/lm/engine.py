"""Continuous batching: a fixed set of R slots, each holding one choice being sampled, refilled
as soon as its choice ends, so the model always works on as many rows as there are waiting.

One worker thread runs the loop

  admit    waiting rows go into free slots, each started the cheapest way its prompt allows:
           fork    some slot holds the whole prompt (another choice of the same request, or
                   a choice of an earlier request still in the cache): that slot's cache row
                   and prompt logits are copied, nothing is computed;
           extend  some slot holds a prefix of at least `min_shared` tokens of it (the prefix
                   x_t of a trace when x_{t+1} arrives, a shared system prompt): that slot's
                   cache row is copied and only the rest of the prompt is run, at its own
                   positions, attending to the copied keys and values;
           prefill otherwise the whole prompt is run (one program per row bucket and prompt
                   bucket) and written into its slot's row of the KV cache [depth, R, S, K, H],
                   its next-token logits into `last` [R, V] and `prompt_logits` [R, V];
  decode   `chunk` one-token steps of every live slot, each attending over the window of its
           own length: w(p), the smallest of `decode_windows` (the prompt buckets, and from
           128 on the points halfway between them) that holds its position p through the call.
           The live slots are grouped by w(p) and each group is gathered into calls of a row
           bucket's width (1, 4, 16, 64 or all R; padding rows name slot R, read as done and
           written nowhere), which copy in and back only the group's first w positions, so
           a step reads sum over calls of (width x w) cache positions: a batch of short rows
           does not pay for a long one's window (with `by_length=False`, kept for the
           benchmark, every live slot attends over the furthest one's). Adjacent windows
           share a call, and a group is split over several, where a call's cost (a fixed
           part, a part per row and one per row and position read: `ROW_COST`, `CALL_COST`)
           says that is cheaper. One program per (window, width);
  finish   slots whose choice hit EOS, its budget or one of its stop strings hand back
           (tokens, why it ended) and free their slot for the next admit. Stop strings are
           matched on the host after each decode call, on the text the choice has written:
           its tokens are cut after the one that completes the stop string (what it is billed
           for), and the slot is released on the device at once (before the row's `done`
           is called), so the next call decodes nothing more for it.

What each slot's cache holds (`held`, `held_ids`): a slot's cache positions below its
prompt's length keep that prompt's keys and values while its choice decodes and after it
ends, until the slot is admitted again, so the table never outlives what it points to (an
overwritten prompt is computed anew, never read stale), and it is bounded by the slots: the
prefix cache is the slots' own rows, evicted lowest free slot first. Within one admit, a row
may extend a row admitted before it (x_{t+1} from x_t, both new): extends run in waves after
the prefills, each reading only rows written before it. `stats` counts the prompt tokens
computed (`prefill_tokens`) and those read from a held cache row (`reused_tokens`).

Token i of a choice is drawn with fold_in(its key, i) exactly as `sample.generate` draws it,
so a choice is the same whatever it was batched with and whenever it was admitted (up to the
float rounding of batched matmuls). Everything lives on the first local device.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import deque
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.errors import HindsightError
from hindsight.lm.backbone import empty_cache, forward
from hindsight.lm.config import BackboneConfig
from hindsight.lm.sample import ROW_BUCKETS, ascii_bias, decode_step, prompt_buckets

CHUNK = 8  # tokens per decode call: host round trips against slots idle after their end
# The shortest held prefix a prompt extends rather than being prefilled whole: below it the
# copy of a cache row costs about what the prefix's prefill does.
MIN_SHARED = 16
# What a decode call costs, in cache positions read per step (`SlotEngine._plan`): a row
# attends over the call's window and does about ROW_COST positions' worth of other work (its
# projections, MLP and draw); the call costs CALL_COST more (its launch, its loop's start,
# the host's round trip). Fitted to 8-step calls of the small LM (width 128, depth 2) on 2
# CPU cores: about 1.4 ms a call, 0.11 ms a row and 1.4 us a row's cache position.
ROW_COST, CALL_COST = 80, 1000


# Why a choice ended: the model's end-of-sequence token, a stop string, the token budget.
EOS, STOP, LENGTH = "eos", "stop", "length"


@dataclasses.dataclass
class Row:
  """One choice to sample: prompt ids, token budget, sampling settings, key, stop strings,
  and `done`, called with (token ids, EOS | STOP | LENGTH) from the worker thread ((None,
  "error") if the model failed). The tokens never hold the EOS; after a stop string they
  end with the token that completed it (the text is cut before it by the caller)."""

  ids: np.ndarray
  budget: int
  temperature: float
  top_p: float
  key: jax.Array
  done: Callable[[np.ndarray, str], None] | None = None
  stop: tuple[str, ...] = ()
  keep_eos: bool = False  # the tokens end with the EOS drawn (what a policy's log-prob reads)


def _start_rows(rows, slots, last, lengths, new):
  """rows with slots [r] starting a choice: next-token logits `last` [r, V], position
  `lengths` [r], nothing drawn, and their settings `new` (budget, temperature, top_p, keys)."""
  at = lambda name, value: rows[name].at[slots].set(value)  # noqa: E731
  return rows | {
    "last": at("last", last),
    "pos": at("pos", lengths),
    "count": at("count", 0),
    "done": at("done", new["budget"] <= 0),
    "eos": at("eos", False),
    **{name: at(name, new[name]) for name in ("budget", "temperature", "top_p", "keys")},
  }


def _prefill(graphdef, cfg: BackboneConfig, state, cache, rows, prompt_logits, slots, ids,
             lengths, new, bias):  # fmt: skip
  """Writes prompts ids [r, P] (lengths [r]) into cache rows `slots` [r], their next-token
  logits into rows["last"] and prompt_logits [R, V], and their settings `new` (budget,
  temperature, top_p, keys [r]) into the slots' rows: one program per (r, P), so admitting
  rows compiles nothing new."""
  model = nnx.merge(graphdef, state)
  r = ids.shape[0]
  logits, (k, v) = forward(model, cfg, ids, cache=empty_cache(cfg, r, cache[0].dtype))
  cache = (cache[0].at[:, slots].set(k), cache[1].at[:, slots].set(v))
  last = logits[jnp.arange(r), lengths - 1] + bias
  return cache, _start_rows(rows, slots, last, lengths, new), prompt_logits.at[slots].set(last)


def _extend(graphdef, cfg: BackboneConfig, state, cache, rows, prompt_logits, src, dst, ids,
            starts, lengths, new, bias):  # fmt: skip
  """Slots dst [r] start choices of prompts whose first starts [r] tokens slots src [r] hold:
  the src cache rows are copied and the rest of each prompt, ids [r, P] (right-padded: token
  j at position starts + j, lengths [r] the whole prompts'), is run against them. Reads every
  src row before writing any dst row, so a row may extend its own slot's old prompt. One
  program per (r, P)."""
  model = nnx.merge(graphdef, state)
  r, P = ids.shape
  positions = starts[:, None] + jnp.arange(P)
  own = (cache[0][:, src], cache[1][:, src])
  logits, (k, v) = forward(model, cfg, ids, positions, cache=own)
  cache = (cache[0].at[:, dst].set(k), cache[1].at[:, dst].set(v))
  last = logits[jnp.arange(r), lengths - starts - 1] + bias
  return cache, _start_rows(rows, dst, last, lengths, new), prompt_logits.at[dst].set(last)


def _fork(cache, rows, prompt_logits, src, dst, lengths, new):
  """Slots dst [r] start choices of the prompts slots src [r] hold: their cache rows and
  prompt logits copied (every position: those past the prompt are masked until the choice
  writes them), their own settings `new`. One program per r."""
  cache = tuple(c.at[:, dst].set(c[:, src]) for c in cache)
  last = prompt_logits[src]
  return cache, _start_rows(rows, dst, last, lengths, new), prompt_logits.at[dst].set(last)


def _decode(
  graphdef, cfg: BackboneConfig, steps: int, window: int, width: int, state, cache, rows, bias,
  slots=None,
):  # fmt: skip
  """Up to `steps` tokens of every live slot of a call of `width` rows, attending over the
  first `window` cache positions. rows: last [R, V], pos, count, budget int [R], done, eos
  bool [R], temperature, top_p [R], keys [R]. Returns (cache, rows, tokens int [width, steps],
  -1 where a row drew nothing).

  slots None: the call's rows are the first `width` slots, cache rows whole (the rest are
  left as they are: free slots cost nothing). slots int [width]: the call's rows are those
  slots (R where the call is padded: such a row draws nothing and is written nowhere); their
  first `window` positions are copied in (`window` >= every live row's position after the
  call) and only the `steps` positions from each row's position at the start are copied
  back, all the call can have written."""
  model = nnx.merge(graphdef, state)
  if slots is None:
    own = {name: x[:width] for name, x in rows.items()}
    own_cache = (cache[0][:, :width], cache[1][:, :width])
  else:
    R = rows["done"].shape[0]
    pad = slots >= R
    at = jnp.minimum(slots, R - 1)  # a padded row reads a real slot's row and is dropped
    own = {name: x[at] for name, x in rows.items()}
    # Done, and at top_p 1 (a stale nucleus there would make every row's draw take the sort).
    own["done"] = own["done"] | pad
    own["top_p"] = jnp.where(pad, 1.0, own["top_p"])
    own_cache = (cache[0][:, at, :window], cache[1][:, at, :window])
    # Where each row's writes start, moved back to fit the window (a row done or padded may
    # sit past it: it writes nothing the copy back does not already hold).
    n = min(steps, window)
    start = jnp.clip(own["pos"], 0, window - n)

  def body(carry):
    i, c, r, out = carry
    c, r, token, live = decode_step(model, cfg, c, r, bias, window)
    return i + 1, c, r, out.at[:, i].set(jnp.where(live, token, -1))

  def cond(carry):
    i, _, r, _ = carry
    return (i < steps) & ~jnp.all(r["done"])

  out = jnp.full((width, steps), -1, jnp.int32)
  _, own_cache, own, out = jax.lax.while_loop(cond, body, (0, own_cache, own, out))
  if slots is None:
    cache = tuple(full.at[:, :width].set(part) for full, part in zip(cache, own_cache, strict=True))
    rows = {name: rows[name].at[:width].set(own[name]) for name in rows}
  else:  # slots R are out of range: "drop" writes nothing for them
    written = start[:, None] + jnp.arange(n)  # [width, n]
    ids = jnp.arange(width)[:, None]
    cache = tuple(full.at[:, slots[:, None], written].set(part[:, ids, written], mode="drop")
                  for full, part in zip(cache, own_cache, strict=True))  # fmt: skip
    rows = {name: rows[name].at[slots].set(own[name], mode="drop") for name in rows}
  return cache, rows, out


@functools.cache
def _programs(graphdef, cfg: BackboneConfig):
  """(prefill, extend) jitted for one architecture: shared by its engines."""
  prefill = jax.jit(functools.partial(_prefill, graphdef, cfg), donate_argnums=(1, 2, 3))
  extend = jax.jit(functools.partial(_extend, graphdef, cfg), donate_argnums=(1, 2, 3))
  return prefill, extend


# The programs that do not depend on the architecture, shared by every engine: the fork, and
# the release, which marks slots done on the device (a choice that met a stop string).
_FORK = jax.jit(_fork, donate_argnums=(0, 1, 2))
_RELEASE = jax.jit(lambda rows, mask: rows | {"done": rows["done"] | mask}, donate_argnums=0)


@functools.cache
def _decoder(graphdef, cfg: BackboneConfig, chunk: int, window: int, width: int):
  """The decode program of `chunk` steps over `window` positions and `width` rows, jitted once
  per architecture and shared by its engines."""
  fn = functools.partial(_decode, graphdef, cfg, chunk, window, width)
  return jax.jit(fn, donate_argnums=(1, 2))


def decode_windows(max_len: int) -> tuple[int, ...]:
  """The windows a decode call by length attends over: the prompt buckets (`prompt_buckets`)
  and, from 128 on, the point halfway between two of them (192 between 128 and 256, 384
  between 256 and 512), so a row reads at most half as many positions again as it holds,
  not twice as many, for one more program per row bucket an octave. Below 128 a row's other
  work (`ROW_COST`) outweighs what a finer window would save."""
  buckets = prompt_buckets(max_len)
  out = []
  for bucket, above in zip(buckets, (*buckets[1:], max_len), strict=True):
    out.append(bucket)
    if bucket >= 128 and bucket + bucket // 2 < above:
      out.append(bucket + bucket // 2)
  return tuple(out)


def failed(results: list) -> None:
  """A one-line error if the model failed on any row of `submit_all`'s results."""
  if any(tokens is None for tokens, _ in results):
    raise HindsightError("the language model failed while sampling (see the log)")


class SlotEngine:
  """The slots and their worker (module docstring). `submit(rows)` queues rows; each row's
  `done` is called when it ends. `stats` counts decode calls (and, in `decode_windows`, how
  many attended over each window), prefills, extends and forks (program calls), prompt tokens
  computed and reused, choices stopped by a stop string, and the most slots ever live at once
  (never above `slots`)."""

  def __init__(self, lm, slots: int = 64, chunk: int = CHUNK, ascii_only: bool | None = None,
               min_shared: int = MIN_SHARED, by_length: bool = True):  # fmt: skip
    """lm: a LoadedLM (graphdef, cfg, state, tokenizer, record); ascii_only: restrict draws
    to ASCII tokens (`sample.ascii_bias`; default: what the model's record says);
    min_shared: the shortest held prefix a prompt extends (`MIN_SHARED`; at most half the
    smallest prompt bucket); by_length: each live slot attends over the window of its own
    position (module docstring). by_length=False decodes a prefix of the slots over the
    furthest live position's window, the scheme it replaced: it is kept only so that
    eval/bench_text.py can hold the two against each other in one run (the same tokens)."""
    self.lm, self.cfg = lm, lm.cfg
    self.by_length = bool(by_length)
    # The windows a decode call attends over: `decode_windows` by length, else the prompt
    # buckets (read for every live slot at every step: `_window`).
    S = lm.cfg.max_len
    self._windows = decode_windows(S) if self.by_length else prompt_buckets(S)
    # One device: the slots' arrays split over several CPU devices made every call that
    # reads a prefix of them move the cache between devices (27 against 111 completions/s at
    # one request of n = 16 on 2 cores, eval/bench_text.py part 6).
    device = jax.local_devices()[0]
    self.slots, self.chunk = int(slots), int(chunk)
    # At most half the smallest prompt bucket: warmup extends such a prefix by that bucket.
    self.min_shared = min(max(1, int(min_shared)), prompt_buckets(lm.cfg.max_len)[0] // 2)
    self.device = device
    self.state = jax.device_put(lm.state, device)
    ascii_only = lm.record.get("ascii") if ascii_only is None else ascii_only
    bias = ascii_bias(lm.tokenizer, self.cfg) if ascii_only else None
    self.bias = jnp.zeros(self.cfg.vocab_size) if bias is None else jnp.asarray(bias)
    # The programs are shared by every engine of one architecture in this process (jitted once
    # per (graphdef, cfg), `_programs`): an RL run builds an engine per seed, and each would
    # otherwise compile every program again.
    self._prefill, self._extend = _programs(lm.graphdef, self.cfg)
    self._fork, self._release = _FORK, _RELEASE
    self._decode = {}  # (window, width) -> the shared program, for those this engine ran
    self.tokenizer = lm.tokenizer
    R = self.slots
    self.cache = jax.device_put(empty_cache(self.cfg, R), device)
    self.rows = jax.device_put({
      "last": jnp.zeros((R, self.cfg.vocab_size)),
      "pos": jnp.zeros(R, jnp.int32),
      "count": jnp.zeros(R, jnp.int32),
      "budget": jnp.zeros(R, jnp.int32),
      "done": jnp.ones(R, bool),
      "eos": jnp.zeros(R, bool),
      "temperature": jnp.ones(R, jnp.float32),
      "top_p": jnp.ones(R, jnp.float32),
      "keys": jax.random.split(jax.random.key(0), R),
    }, device)  # fmt: skip
    # Each slot's prompt's next-token logits (what a fork of it starts from: `last` moves on).
    self.prompt_logits = jax.device_put(jnp.zeros((R, self.cfg.vocab_size)), device)
    # Prompt (its ids' bytes) -> the slots whose cache holds it (module docstring), and back;
    # each slot's prompt ids (-1 past its length) for the longest held prefix of a new prompt.
    self.held: dict[bytes, set[int]] = {}
    self.slot_prompt: list[bytes | None] = [None] * R
    self.held_ids = np.full((R, self.cfg.max_len), -1, np.int32)
    self.owner: list[Row | None] = [None] * R  # the row each slot holds
    self.tokens: list[list[int]] = [[] for _ in range(R)]
    self.pos = np.zeros(R, np.int64)  # host copy: each slot's next position
    self.waiting: deque[Row] = deque()
    self.wake = threading.Condition()
    self.stats = {"decode_calls": 0, "prefills": 0, "extends": 0, "forks": 0, "max_live": 0,
                  "stopped": 0, "prefill_tokens": 0, "reused_tokens": 0,
                  "decode_windows": {}}  # fmt: skip
    self._costs: dict[tuple[int, int], tuple[int, list[int]]] = {}  # `_split`'s answers
    self._thread: threading.Thread | None = None
    self._stop = False

  # -- the host side ------------------------------------------------------------------------
  def submit(self, rows: list[Row]) -> None:
    """Queues `rows` (a prompt longer than the context is a one-line error here, in the
    caller's thread)."""
    S = self.cfg.max_len
    for row in rows:
      if not 1 <= row.ids.size <= S:
        raise HindsightError(f"a prompt of {row.ids.size} tokens; the model's context is {S}")
    with self.wake:
      self.waiting.extend(rows)
      if self._thread is None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="lm-engine")
        self._thread.start()
      self.wake.notify()

  def submit_all(self, rows: list[Row], finished: Callable[[list], None]) -> None:
    """Queues `rows` (their own `done` replaced) and calls `finished` once, on the worker
    thread, with every row's (token ids, why it ended) in order when the last has ended
    ((None, "error") for a row the model failed on)."""
    out: list = [None] * len(rows)
    left = [len(rows)]
    lock = threading.Lock()

    def done_at(i):
      def done(tokens, reason):
        out[i] = (tokens, reason)
        with lock:
          left[0] -= 1
          last = left[0] == 0
        if last:
          finished(out)

      return done

    self.submit([dataclasses.replace(r, done=done_at(i)) for i, r in enumerate(rows)])

  def complete(self, rows: list[Row]) -> list[tuple[np.ndarray, str]]:
    """(token ids, why it ended) of every row, in order, blocking until all have ended."""
    got: list = []
    ended = threading.Event()
    self.submit_all(rows, lambda out: (got.append(out), ended.set()))
    ended.wait()
    failed(got[0])
    return got[0]

  def set_state(self, state) -> None:
    """Samples from the parameters `state` from now on (the engine must be idle). No slot's
    cache is reused after it: every prompt is prefilled again under the new parameters."""
    with self.wake:
      if self.waiting or any(o is not None for o in self.owner):
        raise RuntimeError("set_state on a busy engine")
      self.state = jax.device_put(state, self.device)
      self._forget_all()

  def close(self) -> None:
    """Stops the worker and waits for it to return (rows still queued or live are not
    ended): the process may exit at once after."""
    with self.wake:
      self._stop = True
      self.wake.notify()
      worker = self._thread
    # A worker left running at the interpreter's exit is unwound inside whatever device call
    # it is in, which aborts the process.
    if worker is not None and worker is not threading.current_thread():
      worker.join()

  def program_count(self) -> int:
    """How many programs `warmup` compiles."""
    buckets = len(prompt_buckets(self.cfg.max_len))
    row_buckets = len([r for r in ROW_BUCKETS if r <= self.slots])
    decodes = len(self.windows()) * len(self.widths())
    return buckets * 2 * row_buckets + row_buckets + decodes

  def warmup(self) -> int:
    """Compiles every prefill and extend (row bucket x prompt bucket), fork (row bucket) and
    decode (`windows` x `widths`) program: one token of prompts of each shape, then each decode
    program on idle slots (every row done: it draws nothing). Returns how many programs."""
    count = 0
    S = self.cfg.max_len
    for rows in [r for r in ROW_BUCKETS if r <= self.slots]:
      for p in prompt_buckets(S):
        with self.wake:  # the worker is idle: no slot holds anything, so ...
          self._forget_all()
        # ... distinct prompts are each prefilled (one shared prompt would be forked) ...
        prompts = [np.full(min(p, S - 1), 2 + j, np.int32) for j in range(rows)]
        self.complete([Row(ids, 1, 1.0, 1.0, jax.random.key(0)) for ids in prompts])
        # ... then each extended in place by a suffix of the same bucket.
        start = self.min_shared
        longer = [np.concatenate([x[:start], np.full(min(p, S - 1 - start), 3 + j, np.int32)])
                  for j, x in enumerate(prompts)]  # fmt: skip
        self.complete([Row(ids, 1, 1.0, 1.0, jax.random.key(0)) for ids in longer])
        count += 2
      # A prompt no slot holds, rows + 1 times: one prefill, then `rows` forks of it.
      ids = np.full(7, 1, np.int32)
      ids[-1] = (rows + 3) % self.cfg.vocab_size
      self.complete([Row(ids, 1, 1.0, 1.0, jax.random.key(0)) for _ in range(rows + 1)])
      count += 1
    with self.wake:  # the worker is idle (every row above has ended): its state is ours
      for window in self.windows():
        for width in self.widths():
          program = self._decoder(window, width)
          # By length: a call of padding only (slot R everywhere), which draws nothing.
          slots = (np.full(width, self.slots, np.int32),) if self.by_length else ()
          self.cache, self.rows, _ = program(self.state, self.cache, self.rows, self.bias,
                                             *slots)  # fmt: skip
          count += 1
    return count

  # -- the worker ---------------------------------------------------------------------------
  def _loop(self):
    while True:
      with self.wake:
        while not self._stop and not self.waiting and all(o is None for o in self.owner):
          self.wake.wait()
        if self._stop:
          return
        admitted = self._take_waiting()
      try:
        self._admit(admitted)
        self._step()
      except Exception:  # a failed program ends every row, held or waiting, with an error
        with self.wake:
          self._thread = None  # the next submit starts a fresh worker
          waiting, self.waiting = list(self.waiting), deque()
          # What the failed program left in the cache is unknown: no slot is reused.
          self._forget_all()
        held = [row for row in self.owner if row is not None]
        self.owner = [None] * self.slots
        for row in held + waiting:
          row.done(None, "error")
        raise

  def _take_waiting(self) -> list[tuple[int, Row]]:
    """Waiting rows into free slots: a free slot whose cache holds the row's prompt if there
    is one (nothing to prefill or copy), else one that holds a prefix of it (extended in
    place, nothing evicted), else the lowest free slot (live rows stay in a short prefix of
    the slots)."""
    free = [s for s, o in enumerate(self.owner) if o is None]
    held_len = (self.held_ids >= 0).sum(1)
    out = []
    while free and self.waiting:
      row = self.waiting.popleft()
      key = row.ids.astype(np.int32).tobytes()
      slot = next((s for s in free if self.slot_prompt[s] == key), None)
      if slot is None:
        shared = self._shared(row.ids)
        within = [s for s in free if self.min_shared <= shared[s] == held_len[s]]
        slot = max(within, key=lambda s: shared[s], default=free[0])
      free.remove(slot)
      self.owner[slot] = row
      out.append((slot, row))
    return out

  def _shared(self, ids: np.ndarray) -> np.ndarray:
    """int [R]: how many leading tokens of `ids` each slot's cache holds (held_ids is -1 past
    each slot's prompt, which no token id equals)."""
    n = min(ids.size, self.held_ids.shape[1])
    differ = self.held_ids[:, :n] != ids[None, :n]
    return np.where(differ.any(1), differ.argmax(1), n)

  def _admit(self, admitted: list[tuple[int, Row]]) -> None:
    """Starts the admitted rows, each the cheapest way (module docstring): the prefills
    (grouped by prompt bucket, in row buckets), then the extends in waves (a wave reads rows
    held before the admit, the row's own slot, or rows the waves before it wrote), then the
    forks. A slot another admitted row overwrites is never read."""
    if not admitted:
      return
    slots_in = {slot for slot, _ in admitted}
    leaders, forks = [], []
    waves: dict[int, list] = {}  # wave -> [(source, slot, row, start)]
    made: dict[bytes, int] = {}  # prompts this admit writes -> their slot
    made_ids: list[tuple[int, np.ndarray, int]] = []  # (slot, ids, wave it is ready after)
    keys = [row.ids.astype(np.int32).tobytes() for _, row in admitted]
    for (slot, row), key in zip(admitted, keys, strict=True):
      ids = np.frombuffer(key, np.int32)
      outside = [s for s in self.held.get(key, ()) if s not in slots_in]
      if self.slot_prompt[slot] == key and key not in made:
        forks.append((slot, slot, row))  # its own slot holds it: nothing to copy
        made[key] = slot
        made_ids.append((slot, ids, 0))
        continue
      if key in made or outside:
        forks.append((made.get(key, min(outside, default=-1)), slot, row))
        continue
      # The longest held prefix: a slot outside the admit, this slot's own, or a new row's.
      shared = self._shared(ids)
      shared[[s for s in slots_in if s != slot]] = 0
      source, start, wave = int(shared.argmax()), int(shared.max()), 1
      for s, other, ready in made_ids:
        n = min(other.size, ids.size)
        common = int(np.argmin(np.append(other[:n] == ids[:n], False)))
        if common > start or (common == start and ready + 1 < wave):
          source, start, wave = s, common, ready + 1
      start = min(start, ids.size - 1)  # the last token's logits are computed here
      if start >= self.min_shared:
        waves.setdefault(wave, []).append((source, slot, row, start))
      else:
        leaders.append((slot, row))
        wave = 0
      made[key] = slot
      made_ids.append((slot, ids, wave))
    self._prefill_rows(leaders)
    for wave in sorted(waves):
      self._extend_rows(waves[wave])
    self._fork_rows(forks)
    for (slot, row), key in zip(admitted, keys, strict=True):
      self._forget(slot)
      self.held.setdefault(key, set()).add(slot)
      self.slot_prompt[slot] = key
      self.held_ids[slot, : row.ids.size] = row.ids
      self.tokens[slot] = []
      self.pos[slot] = row.ids.size

  def _forget(self, slot: int) -> None:
    key, self.slot_prompt[slot] = self.slot_prompt[slot], None
    self.held_ids[slot] = -1
    if key is not None:
      self.held[key].discard(slot)
      if not self.held[key]:
        del self.held[key]

  def _forget_all(self) -> None:
    """No slot's cache is read again (new parameters, or a failed program)."""
    for slot in range(self.slots):
      self._forget(slot)

  @staticmethod
  def _settings(rows: list[Row]) -> dict:
    return {
      "budget": np.array([x.budget for x in rows], np.int32),
      "temperature": np.array([x.temperature for x in rows], np.float32),
      "top_p": np.array([x.top_p for x in rows], np.float32),
      "keys": jnp.stack([x.key for x in rows]),
    }

  def _calls(self, items: list, left: Callable) -> list:
    """`items` grouped by the prompt bucket of their `left(item)` tokens to run, in calls of
    at most the largest row bucket: [(bucket, the call's items, them padded to a row bucket
    by repeating the first: the same writes to the same slot)]."""
    S = self.cfg.max_len
    by_bucket: dict[int, list] = {}
    for item in items:
      by_bucket.setdefault(next(b for b in prompt_buckets(S) if b >= left(item)), []).append(item)
    out = []
    for bucket, group in by_bucket.items():
      for begin in range(0, len(group), ROW_BUCKETS[-1]):
        part = group[begin : begin + ROW_BUCKETS[-1]]
        r = next(b for b in ROW_BUCKETS if b >= len(part))
        out.append((bucket, part, [part[j if j < len(part) else 0] for j in range(r)]))
    return out

  def _prefill_rows(self, leaders: list[tuple[int, Row]]) -> None:
    """(slot, row) rows whose whole prompt is run."""
    for P_, part, picked in self._calls(leaders, lambda item: item[1].ids.size):
      ids = np.zeros((len(picked), P_), np.int32)
      for j, (_, row) in enumerate(picked):
        ids[j, : row.ids.size] = row.ids
      lengths = np.array([row.ids.size for _, row in picked], np.int32)
      slots = np.array([slot for slot, _ in picked], np.int32)
      self.cache, self.rows, self.prompt_logits = self._prefill(
        self.state, self.cache, self.rows, self.prompt_logits, slots, ids, lengths,
        self._settings([row for _, row in picked]), self.bias,
      )  # fmt: skip
      self.stats["prefills"] += 1
      self.stats["prefill_tokens"] += int(sum(row.ids.size for _, row in part))

  def _extend_rows(self, extends: list[tuple[int, int, Row, int]]) -> None:
    """(source slot, slot, row, start) rows: the rest of each prompt after `start` is run."""
    for P_, part, picked in self._calls(extends, lambda item: item[2].ids.size - item[3]):
      ids = np.zeros((len(picked), P_), np.int32)
      for j, (_, _, row, start) in enumerate(picked):
        ids[j, : row.ids.size - start] = row.ids[start:]
      src, dst, rows, starts = zip(*picked, strict=True)
      self.cache, self.rows, self.prompt_logits = self._extend(
        self.state, self.cache, self.rows, self.prompt_logits, np.array(src, np.int32),
        np.array(dst, np.int32), ids, np.array(starts, np.int32),
        np.array([row.ids.size for row in rows], np.int32), self._settings(list(rows)),
        self.bias,
      )  # fmt: skip
      self.stats["extends"] += 1
      self.stats["prefill_tokens"] += int(sum(row.ids.size - st for _, _, row, st in part))
      self.stats["reused_tokens"] += int(sum(st for _, _, _, st in part))

  def _fork_rows(self, forks: list[tuple[int, int, Row]]) -> None:
    """(source slot, slot, row) rows: copies, nothing run (one bucket: no tokens to run)."""
    for _, part, picked in self._calls(forks, lambda item: 1):
      src, dst, rows = zip(*picked, strict=True)
      lengths = np.array([row.ids.size for row in rows], np.int32)
      self.cache, self.rows, self.prompt_logits = self._fork(
        self.cache, self.rows, self.prompt_logits, np.array(src, np.int32),
        np.array(dst, np.int32), lengths, self._settings(list(rows)),
      )  # fmt: skip
      self.stats["forks"] += 1
      self.stats["reused_tokens"] += int(sum(row.ids.size for _, _, row in part))

  def _decoder(self, window: int, width: int):
    """The (window, width) decode program, recorded in `_decode` as one this engine runs."""
    if (window, width) not in self._decode:
      self._decode[window, width] = _decoder(self.lm.graphdef, self.cfg, self.chunk, window,
                                             width)  # fmt: skip
    return self._decode[window, width]

  def widths(self) -> list[int]:
    """The rows a decode call runs over: the row buckets below the slots, and all."""
    return [*(b for b in ROW_BUCKETS if b < self.slots), self.slots]

  def windows(self) -> tuple[int, ...]:
    """The windows a decode call attends over: `decode_windows` by length, else the prompt
    buckets."""
    return self._windows

  def _window(self, pos: int) -> int:
    """The smallest window holding a slot at position `pos` through a decode call."""
    return next((w for w in self._windows if w >= pos + self.chunk), self.cfg.max_len)

  def _split(self, n: int, window: int) -> tuple[int, list[int]]:
    """(cost, widths): the cheapest calls (`ROW_COST`, `CALL_COST`) that decode n rows over
    `window`, widths from `widths()` summing to at least n: 32 rows at 64 slots are two
    calls of 16, not one of 64 half padding."""
    if (n, window) not in self._costs:
      best: list[tuple[int, list[int]]] = [(0, [])]  # best[m]: m rows
      for m in range(1, n + 1):
        options = []
        for w in self.widths():
          cost, widths = best[max(0, m - w)]
          options.append((cost + w * (window + ROW_COST) + CALL_COST, [*widths, w]))
        best.append(min(options, key=lambda option: option[0]))
      self._costs[n, window] = best[n]
    return self._costs[n, window]

  def _plan(self, live: list[int]) -> list[tuple[int, int, list[int]]]:
    """The decode calls of the live slots by length: [(window, width, slots)]. Each slot's
    window is the smallest that holds its own position (`_window`); slots of adjacent windows
    are decoded together at the larger one where that costs less (a lone short row beside
    63 long ones rides in their call's padding rather than paying a call of its own):
    windows w_1 < ... < w_m split into runs, each run at its largest window, the split of
    least total cost (`_split`), found in O(m^2) over the runs' ends."""
    by_window: dict[int, list[int]] = {}
    for slot in live:
      by_window.setdefault(self._window(int(self.pos[slot])), []).append(slot)
    windows = sorted(by_window)
    best: list[tuple[int, list]] = [(0, [])]  # best[j]: windows[:j]
    for j in range(1, len(windows) + 1):
      options = []
      for i in range(j):
        group = [slot for w in windows[i:j] for slot in by_window[w]]
        cost, widths = self._split(len(group), windows[j - 1])
        options.append((best[i][0] + cost, [*best[i][1], (windows[j - 1], widths, group)]))
      best.append(min(options, key=lambda option: option[0]))
    calls = []
    for window, widths, group in best[-1][1]:
      for width in widths:
        calls.append((window, width, group[:width]))
        group = group[width:]
    return calls

  def _step(self) -> None:
    live = [s for s, o in enumerate(self.owner) if o is not None]
    if not live:
      return
    self.stats["max_live"] = max(self.stats["max_live"], len(live))
    if self.by_length:
      calls = self._plan(live)
    else:  # one window: the furthest live slot's, over the prefix of slots holding them all
      window = self._window(int(self.pos[live].max()))
      # Rows are admitted into the lowest free slots: the live ones sit in a short prefix.
      calls = [(window, next(w for w in self.widths() if w > max(live)), None)]
    outs = []
    for window, width, slots in calls:
      # Padding rows name slot R: out of range, so they are read as done and written nowhere.
      pad = () if slots is None else (np.array(slots + [self.slots] * (width - len(slots)),
                                               np.int32),)  # fmt: skip
      program = self._decoder(window, width)
      self.cache, self.rows, got = program(self.state, self.cache, self.rows, self.bias, *pad)
      outs.append(got)
      self.stats["decode_calls"] += 1
      windows = self.stats["decode_windows"]
      windows[window] = windows.get(window, 0) + 1
    outs, done, eos = jax.device_get((outs, self.rows["done"], self.rows["eos"]))
    out = np.full((self.slots, self.chunk), -1, np.int32)  # tokens each slot drew
    for (_, width, slots), got in zip(calls, outs, strict=True):
      if slots is None:
        out[:width] = got
      else:
        out[slots] = got[: len(slots)]
    released = np.zeros(self.slots, bool)
    ended = []
    for slot in live:
      drawn = out[slot][out[slot] >= 0]
      before = len(self.tokens[slot])
      self.tokens[slot].extend(int(t) for t in drawn)
      self.pos[slot] += drawn.size
      row = self.owner[slot]
      end = self._stop_at(slot, before) if row.stop else None
      if end is not None:
        del self.tokens[slot][end:]
        released[slot] = not done[slot]
        self.stats["stopped"] += 1
      elif not done[slot]:
        continue
      self.owner[slot] = None
      tokens = np.asarray(self.tokens[slot], np.int32)
      if end is None and eos[slot] and not row.keep_eos:
        tokens = tokens[:-1]  # EOS is not part of the text
      ended.append((row, tokens, STOP if end is not None else EOS if eos[slot] else LENGTH))
    # Released before any caller hears of its row: a caller that closes the engine and exits
    # once its last row ended must not find the worker still inside a device call (the
    # interpreter's exit unwinding a thread inside XLA aborts the process).
    if released.any():
      self.rows = self._release(self.rows, jnp.asarray(released))
    for row, tokens, reason in ended:
      row.done(tokens, reason)

  def _stop_at(self, slot: int, before: int) -> int | None:
    """The token count up to and including the token that completes the first stop string
    of the slot's row in its text (None: none has appeared). The first `before` tokens were
    checked by earlier calls, so a stop string ends after them and starts at most
    `_stop_reach` tokens before them: only that tail is decoded (linear in the choice's
    length, not quadratic)."""
    stops = self.owner[slot].stop
    tokens = [t for t in self.tokens[slot] if t not in self.cfg.eos_ids]
    lo = max(0, before - _stop_reach(stops))
    decode = self.tokenizer.decode
    if not any(s in decode(tokens[lo:]) for s in stops):
      return None
    for end in range(max(before, lo + 1), len(tokens) + 1):
      if any(s in decode(tokens[lo:end]) for s in stops):
        return end
    return len(tokens)


def _stop_reach(stops: tuple[str, ...]) -> int:
  """Tokens a stop string can span: one per byte of its UTF-8 (a byte-level token holds at
  least one), and one more each side for a character cut across tokens."""
  return max(len(s.encode()) for s in stops) + 2
