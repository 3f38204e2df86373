"""`hindsight lm serve`: the small language model behind an OpenAI-compatible `/v1/completions`.

Request fields (those of vLLM and SGLang that matter here; docs/text.md): `prompt` (a
string or a list; choices come back prompt-major), `n`, `max_tokens` (default: the rest of
the context), `temperature`, `top_p`, `seed` (choice j draws with fold_in(key(seed), j), so a
seeded request is reproducible), `stop` (the text is cut before the first stop string,
finish_reason "stop"), `echo`; `logprobs` is answered with null, `stream` refused. A choice
ends with finish_reason "stop" at EOS or a stop string, "length" at its token budget.

Batching: requests that arrive while the model is busy wait together, and the next call
samples all their choices at once (`sample.generate`: rows of every request, grouped by
prompt bucket, up to 64 rows per program). Bad requests are a 4xx with one line: a body that
is not a request, an unknown model, n out of [1, 256], a prompt that is not valid UTF-8 or
fills the context. `GET /stats` counts requests, completions and batched calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os

import jax
import msgspec
import numpy as np
from jax.sharding import PartitionSpec as P

from hindsight.errors import HindsightError
from hindsight.lm.sample import ROW_BUCKETS, ascii_bias, generate, pad_prompts, prompt_buckets
from hindsight.text.server import (
  CompletionRequest,
  completion_body,
  completions_app,
  error_response,
  read_completion_request,
)

MAX_ROWS = ROW_BUCKETS[-1]


@dataclasses.dataclass
class Row:
  """One choice to sample: prompt ids, token budget, sampling settings, key data."""

  ids: np.ndarray
  budget: int
  temperature: float
  top_p: float
  key: jax.Array


class Engine:
  """The model and its tokenizer; `complete(rows)` samples them (any number, any prompts)."""

  def __init__(self, workdir: str):
    from hindsight.lm.train import load_lm

    self.graphdef, self.state, self.tokenizer, record = load_lm(workdir)
    self.model_name = record["model"]
    self.max_len = int(record["lm_config"]["max_len"])
    self.bias = ascii_bias(self.tokenizer)  # the model writes ASCII, as it was trained to
    self.calls = 0
    # Rows are split over every local device (one per core under `hindsight`'s CLI): each
    # row's loop is independent, so a program runs on all cores with no communication.
    devices = jax.local_devices()
    self.mesh = jax.sharding.Mesh(np.array(devices), ("rows",))
    self.state = jax.device_put(self.state, jax.sharding.NamedSharding(self.mesh, P()))

  def warmup(self) -> int:
    """Compiles every (row bucket, prompt bucket) program; returns how many."""
    count = 0
    for rows in ROW_BUCKETS:
      for p in prompt_buckets(self.max_len):
        ids = [np.full(min(p, self.max_len - 1), 2, np.int32)] * rows
        self.complete([Row(x, 1, 1.0, 1.0, jax.random.key(0)) for x in ids])
        count += 1
    return count

  def complete(self, rows: list[Row]) -> list[tuple[np.ndarray, bool]]:
    """(token ids, ended by EOS) of every row, in order."""
    out: list = [None] * len(rows)
    buckets = prompt_buckets(self.max_len)
    by_bucket: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
      by_bucket.setdefault(next(p for p in buckets if p >= r.ids.size), []).append(i)
    pending = []
    for members in by_bucket.values():
      for start in range(0, len(members), MAX_ROWS):
        chunk = members[start : start + MAX_ROWS]
        ids, lengths = pad_prompts([rows[i].ids for i in chunk], self.max_len)
        R = ids.shape[0]
        pick = [rows[chunk[min(r, len(chunk) - 1)]] for r in range(R)]
        budgets = np.array([r.budget for r in pick], np.int32)
        temperature = np.array([r.temperature for r in pick], np.float32)
        top_p = np.array([r.top_p for r in pick], np.float32)
        keys = jax.numpy.stack([r.key for r in pick])
        args = (ids, lengths, budgets, temperature, top_p, keys)
        if R % self.mesh.size == 0:
          rows_sharding = jax.sharding.NamedSharding(self.mesh, P("rows"))
          args = jax.device_put(args, rows_sharding)
        args = (*args, self.bias)
        pending.append((chunk, generate(self.graphdef, self.state, *args)))
        self.calls += 1
    for chunk, (tokens, count, eos) in pending:
      tokens, count, eos = jax.device_get((tokens, count, eos))
      for r, i in enumerate(chunk):
        n = int(count[r]) - int(eos[r])  # EOS is not part of the text
        out[i] = (tokens[r, :n], bool(eos[r]))
    return out


def _key(seed: int | None, j: int) -> jax.Array:
  if seed is None:
    seed = int.from_bytes(os.urandom(4), "little")
  return jax.random.fold_in(jax.random.key(seed & 0x7FFFFFFF), j)


def create_app(engine: Engine):
  """The Starlette app: POST /v1/completions, GET /v1/models, GET /stats."""
  from starlette.requests import Request
  from starlette.responses import JSONResponse

  stats = {"requests": 0, "completions": 0, "batches": 0}
  decoder = msgspec.json.Decoder(CompletionRequest)
  queue: list[tuple[list[Row], asyncio.Future]] = []
  wake = asyncio.Event()
  worker: dict = {}

  async def batcher():
    loop = asyncio.get_running_loop()
    while True:
      await wake.wait()
      wake.clear()
      while queue:
        taken = queue[:]
        del queue[:]
        rows = [r for rows, _ in taken for r in rows]

        try:  # this one task makes every model call, one at a time
          results = await loop.run_in_executor(None, engine.complete, rows)
        except Exception as e:
          for _, fut in taken:
            fut.set_exception(e)
          continue
        stats["batches"] += 1
        at = 0
        for rows_, fut in taken:
          fut.set_result(results[at : at + len(rows_)])
          at += len(rows_)

  async def completions(request: Request):
    parsed = await read_completion_request(request, decoder, engine.model_name)
    if not isinstance(parsed, tuple):
      return parsed
    req, prompts = parsed
    if not prompts:
      return error_response(400, "prompt is empty")
    try:
      encoded = engine.tokenizer.encode_batch(prompts)
    except HindsightError as e:
      return error_response(400, f"prompt: {e}")
    rows = []
    for i, ids in enumerate(encoded):
      if ids.size == 0:
        return error_response(400, f"prompt {i} is empty")
      room = engine.max_len - ids.size
      if room < 1:
        return error_response(
          400, f"prompt {i} is {ids.size} tokens; the model's context is {engine.max_len}"
        )
      budget = room if req.max_tokens is None else min(req.max_tokens, room)
      for j in range(req.n):
        rows.append(Row(ids, budget, req.temperature, req.top_p, _key(req.seed, j)))
    if "task" not in worker:
      worker["task"] = asyncio.get_running_loop().create_task(batcher())
    fut = asyncio.get_running_loop().create_future()
    queue.append((rows, fut))
    wake.set()
    results = await fut
    stops = [req.stop] if isinstance(req.stop, str) else [s for s in req.stop or [] if s]
    choices, used = [], 0
    for index, (tokens, eos) in enumerate(results):
      text = engine.tokenizer.decode(tokens)
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

  return completions_app(completions, engine.model_name, stats)


def serve_lm(workdir: str, host: str = "127.0.0.1", port: int = 8101, warmup: bool = True):
  """Serves the model of `workdir` until SIGTERM/SIGINT."""
  import uvicorn

  engine = Engine(workdir)
  if warmup:
    engine.warmup()
  server = uvicorn.Server(uvicorn.Config(create_app(engine), host=host, port=port,
                                         log_level="warning"))  # fmt: skip
  print(f"hindsight: {engine.model_name} on http://{host}:{port}/v1", flush=True)
  server.run()


@contextlib.contextmanager
def running_lm(workdir: str, host: str = "127.0.0.1", port: int = 0, warmup: bool = False):
  """The model served from a thread: yields (base URL http://HOST:PORT/v1, model name)."""
  from hindsight.text.server import running_app

  engine = Engine(workdir)
  if warmup:
    engine.warmup()
  with running_app(create_app(engine), host, port) as url:
    yield url, engine.model_name
