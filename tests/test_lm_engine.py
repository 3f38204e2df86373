"""The slot engine's stop strings and its end, on the tiny random Qwen2 folder of
tests/test_lm_server.py: a stop string that two decode calls write between them, a stopped
slot released on the device before its caller hears of it, a process that closes its engine
and exits, and warmup compiling every program an engine of several slots runs."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.conftest import FAST_COMPILE, ROOT
from tests.test_lm_server import tok_ids, write_folder

PROMPT = "Problem 3: three boxes hold 1, 2 and 3 apples."


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return write_folder(str(tmp_path_factory.mktemp("engine_lm") / "tiny"))


@pytest.fixture(scope="module")
def lm(folder):
  from hindsight.lm.train import load_lm

  return load_lm(folder)


def _row(ids, seed: int, budget: int, stop=(), done=None, temperature=1.0):
  from hindsight.lm.engine import Row

  key = jax.random.fold_in(jax.random.key(seed), 0)
  return Row(np.asarray(ids, np.int32), budget, temperature, 1.0, key, done, tuple(stop))


def _first_end(tok, tokens, stop: str) -> int | None:
  """How many tokens the text holding `stop` first takes (None: it never does)."""
  return next((i for i in range(1, len(tokens) + 1) if stop in tok.decode(tokens[:i])), None)


def _clean(tok, tokens) -> bool:
  """Every token ends on a character boundary: the text of any span is that span's text."""
  return all(
    tok.decode(tokens[:i]) + tok.decode(tokens[i:]) == tok.decode(tokens)
    for i in range(1, len(tokens))
  )


def test_a_stop_string_two_decode_calls_write_between_them_stops_the_choice(lm, folder):
  """A 4-token stop string across the boundary after token 8 (the first decode call writes
  its first two tokens, the second its last two), as an agent's `</tool_call>` spans
  several tokens: the choice ends in the second call, billed up to the stop string's last
  token."""
  from hindsight.lm.engine import CHUNK, LENGTH, STOP, SlotEngine

  assert CHUNK == 8
  ids = tok_ids(folder, PROMPT)
  engine = SlotEngine(lm, slots=1)
  try:
    # A choice of 40 tokens whose tokens 6..9 are a stop string found nowhere before them.
    for seed in range(40):
      [(tokens, reason)] = engine.complete([_row(ids, seed, 40)])
      tokens = tokens.tolist()
      stop = lm.tokenizer.decode(tokens[6:10])
      if reason == LENGTH and _clean(lm.tokenizer, tokens[:12]) and stop.strip() and (
        _first_end(lm.tokenizer, tokens, stop) == 10
      ):  # fmt: skip
        break
    else:
      raise AssertionError("no seed draws a clean 4-token stop string")
    calls = engine.stats["decode_calls"]
    [(got, reason)] = engine.complete([_row(ids, seed, 40, stop=[stop])])
    assert (got.tolist(), reason) == (tokens[:10], STOP)
    assert engine.stats["decode_calls"] - calls == 2  # ended by the second call
    assert engine.stats["stopped"] == 1
  finally:
    engine.close()


def test_a_stopped_slot_is_released_on_the_device_before_its_caller_hears_of_it(lm, folder):
  """A choice that meets its stop string in the first decode call, in slot 0 beside a long
  choice in slot 1 (so every later call still runs over slot 0): its slot is marked done on
  the device before its `done` runs, and it draws nothing in any later call. One window
  (`by_length=False`): a call runs over a prefix of the slots, so the mark on the device is
  what keeps a freed slot 0 from drawing (by length, a call gathers only live slots)."""
  import threading

  from hindsight.lm.engine import LENGTH, STOP, SlotEngine

  ids = tok_ids(folder, PROMPT)
  engine = SlotEngine(lm, slots=2, by_length=False)
  calls = []  # per decode call: (the slots of rows with stop strings, tokens [width, chunk])
  decoder = engine._decoder

  def spying(window, width):
    program = decoder(window, width)

    def run(*args):  # on the worker thread, which owns `owner` and the device rows
      stopping = [s for s, o in enumerate(engine.owner) if o is not None and o.stop]
      cache, rows, out = program(*args)
      calls.append((stopping, np.asarray(out)))
      return cache, rows, out

    return run

  engine._decoder = spying
  try:
    # A long choice (80 tokens, 10 decode calls) and a short one whose 3rd token completes
    # a stop string.
    long_seed = next(s for s in range(40) if engine.complete([_row(ids, s, 80)])[0][1] == LENGTH)
    short_seed, stop = next(
      (s, stop)
      for s in range(100, 140)
      for tokens in [engine.complete([_row(ids, s, 8)])[0][0].tolist()]
      for stop in [lm.tokenizer.decode(tokens[2:3])]
      if stop.strip() and _first_end(lm.tokenizer, tokens, stop) == 3
    )
    heard, both = [], threading.Event()

    def done_as(name):
      def done(tokens, reason):
        heard.append((name, reason, tokens.size, bool(np.asarray(engine.rows["done"])[0])))
        both.set() if len(heard) == 2 else None

      return done

    calls.clear()
    engine.submit([_row(ids, short_seed, 80, stop=[stop], done=done_as("short")),
                   _row(ids, long_seed, 80, done=done_as("long"))])  # fmt: skip
    assert both.wait(120)
    # Slot 0 was marked done on the device when the short choice's caller heard of it.
    assert heard == [("short", STOP, 3, True), ("long", LENGTH, 80, True)]
    assert [stopping for stopping, _ in calls] == [[0]] + [[]] * 9
    assert all(out.shape[0] == 2 for _, out in calls)  # every call ran over slot 0
    assert (calls[0][1][0] >= 0).sum() == 8  # a whole call before its stop string was seen
    assert all((out[0] < 0).all() for _, out in calls[1:]), [out[0] for _, out in calls]
  finally:
    engine.close()


CHILD = """
import sys, threading
import jax, numpy as np
from hindsight.lm.engine import Row, SlotEngine
from hindsight.lm.train import load_lm

lm = load_lm(sys.argv[1])
ids = lm.tokenizer.encode(sys.argv[2], start=True).astype(np.int32)
engine = SlotEngine(lm, slots=2)
row = lambda seed, budget, **kw: Row(ids, budget, 1.0, 1.0, jax.random.key(seed), **kw)
[(tokens, _)] = engine.complete([row(0, 40)])
text = lm.tokenizer.decode(tokens)
stop = next(c for c in text[len(text) // 2 :] if c.strip())
long_ended = []
engine.submit([row(1, 450, done=lambda t, r: long_ended.append(r))])  # still decoding below
[(_, reason)] = engine.complete([row(0, 40, stop=(stop,))])
engine.close()
alive = [t.name for t in threading.enumerate() if t.name == "lm-engine"]
print(reason, "long row running:", not long_ended, "workers alive:", alive, flush=True)
"""


def test_a_process_that_ends_a_row_on_a_stop_string_closes_the_engine_and_exits_cleanly(folder):
  """The process boundary: a row ends on a stop string while another still decodes, the
  caller closes the engine and the interpreter exits. `close` waits for the worker, so no
  thread is inside a device call when the interpreter tears down (which aborted the
  process: "terminate called ... FATAL: exception not rethrown", exit status 134)."""
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE)
  got = subprocess.run([sys.executable, "-c", CHILD, folder, PROMPT], capture_output=True,
                       text=True, timeout=240, cwd=ROOT, env=env)  # fmt: skip
  assert got.returncode == 0, (got.returncode, got.stderr[-2000:])
  assert got.stdout.strip() == "stop long row running: True workers alive: []", got.stdout


def test_warmup_compiles_every_program_an_engine_of_several_slots_runs(folder):
  """At 5 slots (row buckets 1 and 4, decode widths 1, 4 and 5) `warmup` compiles one
  prefill and one extend per (row bucket, prompt bucket), a fork per row bucket and a decode
  per (window, width); a mixed load after it (prefills of 1 to 5 rows, extends, forks, 1 to
  5 live slots, prompts in both buckets) compiles nothing more. The programs are the
  architecture's, shared: a second engine of the same model compiles none."""
  from hindsight.lm.engine import SlotEngine
  from hindsight.lm.sample import prompt_buckets
  from hindsight.lm.train import load_lm

  lm = load_lm(folder, max_len=64)  # an architecture no other test of the module compiles
  engine = SlotEngine(lm, slots=5)
  try:
    assert engine.widths() == [1, 4, 5]
    buckets = len(prompt_buckets(64))
    assert buckets == 2
    fork_before = engine._fork._cache_size()  # a module-level function's: shared by all
    assert engine._prefill._cache_size() == engine._extend._cache_size() == 0
    assert engine.warmup() == engine.program_count() == buckets * (2 * 2 + 3) + 2
    assert engine._prefill._cache_size() == engine._extend._cache_size() == 2 * buckets
    assert engine._fork._cache_size() <= fork_before + 2
    assert sorted(engine._decode) == [(w, r) for w in (32, 64) for r in (1, 4, 5)]

    def programs():
      return (engine._prefill._cache_size(), engine._extend._cache_size(),
              engine._fork._cache_size(), sorted(engine._decode),
              [p._cache_size() for p in engine._decode.values()])  # fmt: skip

    warm = programs()
    assert all(p._cache_size() == 1 for p in engine._decode.values())
    # A second engine of the same model runs every program and compiles none.
    compiled = []

    def listen(event, seconds, **_):
      if event == "/jax/core/compile/backend_compile_duration":
        compiled.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listen)
    other = SlotEngine(lm, slots=5)
    try:
      assert other.warmup() == engine.program_count()
      assert other.complete([_row(tok_ids(folder, "Problem 4: boxes hold 4."), 3, 6)])
    finally:
      other.close()
      jax.monitoring.unregister_event_duration_listener(listen)
    assert compiled == [] and programs() == warm
    text = "Problem 3: three boxes hold 1, 2 and 3 apples. Box one holds 1. Box two holds 2."
    long = tok_ids(folder, text)[:40]  # the 64-token prompt bucket
    short = [tok_ids(folder, f"Problem {k}: boxes hold {k}.") for k in range(4, 9)]
    loads = [
      [_row(short[0], 1, 6)],  # one prefill, one live slot
      [_row(x, 2 + j, 12) for j, x in enumerate(short[:3])],  # a prefill of 3 rows
      [_row(x, 5 + j, 8) for j, x in enumerate(short)],  # 5 live slots
      [_row(long, 10, 8), _row(long, 11, 8), _row(long, 12, 8)],  # prefill, then forks
      [_row(long[:20], 13, 4), _row(long[:36], 14, 20)],  # extends, both buckets
      [_row(short[1], 15, 3)] * 5,  # forks of 4 rows
    ]
    for load in loads:
      got = engine.complete(load)
      assert len(got) == len(load) and all(t.size for t, _ in got)
    assert engine.stats["extends"] > 0 and engine.stats["forks"] > 0
    assert programs() == warm
  finally:
    engine.close()


def _mixed(folder) -> list[np.ndarray]:
  """Four short prompts (10 tokens: window 32 through their decode) and four long ones (300
  tokens: window 384), each distinct, so a row's tokens swapped with another's show. (Four
  rows of 10 tokens save more in a call of their own than the call costs: `_plan`.)"""
  from hindsight.worlds import world

  texts = [t.prompt + t.completion() for t in world.sample_traces(3, 8)]
  long = [tok_ids(folder, a + " " + b)[:300] for a, b in zip(texts[0::2], texts[1::2], strict=True)]
  short = [tok_ids(folder, f"Problem {k}: two boxes.")[:10] for k in range(4)]
  assert all(len(x) == 300 for x in long) and all(len(x) == 10 for x in short)
  return [np.asarray(x, np.int32) for pair in zip(short, long, strict=True) for x in pair]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_of_mixed_lengths_each_attend_over_their_own_window_and_draw_what_they_draw_alone(
  lm, folder, temperature
):
  """Short and long rows interleaved in one batch (slots 0, 2, 4, 6 short, 1, 3, 5, 7 long):
  by length, the short rows' calls attend over 32 positions and the long rows' over 384,
  and every row draws, token for token, what the one-window decode (`by_length=False`, all
  rows over the prompt bucket 512) and the row decoded alone draw, greedy and sampled. A
  window that misses a row's own keys (every row over 32) changes what each long row draws:
  the comparison sees a wrong window. The weights are the tiny model's x4: at its N(0,
  0.02^2) start its logits hardly depend on the context (greedy repeats one token whatever
  it attends to)."""
  import dataclasses

  from hindsight.lm.engine import SlotEngine

  sharp = dataclasses.replace(lm, state=jax.tree.map(lambda x: 4 * x, lm.state))
  prompts = _mixed(folder)
  rows = [_row(x, 40 + j, 16, temperature=temperature) for j, x in enumerate(prompts)]

  def run(slots, by_length, batches, window=None):
    engine = SlotEngine(sharp, slots=slots, by_length=by_length)
    if window is not None:
      engine._window = lambda pos: window
    try:
      got = [tokens.tolist() for batch in batches for tokens, _ in engine.complete(batch)]
      return got, engine.stats["decode_windows"]
    finally:
      engine.close()

  by_length, windows = run(8, True, [rows])
  assert sorted(windows) == [32, 384], windows  # the two lengths went to different calls
  one_window, wide = run(8, False, [rows])
  assert sorted(wide) == [512], wide
  alone, _ = run(1, True, [[row] for row in rows])
  assert all(len(tokens) == 16 for tokens in by_length)
  assert by_length == one_window == alone
  assert len({tuple(tokens) for tokens in alone}) == 8  # every row draws its own tokens
  wrong, _ = run(8, True, [rows], window=32)
  assert wrong[0::2] == alone[0::2]  # the short rows' keys all lie below 32 ...
  # ... the long rows' do not
  assert all(w != a for w, a in zip(wrong[1::2], alone[1::2], strict=True))


def test_the_plan_groups_slots_by_their_own_window_where_that_costs_less(lm):
  """`_plan` on positions alone (nothing runs): 16 short and 16 long live slots at 64 slots
  are two calls of 16 rows, one over 32 positions and one over 256 (the short rows over 256
  would read 16 x 224 positions more each step, more than a call costs); a lone short slot
  beside 63 long ones rides in their call of 64, which it would pad anyway; a row near the
  context's end attends over all of it. The windows are the prompt buckets and, from 128 on,
  the points halfway between them."""
  from hindsight.lm.engine import SlotEngine, decode_windows

  assert decode_windows(384) == (32, 64, 128, 192, 256, 384)
  assert decode_windows(1024) == (32, 64, 128, 192, 256, 384, 512, 768, 1024)
  engine = SlotEngine(lm, slots=64)
  try:
    assert engine.windows() == decode_windows(lm.cfg.max_len)
    engine.pos[:16], engine.pos[16:32] = 10, 200
    assert engine._plan(list(range(32))) == [
      (32, 16, list(range(16))),
      (256, 16, list(range(16, 32))),
    ]
    engine.pos[0], engine.pos[1:] = 10, 200
    assert engine._plan(list(range(64))) == [(256, 64, list(range(64)))]
    engine.pos[0] = lm.cfg.max_len - 3
    assert engine._plan([0]) == [(lm.cfg.max_len, 1, [0])]
  finally:
    engine.close()
