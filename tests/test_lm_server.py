"""`hindsight lm serve` as a new user meets it with their own folder: a tiny random Qwen2
written in Hugging Face's layout with its own byte-level BPE (vocabulary 300, context 512),
a chat template and a generation_config.json; the OpenAI surface held against the
in-process sampler and `transformers`' own chat-template rendering."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import threading
import time

import httpx
import jax
import numpy as np
import pytest

from hindsight.errors import HindsightError
from hindsight.lm import backbone, hf
from hindsight.lm.config import BackboneConfig
from hindsight.model.encoders.tokenizer import train_bpe
from hindsight.worlds import world
from tests.conftest import FAST_COMPILE, HINDSIGHT, ROOT

SERVER = pytest.mark.xdist_group("lm_server")
CFG = BackboneConfig("qwen2", vocab_size=300, width=32, depth=2, num_heads=4, num_kv_heads=2,
                     head_dim=8, hidden=48, max_len=512, tied=True)  # fmt: skip
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")  # fmt: skip


def write_folder(path: str, seed: int = 0, cfg: BackboneConfig = CFG) -> str:
  """A user's folder: weights, config.json, tokenizer.json, and a tokenizer_config.json with
  a chat template."""
  texts = [t.prompt + t.completion() for t in world.sample_traces(0, 60)]
  folder = hf.write_hf(backbone.build(cfg, jax.random.key(seed)), cfg, train_bpe(texts, 300), path)
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump({"chat_template": TEMPLATE, "eos_token": "<eos>"}, f)
  return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return write_folder(str(tmp_path_factory.mktemp("user_lm") / "tiny"))


@pytest.fixture(scope="module")
def served(folder):
  from hindsight.lm.server import running_lm

  with running_lm(folder, name="tiny") as (url, name):
    yield url, name


def _post(url: str, route: str, body: dict) -> httpx.Response:
  return httpx.post(url.removesuffix("/v1") + route, json=body, timeout=120)


def _draws(folder: str, prompt_ids, seed: int, n: int, budget: int):
  """The in-process sampler's draws of the server's keys: token ids [n] (EOS dropped)."""
  from hindsight.lm.sample import pad_prompts, sampler
  from hindsight.lm.train import load_lm

  lm = load_lm(folder)
  ids, lengths = pad_prompts([np.asarray(prompt_ids)] * n, lm.cfg.max_len)
  R = ids.shape[0]
  keys = jax.numpy.stack([jax.random.fold_in(jax.random.key(seed), min(j, n - 1))
                          for j in range(R)])  # fmt: skip
  out, count, eos = sampler(lm.graphdef, lm.cfg)(
    lm.state, ids, lengths, np.full(R, budget, np.int32), np.ones(R, np.float32),
    np.ones(R, np.float32), keys,
  )  # fmt: skip
  return [np.asarray(out[j, : int(count[j]) - int(eos[j])]) for j in range(n)], lm.tokenizer


@SERVER
def test_decoding_stops_at_a_stop_string_and_bills_the_tokens_up_to_it(served, folder):
  url, name = served
  prompt = "Problem 3: three boxes hold 1, 2 and 3 apples."
  full, tok = _draws(folder, tok_ids(folder, prompt), seed=4, n=6, budget=60)
  texts = [tok.decode(t) for t in full]
  stop = next(c for c in "eoatn" if sum(c in t for t in texts) >= 3)
  got = _post(url, "/v1/completions", {"model": name, "prompt": prompt, "n": 6, "seed": 4,
                                       "max_tokens": 60, "stop": [stop]}).json()  # fmt: skip
  billed = 0
  for choice, tokens, text in zip(got["choices"], full, texts, strict=True):
    if stop in text:
      # The engine stopped at the first token whose text holds the stop string: the bill
      # is that many tokens, not the 60 the choice would have drawn.
      end = next(i for i in range(1, len(tokens) + 1) if stop in tok.decode(tokens[:i]))
      assert choice["text"] == text.split(stop)[0] and choice["finish_reason"] == "stop"
      billed += end
    else:
      assert choice["text"] == text
      billed += len(tokens)
  assert got["usage"]["completion_tokens"] == billed < sum(len(t) for t in full)
  stats = httpx.get(url.removesuffix("/v1") + "/stats").json()
  assert stats["stopped"] == sum(stop in t for t in texts) >= 3
  # A stopped choice frees its slot on the device at once: a long draw stopped early costs
  # the decode calls up to its stop, not those to its budget.
  long = next((tokens, seed) for seed in range(20)
              for tokens in _draws(folder, tok_ids(folder, prompt), seed, 1, 400)[0]
              if len(tokens) >= 200)  # fmt: skip
  tokens, seed = long
  text = tok.decode(tokens)
  stop = next(c for c in text[4:] if c.strip())  # appears within the first few tokens
  end = next(i for i in range(1, len(tokens) + 1) if stop in tok.decode(tokens[:i]))
  calls = stats["decode_calls"]
  got = _post(url, "/v1/completions", {"model": name, "prompt": prompt, "seed": seed,
                                       "max_tokens": 400, "stop": stop}).json()  # fmt: skip
  assert got["usage"]["completion_tokens"] == end and got["choices"][0]["finish_reason"] == "stop"
  spent = httpx.get(url.removesuffix("/v1") + "/stats").json()["decode_calls"] - calls
  assert spent <= end // 8 + 2 < len(tokens) // 8, (spent, end, len(tokens))


def tok_ids(folder: str, text: str) -> list[int]:
  return hf.read_tokenizer(folder).encode(text, start=True).tolist()


@SERVER
def test_the_context_is_enforced_as_vllm_does_and_max_tokens_defaults_to_16(served, folder):
  url, name = served
  ids = tok_ids(folder, "Problem 3: boxes")
  over = _post(url, "/v1/completions", {"model": name, "prompt": "Problem 3: boxes",
                                        "max_tokens": 512})  # fmt: skip
  assert over.status_code == 400
  message = over.json()["error"]["message"]
  assert "maximum context length is 512 tokens" in message and f"{len(ids) + 512}" in message
  assert over.json()["error"]["code"] == 400
  plain = _post(url, "/v1/completions", {"model": name, "prompt": "Problem 3: boxes",
                                         "seed": 1}).json()  # fmt: skip
  (expected,), tok = _draws(folder, ids, seed=1, n=1, budget=16)
  assert plain["choices"][0]["text"] == tok.decode(expected)
  assert plain["usage"]["completion_tokens"] == len(expected) <= 16
  # Token ids are a prompt too, and draw what their text draws.
  by_ids = _post(url, "/v1/completions", {"model": name, "prompt": ids, "seed": 1}).json()
  assert by_ids["choices"][0]["text"] == plain["choices"][0]["text"]
  both = _post(url, "/v1/completions", {"model": name, "prompt": [ids, ids], "seed": 1})
  assert [c["text"] for c in both.json()["choices"]] == [plain["choices"][0]["text"]] * 2
  assert _post(url, "/v1/completions", {"model": name, "prompt": [5, 999]}).status_code == 400


@SERVER
def test_the_openai_surface_refuses_what_it_does_not_honour(served):
  url, name = served
  root = url.removesuffix("/v1")
  models = httpx.get(url + "/models").json()["data"]
  assert [(m["id"], m["max_model_len"]) for m in models] == [("tiny", 512)]
  assert httpx.get(url + "/models/tiny").json()["max_model_len"] == 512
  assert httpx.get(url + "/models/other").status_code == 404
  assert httpx.get(root + "/health").status_code == 200
  base = {"model": name, "prompt": "Problem 3:"}
  refused = {
    "logprobs": (1, "logprobs is not supported"),
    "temperatur": (0.5, "unknown field `temperatur`"),
    "presence_penalty": (0.5, "presence_penalty is not supported"),
    "stream": (True, "stream is not supported"),
  }
  for field, (value, message) in refused.items():
    r = _post(url, "/v1/completions", {**base, field: value})
    assert r.status_code == 400 and message in r.json()["error"]["message"], (field, r.text)
  assert _post(url, "/v1/completions", {**base, "logprobs": 0}).status_code == 400
  # Neutral values of options no server here implements are what clients send by default.
  for neutral in ({"presence_penalty": 0.0, "top_k": -1}, {"top_k": 0, "best_of": 1},
                  {"logit_bias": {}, "min_p": 0.0}):  # fmt: skip
    assert _post(url, "/v1/completions", {**base, **neutral}).status_code == 200, neutral
  r = _post(url, "/v1/completions", {**base, "best_of": 2})
  assert r.status_code == 400 and "best_of is not supported" in r.json()["error"]["message"]
  r = httpx.get(root + "/v1/embeddings")
  assert r.status_code == 404 and "not served here" in r.json()["error"]["message"]
  count = _post(url, "/tokenize", {"model": name, "prompt": "Problem 3:"}).json()
  assert count["max_model_len"] == 512 and count["count"] == len(count["tokens"])
  back = _post(url, "/detokenize", {"model": name, "tokens": count["tokens"]}).json()
  assert back["prompt"] == "Problem 3:"


@SERVER
def test_chat_completions_render_the_folders_template_as_transformers_does(served, folder):
  from transformers import PreTrainedTokenizerFast

  url, name = served
  messages = [{"role": "system", "content": "Count apples."},
              {"role": "user", "content": "Boxes hold 1 and 2."}]  # fmt: skip
  reference = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, "tokenizer.json"))
  reference.chat_template = TEMPLATE
  text = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  ids = hf.read_tokenizer(folder).encode(text).tolist()  # the template writes its own start
  counted = _post(url, "/tokenize", {"model": name, "messages": messages}).json()
  assert counted["tokens"] == ids
  chat = _post(url, "/v1/chat/completions", {"model": name, "messages": messages, "seed": 2,
                                             "max_tokens": 12}).json()  # fmt: skip
  plain = _post(url, "/v1/completions", {"model": name, "prompt": ids, "seed": 2,
                                         "max_tokens": 12}).json()  # fmt: skip
  assert chat["object"] == "chat.completion"
  assert chat["choices"][0]["message"] == {"role": "assistant",
                                           "content": plain["choices"][0]["text"]}  # fmt: skip


def test_a_folders_end_ids_come_from_generation_config_and_are_required(tmp_path):
  folder = write_folder(str(tmp_path / "a"))
  with open(os.path.join(folder, "config.json")) as f:
    config = json.load(f)
  with open(os.path.join(folder, "generation_config.json"), "w") as f:
    json.dump({"eos_token_id": [1, 7]}, f)
  assert hf.read_config(folder).eos_ids == (1, 7)
  # No eos_token_id anywhere: tokenizer_config.json's eos_token, by its id in tokenizer.json.
  os.remove(os.path.join(folder, "generation_config.json"))
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({k: v for k, v in config.items() if k != "eos_token_id"}, f)
  assert hf.read_config(folder).eos_ids == (1,)  # "<eos>" is id 1 of the BPE
  os.remove(os.path.join(folder, "tokenizer_config.json"))
  with pytest.raises(HindsightError, match="no end-of-sequence id"):
    hf.read_config(folder)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
  small = BackboneConfig("qwen2", vocab_size=290, width=32, depth=1, num_heads=4,
                         num_kv_heads=2, head_dim=8, hidden=48, max_len=64)  # fmt: skip
  folder = write_folder(str(tmp_path / "b"), cfg=small)  # its BPE has 300 tokens
  with pytest.raises(
    HindsightError, match="holds 300 tokens, more than the model's vocab_size 290"
  ):
    hf.load_hf(folder)


@pytest.mark.slow
def test_lm_serve_says_what_it_does_and_ctrl_c_stops_it(folder):
  """The process boundary: its start is narrated, and SIGINT is a stop, not a resume."""
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE, PYTHONUNBUFFERED="1")
  proc = subprocess.Popen(
    [*HINDSIGHT, "lm", "serve", "--lm", folder, "--port", "8193", "--served-model-name",
     "mine", "--max-batch", "4"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
    stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  try:
    lines = []
    deadline = time.time() + 240
    while not any("on http://127.0.0.1:8193/v1" in line for line in lines):
      assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
      lines.append(proc.stdout.readline())
    text = "".join(lines)
    assert "loading" in text and "context 512 tokens, 4 slots" in text
    assert "compiling its" in text and "compiled in" in text
    # The address is said once the socket listens: a client that read it connects at once.
    assert httpx.get("http://127.0.0.1:8193/v1/models").json()["data"][0]["id"] == "mine"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "hindsight: stopped" in err and "resume" not in err, err
  finally:
    proc.kill()  # a failed assertion leaves no server holding the port


def test_choices_of_one_prompt_share_its_prefill_and_an_overwritten_one_is_prefilled_again(
  folder,
):
  """The engine's prefix sharing, held against the in-process sampler's draws under the same
  keys: n choices of a prompt cost one prefill; a later request for a prompt a free slot still
  holds costs none; a prompt whose slots were all overwritten is prefilled again (never read
  stale); a prompt that extends a running one gets its own continuation."""
  from hindsight.lm.engine import Row, SlotEngine
  from hindsight.lm.train import load_lm

  engine = SlotEngine(load_lm(folder), slots=4)
  a = tok_ids(folder, "Problem 3: three boxes hold 1, 2 and 3 apples.")
  b = a + tok_ids(folder, " Box one holds 1.")[1:]  # a's prefix, then more

  def rows(ids, seed, n, budget=12):
    return [Row(np.asarray(ids, np.int32), budget, 1.0, 1.0,
                jax.random.fold_in(jax.random.key(seed), j)) for j in range(n)]  # fmt: skip

  def drawn(ids, seed, n, budget=12):
    return [t.tolist() for t in _draws(folder, ids, seed, n, budget)[0]]

  def tokens(results):
    return [t.tolist() for t, _ in results]

  def spent():
    return engine.stats["prefill_tokens"], engine.stats["reused_tokens"]

  try:
    assert tokens(engine.complete(rows(a, 1, 3))) == drawn(a, 1, 3)
    assert spent() == (len(a), 2 * len(a))  # one prefill, two forks
    assert tokens(engine.complete(rows(a, 2, 1))) == drawn(a, 2, 1)
    assert spent() == (len(a), 3 * len(a))  # a free slot still held a: nothing prefilled
    others = [tok_ids(folder, f"Problem {k}: boxes hold {k} apples.") for k in range(4, 8)]
    engine.complete([r for k, ids in enumerate(others) for r in rows(ids, k, 1)])
    assert a not in [list(np.frombuffer(key, np.int32)) for key in engine.held]
    prefilled = spent()[0]
    assert tokens(engine.complete(rows(a, 1, 1))) == drawn(a, 1, 1)
    assert spent()[0] == prefilled + len(a)  # overwritten: prefilled anew
    both = engine.complete(rows(a, 5, 2, budget=40) + rows(b, 5, 2))
    assert tokens(both) == drawn(a, 5, 2, budget=40) + drawn(b, 5, 2)
  finally:
    engine.close()


def test_a_trace_s_prefixes_cost_one_prefill_of_the_trace_and_draw_what_unshared_rows_draw(
  folder,
):
  """Pools of a trace's prefixes x_0 .. x_3 (K = 3 each, one call, as the labeler sends them):
  x_0 is prefilled, each x_{t+1} runs only its new step against x_t's cache (`extends`), and
  the rest fork, so the whole call computes len(x_3) prompt tokens; every row draws what it
  draws prefilled on its own. A later prompt extending a prefix held by a running choice
  extends it and gets its own continuation; once every slot holding the prefix is
  overwritten, the prompt is prefilled whole (never read stale)."""
  from hindsight.lm.engine import Row, SlotEngine
  from hindsight.lm.train import load_lm

  lm = load_lm(folder)
  steps = ["Problem 3: three boxes hold 1, 2 and 3 apples.", " Box one holds 1.",
           " Box two holds 2.", " So 6."]  # fmt: skip
  prefixes = [np.asarray(tok_ids(folder, "".join(steps[: t + 1])), np.int32) for t in range(4)]
  assert all(x[: p.size].tolist() == p.tolist() for p, x in itertools.pairwise(prefixes))

  def row(ids, seed, budget=10, temperature=0.05):
    return Row(ids, budget, temperature, 1.0, jax.random.fold_in(jax.random.key(seed), 0))

  def alone(rows):
    """Each row on an engine of its own (prefilled whole, nothing shared)."""
    single = SlotEngine(lm, slots=1)
    try:
      return [single.complete([r])[0][0].tolist() for r in rows]
    finally:
      single.close()

  engine = SlotEngine(lm, slots=16, min_shared=8)
  try:
    pools = [row(x, 10 * t + k, temperature=1.0) for t, x in enumerate(prefixes) for k in range(3)]
    got = [t.tolist() for t, _ in engine.complete(pools)]
    assert got == alone(pools)
    assert engine.stats["prefill_tokens"] == prefixes[-1].size
    assert engine.stats["prefills"] == 1 and engine.stats["extends"] == 3
    assert engine.stats["reused_tokens"] == 3 * sum(x.size for x in prefixes) - prefixes[-1].size
  finally:
    engine.close()

  engine = SlotEngine(lm, slots=2, min_shared=8)
  longer = np.concatenate([prefixes[1], prefixes[3][prefixes[1].size :][::-1]])
  # A seed whose choice of x_1 runs its whole budget of 80 tokens (10 decode calls).
  seed = next(s for s in range(40) if len(_draws(folder, prefixes[1], s, 1, 80)[0][0]) == 80)
  ended, all_done = [], threading.Event()

  def done_as(name):
    def done(tokens, reason):
      ended.append((name, tokens.tolist()))
      all_done.set() if len(ended) == 2 else None

    return done

  try:
    engine.submit([dataclasses.replace(row(prefixes[1], seed, 80, 1.0), done=done_as("long"))])
    while engine.stats["decode_calls"] == 0:
      time.sleep(0.01)
    engine.submit([dataclasses.replace(row(longer, 2, temperature=1.0), done=done_as("short"))])
    assert all_done.wait(120)
    assert [name for name, _ in ended] == ["short", "long"]  # admitted while x_1 decoded
    assert engine.stats["extends"] == 1
    assert engine.stats["reused_tokens"] == prefixes[1].size
    assert ended[0][1] == alone([row(longer, 2, temperature=1.0)])[0]
    # The running choice the extend copied from went on undisturbed.
    assert ended[1][1] == _draws(folder, prefixes[1], seed, 1, 80)[0][0].tolist()
    # Both slots overwritten by prompts sharing nothing with x_1: a prompt extending x_1 is
    # prefilled whole.
    others = [np.asarray(tok_ids(folder, f"{k} boxes."), np.int32) for k in (4, 5)]
    engine.complete([row(others[0], 3), row(others[1], 4)])
    before = engine.stats["prefill_tokens"]
    got = engine.complete([row(longer, 5)])
    assert engine.stats["prefill_tokens"] - before == longer.size
    assert [t.tolist() for t, _ in got] == alone([row(longer, 5)])
  finally:
    engine.close()


def test_an_extend_reads_its_own_slot_never_a_stale_or_overwritten_one(folder):
  """The usual case, x_{t+1} after x_t's choices ended: it extends x_t in x_t's own slot. A
  prompt that is a strict prefix of the held one reuses all but its last token (whose logits
  it needs), and the next prompt reuses only what that slot now holds, not the longer prompt
  it held before. A held prefix whose slot another row of the same admit overwrites is not
  read: the prompt is prefilled whole. Every row draws what it draws on an engine of its
  own."""
  from hindsight.lm.engine import Row, SlotEngine
  from hindsight.lm.train import load_lm

  lm = load_lm(folder)
  text = "Problem 3: three boxes hold 1, 2 and 3 apples. Box one holds 1. Box two holds 2."
  x = {n: np.asarray(tok_ids(folder, text)[:n], np.int32) for n in (12, 20, 28)}
  other = np.asarray(tok_ids(folder, "Problem 9: boxes hold 5 and 6 and 7 pears each."), np.int32)

  def row(ids, seed):
    return Row(ids, 8, 1.0, 1.0, jax.random.fold_in(jax.random.key(seed), 0))

  def alone(r):
    single = SlotEngine(lm, slots=1)
    try:
      return single.complete([r])[0][0].tolist()
    finally:
      single.close()

  def spent(engine, rows):
    before = dict(engine.stats)
    got = [t.tolist() for t, _ in engine.complete(rows)]
    assert got == [alone(r) for r in rows]
    return {k: engine.stats[k] - before[k] for k in ("prefill_tokens", "reused_tokens", "extends")}

  engine = SlotEngine(lm, slots=1, min_shared=8)
  try:
    spent(engine, [row(x[20], 1)])
    assert spent(engine, [row(x[28], 2)]) == {"prefill_tokens": 8, "reused_tokens": 20,
                                              "extends": 1}  # fmt: skip
    assert spent(engine, [row(x[12], 3)]) == {"prefill_tokens": 1, "reused_tokens": 11,
                                              "extends": 1}  # fmt: skip
    # The slot holds x_12 now, not x_28: 12 tokens are reused, not 27.
    assert spent(engine, [row(x[20], 4)]) == {"prefill_tokens": 8, "reused_tokens": 12,
                                              "extends": 1}  # fmt: skip
  finally:
    engine.close()
  engine = SlotEngine(lm, slots=2, min_shared=8)
  try:
    spent(engine, [row(x[20], 5)])  # slot 0 holds x_20
    # `other` takes slot 0 (the lowest free) and x_28 slot 1: x_20 is overwritten first.
    assert spent(engine, [row(other, 6), row(x[28], 7)]) == {
      "prefill_tokens": other.size + 28,
      "reused_tokens": 0,
      "extends": 0,
    }
  finally:
    engine.close()


def test_warmup_compiles_every_program_the_engine_runs(folder):
  """`warmup` compiles one prefill and one extend program per (row bucket, prompt bucket), a
  fork per row bucket and a decode per (window, width), as many as `program_count` says."""
  from hindsight.lm.engine import SlotEngine
  from hindsight.lm.sample import prompt_buckets
  from hindsight.lm.train import load_lm

  # An architecture no other test of the module compiles: the programs are shared by every
  # engine of one architecture in the process.
  engine = SlotEngine(load_lm(folder, max_len=480), slots=1)
  try:
    before = engine._prefill._cache_size(), engine._extend._cache_size()
    assert engine.warmup() == engine.program_count()
    buckets = len(prompt_buckets(engine.cfg.max_len))
    # (The fork's program is jit's of a module-level function, whose cache other engines of
    # the process share: not counted here.)
    assert before == (0, 0)
    assert engine._prefill._cache_size() == engine._extend._cache_size() == buckets
    assert len(engine._decode) == len(engine.windows())  # one width: one slot
    assert all(p._cache_size() == 1 for p in engine._decode.values())
  finally:
    engine.close()


def test_the_in_process_pools_prefill_each_prefix_once_and_draw_what_unshared_rows_draw(folder):
  """`PolicySampler.complete` on pools (K rows of each prefix, as the LM RL credit sends them)
  prefills each distinct prefix once per call and draws, row for row, what the static
  sampler draws with every row prefilled on its own (EOS kept, as the policy drew it); a new
  state is sampled from at once (no cache row of the old one is reused)."""
  from hindsight.lm import sample
  from hindsight.lm.rl.rollout import PolicySampler
  from hindsight.lm.train import load_lm

  lm = load_lm(folder)
  a = np.asarray(tok_ids(folder, "Problem 3: three boxes hold 1, 2 and 3 apples."), np.int32)
  b = np.asarray(tok_ids(folder, "Problem 5: boxes hold 4 and 9."), np.int32)
  prompts = [a] * 3 + [b] * 3 + [a]
  keys = jax.numpy.stack([jax.random.fold_in(jax.random.key(9), j) for j in range(7)])

  def static(state):
    padded, lengths = sample.pad_prompts(prompts, lm.cfg.max_len)
    R = padded.shape[0]
    pick = np.array([*range(7)] + [0] * (R - 7))
    out, count, _ = sample.sampler(lm.graphdef, lm.cfg)(
      state, padded, lengths, np.full(R, 300, np.int32), np.ones(R, np.float32),
      np.ones(R, np.float32), keys[pick],
    )  # fmt: skip
    return [np.asarray(out[r, : int(count[r])]).tolist() for r in range(7)]

  sampler = PolicySampler(lm.graphdef, lm.cfg, slots=4)
  shared = sampler.complete(lm.state, prompts, [300] * 7, keys)
  assert [x.tolist() for x in shared] == static(lm.state)
  assert any(x[-1] in lm.cfg.eos_ids for x in shared)  # an EOS drawn is kept
  stats = sampler.engine(lm.state).stats
  assert stats["prefill_tokens"] == a.size + b.size  # once per prefix in the call
  # Another state: the same rows draw what it draws, none forked from the old state's cache.
  other = jax.tree.map(lambda x: x * 1.5, lm.state)
  again = sampler.complete(other, prompts, [300] * 7, keys)
  assert [x.tolist() for x in again] == static(other) != static(lm.state)
  assert sampler.engine(other).stats["prefill_tokens"] == 2 * (a.size + b.size)


def _plain_loop(lm, ids, key, budget: int, temperature: float, top_p: float) -> list[int]:
  """A choice drawn outside the engine's sampling code: the forward on the whole sequence at
  every token, softmax(logits / T) cut to the smallest set reaching top_p (NumPy), and JAX's
  categorical draw with fold_in(key, i) (T = 0: the argmax); EOS or the budget ends it."""
  out: list[int] = []
  for i in range(budget):
    seq = np.asarray([*ids, *out], np.int32)[None]
    logits = np.asarray(backbone.forward(lm.model, lm.cfg, seq)[0][0, -1], np.float64)
    if temperature == 0:
      token = int(np.argmax(logits))
    else:
      scaled = logits / temperature
      order = np.argsort(-scaled, kind="stable")
      probs = np.exp(scaled[order] - scaled[order].max())
      probs /= probs.sum()
      keep = np.zeros(scaled.size, bool)
      keep[order] = np.cumsum(probs) - probs < top_p
      masked = np.where(keep, scaled, -np.inf).astype(np.float32)
      token = int(jax.random.categorical(jax.random.fold_in(key, i), masked))
    if token in lm.cfg.eos_ids:
      break
    out.append(token)
  return out


@SERVER
def test_mixed_sampling_settings_in_one_batch_draw_what_a_plain_loop_draws(served, folder):
  """Rows of different temperature and top_p share the engine's calls (one admit, one decode
  program), and each draws what `_plain_loop` draws with its own settings; the server passes
  a request's temperature and top_p through."""
  from hindsight.lm.engine import Row, SlotEngine
  from hindsight.lm.train import load_lm

  lm = load_lm(folder)
  ids = tok_ids(folder, "Problem 3: three boxes hold 1, 2 and 3 apples.")
  settings = [(1.0, 1.0), (0.5, 1.0), (1.0, 0.6), (0.0, 1.0), (1.7, 0.9)]
  engine = SlotEngine(lm, slots=len(settings))
  try:
    rows = [Row(np.asarray(ids, np.int32), 10, t, p, jax.random.fold_in(jax.random.key(3), j))
            for j, (t, p) in enumerate(settings)]  # fmt: skip
    got = engine.complete(rows)
    assert engine.stats["prefills"] + engine.stats["forks"] <= 2  # one admit
  finally:
    engine.close()
  expected = [_plain_loop(lm, ids, r.key, 10, r.temperature, r.top_p) for r in rows]
  assert [t.tolist() for t, _ in got] == expected
  assert len({tuple(x) for x in expected}) >= 4  # the settings drew different choices
  url, name = served
  answer = _post(url, "/v1/completions", {"model": name, "prompt": ids, "seed": 11,
                                          "temperature": 0.6, "top_p": 0.7,
                                          "max_tokens": 10}).json()  # fmt: skip
  plain = _plain_loop(lm, ids, jax.random.fold_in(jax.random.key(11), 0), 10, 0.6, 0.7)
  assert answer["choices"][0]["text"] == lm.tokenizer.decode(plain)


def test_a_freed_slot_is_refilled_while_a_long_choice_runs(folder):
  """Continuous, not static, batching: with 2 slots, one long choice and 8 one-token ones
  queued behind it, the short ones pass through the second slot while the long one decodes,
  so most end before it does (a static batch would hold them until it ends)."""
  import threading

  from hindsight.lm.engine import Row, SlotEngine
  from hindsight.lm.train import load_lm

  lm = load_lm(folder)
  ids = np.asarray(tok_ids(folder, "Problem 3: three boxes hold 1, 2 and 3 apples."), np.int32)
  # A seed whose choice runs its whole budget of 80 tokens (10 decode calls) without EOS.
  seed = next(s for s in range(40) if len(_draws(folder, ids, s, 1, 80)[0][0]) == 80)
  ended, lock, all_done = [], threading.Lock(), threading.Event()

  def done_as(name):
    def done(tokens, reason):
      with lock:
        ended.append(name)
        if len(ended) == 9:
          all_done.set()

    return done

  engine = SlotEngine(lm, slots=2)
  try:
    long = jax.random.fold_in(jax.random.key(seed), 0)
    rows = [Row(ids, 80, 1.0, 1.0, long, done_as("long"))]
    rows += [Row(ids[:-k], 1, 1.0, 1.0, jax.random.key(k), done_as(f"short{k}"))
             for k in range(1, 9)]  # fmt: skip
    engine.submit(rows)
    assert all_done.wait(120)
  finally:
    engine.close()
  assert ended.index("long") >= 6, ended


def test_an_admit_never_forks_from_a_slot_it_overwrites_and_more_than_64_forks_chunk(folder):
  """A free slot holding p2 is given to p3 while p2 is wanted in the same admit: p2 must be
  prefilled, not forked from the row p3 just overwrote (at a low temperature the draws tell
  a wrong cache row apart). And 80 choices of one prompt fork in two calls (64 + 15)."""
  from hindsight.lm.engine import Row, SlotEngine
  from hindsight.lm.train import load_lm

  lm = load_lm(folder)
  p1, p2, p3 = (np.asarray(tok_ids(folder, f"Problem {k}: boxes hold {k} and {k + 1}."), np.int32)
                for k in (3, 4, 5))  # fmt: skip

  def row(ids, seed, budget=8):
    return Row(ids, budget, 0.05, 1.0, jax.random.fold_in(jax.random.key(seed), 0))

  def alone(ids, seed, budget=8):
    """The same row on an engine of its own (prefilled, nothing to fork)."""
    single = SlotEngine(lm, slots=1)
    try:
      return single.complete([row(ids, seed, budget)])[0][0].tolist()
    finally:
      single.close()

  engine = SlotEngine(lm, slots=2)
  try:
    engine.complete([row(p1, 1), row(p2, 2)])  # slot 0 holds p1, slot 1 holds p2
    before = engine.stats["prefill_tokens"]
    got = engine.complete([row(p3, 3), row(p2, 4)])  # p3 -> slot 0; p2 in place in slot 1
    assert [t.tolist() for t, _ in got] == [alone(p3, 3), alone(p2, 4)]
    assert engine.stats["prefill_tokens"] - before == p3.size
    got = engine.complete([row(p1, 5), row(p1, 6)])  # p1's slot was overwritten by p3
    assert [t.tolist() for t, _ in got] == [alone(p1, 5), alone(p1, 6)]
    assert engine.stats["prefill_tokens"] - before == p3.size + p1.size
  finally:
    engine.close()
  wide = SlotEngine(lm, slots=80)
  try:
    got = wide.complete([row(p1, 100 + j) for j in range(80)])
    assert wide.stats["forks"] == 2 and wide.stats["prefill_tokens"] == p1.size
    assert [t.tolist() for t, _ in got][::13] == [alone(p1, 100 + j) for j in range(0, 80, 13)]
  finally:
    wide.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_failed_worker_ends_every_row_and_the_engine_serves_again(folder, monkeypatch):
  """A program that fails ends the rows it held and those still waiting with an error (none
  is left waiting forever), a prompt past the context is refused in the caller, and a busy
  engine keeps its state."""
  import concurrent.futures

  from hindsight.lm.engine import Row, SlotEngine
  from hindsight.lm.train import load_lm

  lm = load_lm(folder)
  ids = np.asarray(tok_ids(folder, "Problem 3: boxes hold 1 and 2."), np.int32)
  rows = [Row(ids, 6, 1.0, 1.0, jax.random.key(j)) for j in range(4)]
  engine = SlotEngine(lm, slots=2)
  try:
    with pytest.raises(HindsightError, match="a prompt of 600 tokens; the model's context is 512"):
      engine.submit([Row(np.ones(600, np.int32), 4, 1.0, 1.0, jax.random.key(0))])
    step = SlotEngine._step
    calls = []

    def failing(self):
      calls.append(1)
      if len(calls) == 2:
        raise RuntimeError("a device error")
      return step(self)

    monkeypatch.setattr(SlotEngine, "_step", failing)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      future = pool.submit(engine.complete, rows)
      with pytest.raises(HindsightError, match="failed while sampling"):
        future.result(timeout=120)
    monkeypatch.setattr(SlotEngine, "_step", step)
    assert not engine.waiting and all(o is None for o in engine.owner)
    engine.set_state(lm.state)  # idle again
    again = engine.complete(rows)  # a fresh worker serves every row
    assert all(reason in ("eos", "length") for _, reason in again)
    done = concurrent.futures.Future()
    engine.submit([Row(ids, 200, 1.0, 1.0, jax.random.key(9),
                       lambda tokens, reason: done.set_result(reason))])  # fmt: skip
    with pytest.raises(RuntimeError, match="busy"):
      engine.set_state(lm.state)
    done.result(timeout=120)
  finally:
    engine.close()
