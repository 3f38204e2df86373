"""`hindsight lm serve`: a language model behind an OpenAI-compatible server, as vLLM serves it
for what a labeler or an RL loop asks of it.

The model is a `hindsight lm train` workdir or a Hugging Face Qwen2 / Llama 3 folder
(`--lm PATH`, `train.load_lm`), served under its folder's name or `--served-model-name`.
Routes (the protocol and its refusals: `serving.openai_protocol`):

  POST /v1/completions       `prompt` (a string, a list of strings, token ids or lists of
                             them; choices come back prompt-major), `n`, `max_tokens`
                             (default 16, as OpenAI's and vLLM's), `temperature`, `top_p`,
                             `seed` (choice j draws with fold_in(key(seed), j), so a seeded
                             request is reproducible), `stop` (decoding stops at the first
                             stop string: the text is cut before it, finish_reason "stop",
                             and `usage` counts the tokens up to it), `echo`
  POST /v1/chat/completions  `messages`, rendered with the folder's chat template
                             (`text.chat_template`; a model without one: 400; a content
                             given as text parts is their texts one per line, as vLLM's),
                             the same sampling fields (`max_completion_tokens` too, over
                             `max_tokens`; default: the rest of the context, as vLLM's)
  POST /tokenize             vLLM's: {"prompt" | "messages", "add_special_tokens"} ->
                             {"count", "max_model_len", "tokens"}  (the labeler measures
                             prefixes with it); POST /detokenize {"tokens"} -> {"prompt"}
  GET  /v1/models            the model with `max_model_len`; /v1/models/{id}, /health, /stats

A choice ends with finish_reason "stop" at EOS or a stop string, "length" at its token budget.
A prompt that fills the context, or prompt + max_tokens over it, is a 400 (vLLM's message);
`logprobs` and `stream` are refused (400), and so is any field the protocol does not know.

Batching is continuous (`engine.SlotEngine`): every choice of every request takes one of
`max_batch` slots as one frees, so throughput grows with concurrency up to the slots; a
prompt some slot's cache holds (another choice of the request, an earlier request's) is
copied, not prefilled again, and one that extends a held prompt (the next prefix of a
trace) runs only its new tokens. `GET /stats` counts requests, completions, decode calls,
prefills, extends, forks, prompt tokens computed and reused, choices ended by a stop string
and the most slots live at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import jax
import msgspec
import numpy as np

from hindsight.errors import HindsightError
from hindsight.lm.engine import EOS, STOP, Row, SlotEngine, failed
from hindsight.serving.openai_protocol import (
  DEFAULT_MAX_TOKENS,
  CompletionRequest,
  Refusal,
  SamplingRequest,
  check_model,
  check_request,
  completion_body,
  prompts_of,
  protocol_app,
  read_request,
)

MAX_BATCH = 64  # slots: choices sampled at once


class ChatRequest(SamplingRequest, kw_only=True):
  """A POST /v1/chat/completions body: the shared sampling fields and chat's own."""

  messages: list[dict]
  max_completion_tokens: int | None = None
  logprobs: bool | None = None
  top_logprobs: int | None = None
  add_generation_prompt: bool = True


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
  """vLLM's POST /tokenize: a prompt, or chat messages (with the chat template)."""

  model: str | None = None
  prompt: str | None = None
  messages: list[dict] | None = None
  add_special_tokens: bool = True
  add_generation_prompt: bool = True


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
  model: str | None = None
  tokens: list[int] = []


def open_engine(path: str, max_batch: int = MAX_BATCH, max_len: int | None = None,
                by_length: bool = True) -> SlotEngine:  # fmt: skip
  """The slot engine over the model at `path` (`train.load_lm`); by_length: the engine's
  decode (`SlotEngine`; False only for eval/bench_text.py's comparison)."""
  from hindsight.lm.train import load_lm

  if max_batch < 1:
    raise HindsightError(f"max_batch must be >= 1, got {max_batch}")
  return SlotEngine(load_lm(path, max_len), slots=max_batch, by_length=by_length)


def _key(seed: int | None, j: int) -> jax.Array:
  if seed is None:
    seed = int.from_bytes(os.urandom(4), "little")
  return jax.random.fold_in(jax.random.key(seed & 0x7FFFFFFF), j)


def _submit(engine: SlotEngine, rows: list[Row]) -> asyncio.Future:
  """A future of every row's (tokens, why it ended), in order, once all have ended."""
  loop = asyncio.get_running_loop()
  fut = loop.create_future()

  def finish(out):  # on the event loop
    try:
      failed(out)
      fut.set_result(out)
    except HindsightError as e:
      fut.set_exception(e)

  engine.submit_all(rows, lambda out: loop.call_soon_threadsafe(finish, out))
  return fut


def create_app(engine: SlotEngine, name: str | None = None):
  """The Starlette app (module docstring's routes), serving the model as `name` (default its
  own name)."""
  from starlette.responses import JSONResponse

  from hindsight.text.chat_template import ChatTemplate

  stats = engine.stats  # the engine's counters, and the requests' beside them
  stats.update(requests=0, completions=0)
  name = name or engine.lm.name
  tokenizer, cfg = engine.lm.tokenizer, engine.cfg
  S, V = cfg.max_len, cfg.vocab_size
  chat = ChatTemplate.from_json(engine.lm.record.get("chat"))
  decoders = {
    kind: msgspec.json.Decoder(kind)
    for kind in (CompletionRequest, ChatRequest, TokenizeRequest, DetokenizeRequest)
  }

  def encode(prompts: list, start: bool) -> list[np.ndarray]:
    """Token ids of text prompts (start tokens where `start`) or id prompts, checked."""
    texts = [p for p in prompts if isinstance(p, str)]
    try:
      encoded = iter(tokenizer.encode_batch(texts, start=start))
    except HindsightError as e:
      raise Refusal(400, f"prompt: {e}") from None
    out = []
    for i, p in enumerate(prompts):
      ids = next(encoded) if isinstance(p, str) else np.asarray(p, np.int64)
      if ids.size and (ids.min() < 0 or ids.max() >= V):
        raise Refusal(400, f"prompt {i}: token ids must be in [0, {V})")
      if ids.size == 0:
        raise Refusal(400, f"prompt {i} is empty")
      out.append(ids.astype(np.int32))
    return out

  def rendered(messages: list[dict], add_generation_prompt: bool) -> str:
    if chat is None:
      raise Refusal(400, f"the model {name} has no chat template (its folder's "
                    "tokenizer_config.json names none): use /v1/completions")  # fmt: skip
    for i, m in enumerate(messages):
      if not isinstance(m.get("role"), str) or "content" not in m:
        raise Refusal(400, f"messages[{i}] needs a role and a content")
      if isinstance(m["content"], list):  # content parts: their texts, in order
        parts = m["content"]
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
          raise Refusal(400, f"messages[{i}]: only text content parts are served")
        texts = [p.get("text") for p in parts]
        if not all(t is None or isinstance(t, str) for t in texts):
          raise Refusal(400, f"messages[{i}]: a text part's text must be a string")
        # As vLLM hands a template that prints the content whole (its "string" content
        # format; vllm/entrypoints/chat_utils.py, _parse_chat_message_content_parts): the
        # texts one per line, a part without text skipped.
        m["content"] = "\n".join(t for t in texts if t is not None)
    try:
      return chat.render(messages, add_generation_prompt)
    except HindsightError as e:
      raise Refusal(400, str(e)) from None

  async def sample(req, encoded: list[np.ndarray], max_tokens: int | None, chat=False) -> list:
    """Every choice of every prompt: [(tokens, text, finish_reason)], prompt-major. Without
    max_tokens a completion draws DEFAULT_MAX_TOKENS, a chat answer the rest of the context
    (OpenAI's and vLLM's defaults)."""
    rows = []
    for i, ids in enumerate(encoded):
      budget = max_tokens or (S - ids.size if chat else DEFAULT_MAX_TOKENS)
      if ids.size >= S:
        raise Refusal(400, f"prompt {i} is {ids.size} tokens; the model's context is {S}")
      if ids.size + budget > S:
        raise Refusal(400, f"This model's maximum context length is {S} tokens. However, you "
                      f"requested {ids.size + budget} tokens ({ids.size} in the prompt, "
                      f"{budget} in the completion). Please reduce the length of the prompt "
                      "or completion.")  # fmt: skip
      for j in range(req.n):
        rows.append(Row(ids, budget, req.temperature, req.top_p, _key(req.seed, j),
                        stop=req.stops))  # fmt: skip
    try:
      results = await _submit(engine, rows)
    except HindsightError as e:
      raise Refusal(500, str(e), "internal_server_error") from None
    out = []
    for tokens, reason in results:
      text = tokenizer.decode(tokens)
      cut = min((i for i in (text.find(s) for s in req.stops) if i >= 0), default=-1)
      if cut >= 0:
        text = text[:cut]
      finish = "stop" if reason in (EOS, STOP) or cut >= 0 else "length"
      out.append((tokens, text, finish))
    return out

  def answer(req, choices: list, encoded: list, sampled: list, kind: str):
    stats["requests"] += 1
    stats["completions"] += len(choices)
    used = int(sum(tokens.size for tokens, _, _ in sampled))
    prompt_tokens = int(sum(x.size for x in encoded))
    return JSONResponse(completion_body(req, stats["requests"], choices, prompt_tokens, used,
                                        kind))  # fmt: skip

  async def completions(request):
    req = await read_request(request, decoders[CompletionRequest])
    check_request(req, name)
    prompts = prompts_of(req)
    encoded = encode(prompts, start=True)
    sampled = await sample(req, encoded, req.max_tokens)
    choices = []
    for index, (_, text, finish) in enumerate(sampled):
      prompt = prompts[index // req.n]
      if req.echo:
        text = (prompt if isinstance(prompt, str) else tokenizer.decode(prompt)) + text
      choices.append({"index": index, "text": text, "finish_reason": finish, "logprobs": None})
    return answer(req, choices, encoded, sampled, "text_completion")

  async def chat_completions(request):
    req = await read_request(request, decoders[ChatRequest])
    check_request(req, name)
    if req.top_logprobs is not None:
      raise Refusal(400, "top_logprobs is not supported by this server")
    if not req.messages:
      raise Refusal(400, "messages is empty")
    if req.max_completion_tokens is not None and req.max_completion_tokens < 1:
      raise Refusal(400, f"max_completion_tokens must be >= 1, got {req.max_completion_tokens}")
    prompt = rendered(req.messages, req.add_generation_prompt)
    # The template writes the start tokens it wants (vLLM adds none to a chat prompt).
    encoded = encode([prompt], start=False)
    sampled = await sample(req, encoded, req.max_completion_tokens or req.max_tokens, chat=True)
    choices = [{"index": i, "message": {"role": "assistant", "content": text},
                "finish_reason": finish, "logprobs": None}
               for i, (_, text, finish) in enumerate(sampled)]  # fmt: skip
    return answer(req, choices, encoded, sampled, "chat.completion")

  async def tokenize(request):
    req = await read_request(request, decoders[TokenizeRequest])
    check_model(req.model, name)
    if (req.prompt is None) == (req.messages is None):
      raise Refusal(400, "give prompt or messages (one of them)")
    if req.messages is not None:
      [ids] = encode([rendered(req.messages, req.add_generation_prompt)], start=False)
    else:
      try:
        ids = tokenizer.encode(req.prompt, start=req.add_special_tokens)
      except HindsightError as e:
        raise Refusal(400, f"prompt: {e}") from None
    return JSONResponse({"count": int(ids.size), "max_model_len": S, "tokens": ids.tolist()})

  async def detokenize(request):
    req = await read_request(request, decoders[DetokenizeRequest])
    check_model(req.model, name)
    if any(not 0 <= t < V for t in req.tokens):
      raise Refusal(400, f"token ids must be in [0, {V})")
    return JSONResponse({"prompt": tokenizer.decode(req.tokens)})

  routes = {"/v1/completions": completions, "/v1/chat/completions": chat_completions,
            "/tokenize": tokenize, "/detokenize": detokenize}  # fmt: skip
  return protocol_app(routes, name, stats, max_model_len=S)


def served_step(record: dict) -> str | None:
  """Which checkpoint of a `hindsight lm train` workdir is served, and whether its training
  finished (None for a Hugging Face folder)."""
  step, steps = record.get("step"), record.get("steps")
  if step is None:
    return None
  if steps is None:  # a workdir of an older hindsight: its target is not recorded
    return f"serving step {step}, the workdir's last checkpoint"
  if step < steps:
    return (f"serving step {step} of {steps}: its training is unfinished (rerun `hindsight "
            "lm train` on the workdir to resume it)")  # fmt: skip
  return f"serving step {step} of {steps} (its training finished)"


def serve_lm(path: str, host: str = "127.0.0.1", port: int = 8101, warmup: bool = True,
             max_batch: int = MAX_BATCH, max_len: int | None = None,
             name: str | None = None):  # fmt: skip
  """Serves the model at `path` until SIGTERM/SIGINT, saying what it does while it starts
  (which checkpoint of a workdir it serves, the address once it listens)."""
  from hindsight.lm.backbone import parameter_count
  from hindsight.serving.openai_protocol import serve_until_stopped

  def say(text: str) -> None:
    print(f"hindsight: {text}", flush=True)

  tic = time.perf_counter()
  say(f"loading {path}")
  engine = open_engine(path, max_batch, max_len)
  c = engine.cfg
  name = name or engine.lm.name
  say(
    f"{name}: a {c.arch} decoder of {parameter_count(engine.lm.model):,} parameters, context "
    f"{c.max_len} tokens, {engine.slots} slots (loaded in {time.perf_counter() - tic:.0f} s)"
  )
  served = served_step(engine.lm.record)
  if served:
    say(served)
  if warmup:
    tic = time.perf_counter()
    say(f"compiling its {engine.program_count()} programs (--no-warmup serves at once and "
        "compiles each on the first request that needs it)")  # fmt: skip
    engine.warmup()
    say(f"compiled in {time.perf_counter() - tic:.0f} s")
  listening = f"hindsight: {name} on http://{host}:{port}/v1 (Ctrl-C stops it)"
  try:
    serve_until_stopped(create_app(engine, name), host, port, listening)
  finally:
    engine.close()


@contextlib.contextmanager
def running_lm(path: str, host: str = "127.0.0.1", port: int = 0, warmup: bool = False,
               max_batch: int = MAX_BATCH, name: str | None = None,
               by_length: bool = True):  # fmt: skip
  """The model served from a thread: yields (base URL http://HOST:PORT/v1, model name)."""
  from hindsight.serving.openai_protocol import running_app

  engine = open_engine(path, max_batch, by_length=by_length)
  if warmup:
    engine.warmup()
  try:
    with running_app(create_app(engine, name), host, port) as url:
      yield url, name or engine.lm.name
  finally:
    engine.close()
