"""`hindsight lm serve`: a language model behind an OpenAI-compatible `/v1/completions`.

The model is a `hindsight lm train` workdir or a Hugging Face Qwen2 / Llama 3 folder
(`--lm PATH`, `train.load_lm`). Request fields (those of vLLM and SGLang that matter here;
docs/text.md): `prompt` (a string or a list; choices come back prompt-major), `n`,
`max_tokens` (default: the rest of the context), `temperature`, `top_p`, `seed` (choice j
draws with fold_in(key(seed), j), so a seeded request is reproducible), `stop` (the text is
cut before the first stop string, finish_reason "stop"), `echo`; `logprobs` is answered with
null, `stream` refused. A choice ends with finish_reason "stop" at EOS or a stop string,
"length" at its token budget.

Batching is continuous (`engine.SlotEngine`): every choice of every request takes one of
`max_batch` slots as one frees, so throughput grows with concurrency up to the slots. Bad
requests are a 4xx with one line: a body that is not a request, an unknown model, n out of
[1, 256], a prompt that is not valid UTF-8 or fills the context. `GET /stats` counts
requests, completions, decode calls, prefills and the most slots live at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

import jax
import msgspec

from hindsight.errors import HindsightError
from hindsight.lm.engine import Row, SlotEngine, failed
from hindsight.text.server import (
  CompletionRequest,
  completion_body,
  completions_app,
  error_response,
  read_completion_request,
)

MAX_BATCH = 64  # slots: choices sampled at once


def open_engine(path: str, max_batch: int = MAX_BATCH, max_len: int | None = None) -> SlotEngine:
  """The slot engine over the model at `path` (`train.load_lm`)."""
  from hindsight.lm.train import load_lm

  if max_batch < 1:
    raise HindsightError(f"max_batch must be >= 1, got {max_batch}")
  return SlotEngine(load_lm(path, max_len), slots=max_batch)


def _key(seed: int | None, j: int) -> jax.Array:
  if seed is None:
    seed = int.from_bytes(os.urandom(4), "little")
  return jax.random.fold_in(jax.random.key(seed & 0x7FFFFFFF), j)


def _submit(engine: SlotEngine, rows: list[Row]) -> asyncio.Future:
  """A future of every row's (tokens, ended by EOS), in order, once all have ended."""
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


def create_app(engine: SlotEngine):
  """The Starlette app: POST /v1/completions, GET /v1/models, GET /stats."""
  from starlette.requests import Request
  from starlette.responses import JSONResponse

  stats = engine.stats  # the engine's counters, and the requests' beside them
  stats.update(requests=0, completions=0)
  decoder = msgspec.json.Decoder(CompletionRequest)
  name = engine.lm.name
  tokenizer = engine.lm.tokenizer
  max_len = engine.cfg.max_len

  async def completions(request: Request):
    parsed = await read_completion_request(request, decoder, name)
    if not isinstance(parsed, tuple):
      return parsed
    req, prompts = parsed
    if not prompts:
      return error_response(400, "prompt is empty")
    try:
      encoded = tokenizer.encode_batch(prompts, start=True)
    except HindsightError as e:
      return error_response(400, f"prompt: {e}")
    rows = []
    for i, ids in enumerate(encoded):
      if ids.size == 0:
        return error_response(400, f"prompt {i} is empty")
      room = max_len - ids.size
      if room < 1:
        return error_response(
          400, f"prompt {i} is {ids.size} tokens; the model's context is {max_len}"
        )
      budget = room if req.max_tokens is None else min(req.max_tokens, room)
      for j in range(req.n):
        rows.append(Row(ids, budget, req.temperature, req.top_p, _key(req.seed, j)))
    try:
      results = await _submit(engine, rows)
    except HindsightError as e:
      return error_response(500, str(e))
    stops = [req.stop] if isinstance(req.stop, str) else [s for s in req.stop or [] if s]
    choices, used = [], 0
    for index, (tokens, eos) in enumerate(results):
      text = tokenizer.decode(tokens)
      finish = "stop" if eos else "length"
      cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
      if cut >= 0:
        text, finish = text[:cut], "stop"
      used += int(tokens.size)
      prompt = prompts[index // req.n]
      choices.append({"index": index, "text": (prompt + text) if req.echo else text,
                      "finish_reason": finish, "logprobs": None})  # fmt: skip
    stats["requests"] += 1
    stats["completions"] += len(choices)
    prompt_tokens = int(sum(x.size for x in encoded))
    return JSONResponse(completion_body(req, stats["requests"], choices, prompt_tokens, used))

  return completions_app(completions, name, stats)


def serve_lm(path: str, host: str = "127.0.0.1", port: int = 8101, warmup: bool = True,
             max_batch: int = MAX_BATCH, max_len: int | None = None):  # fmt: skip
  """Serves the model at `path` until SIGTERM/SIGINT."""
  import uvicorn

  engine = open_engine(path, max_batch, max_len)
  if warmup:
    engine.warmup()
  server = uvicorn.Server(uvicorn.Config(create_app(engine), host=host, port=port,
                                         log_level="warning"))  # fmt: skip
  print(f"hindsight: {engine.lm.name} on http://{host}:{port}/v1", flush=True)
  try:
    server.run()
  finally:
    engine.close()


@contextlib.contextmanager
def running_lm(path: str, host: str = "127.0.0.1", port: int = 0, warmup: bool = False,
               max_batch: int = MAX_BATCH):  # fmt: skip
  """The model served from a thread: yields (base URL http://HOST:PORT/v1, model name)."""
  from hindsight.text.server import running_app

  engine = open_engine(path, max_batch)
  if warmup:
    engine.warmup()
  try:
    with running_app(create_app(engine), host, port) as url:
      yield url, engine.lm.name
  finally:
    engine.close()
