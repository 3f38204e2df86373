"""The text world behind an OpenAI-compatible `/v1/completions` endpoint, on loopback.

`hindsight text-world serve --port P` serves it; `running_world()` starts it in a thread
(tests, benchmarks, examples). A request's `prompt` is any prefix of a world trace (the
problem header and whole sentences); every choice continues it by parsing it back to the
state (`world.parse_prefix`) and sampling the scripted policy to the end of the episode.

The request fields of vLLM and SGLang that matter here are honoured: `prompt` (a string or a
list: choices come back flattened, prompt-major), `n`, `max_tokens` (tokens are words here;
a continuation cut short ends with finish_reason "length"), `temperature`, `top_p`, `seed`
(choice j of a seeded request draws from the generator seeded with (seed, j), so a seeded
request is reproducible at any concurrency), `stop`, `echo`. `logprobs` is accepted and
answered with null. `GET /stats` counts the requests and completions served (what a rerun
from the cache must leave unchanged).
"""

from __future__ import annotations

import contextlib
import threading
import time

import msgspec
import numpy as np

from hindsight.errors import HindsightError
from hindsight.text import world

DEFAULT_MAX_TOKENS = 512
MAX_N = 256


class CompletionRequest(msgspec.Struct):
  model: str
  prompt: str | list[str]
  n: int = 1
  max_tokens: int | None = None
  temperature: float = 1.0
  top_p: float = 1.0
  seed: int | None = None
  stop: str | list[str] | None = None
  echo: bool = False
  logprobs: int | None = None
  stream: bool = False
  user: str | None = None


def _words(text: str) -> int:
  return len(text.split())


def complete_one(
  prompt: str, state: world.WorldState, rng: np.random.Generator, req: CompletionRequest
) -> tuple[str, str, int]:
  """(text, finish_reason, completion tokens) of one choice continuing `prompt` (whose
  state is `state`)."""
  sentences = world.continue_prefix(state, rng, req.temperature, req.top_p)
  lead = "" if not sentences or prompt[-1:].isspace() else " "
  text = lead + " ".join(sentences)
  finish = "stop"
  stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
  cut = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
  if cut >= 0:
    text = text[:cut]
  limit = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
  words = text.split(" ")
  if _words(text) > limit:
    # Keep the first `limit` words (and the whitespace before them).
    kept, count = [], 0
    for w in words:
      count += bool(w)
      if count > limit:
        break
      kept.append(w)
    text, finish = " ".join(kept), "length"
  return text, finish, _words(text)


def request_error(req: CompletionRequest, model: str) -> tuple[int, str, str] | None:
  """(status, message, kind) of a request a completions server refuses, or None: another
  model, a stream, n outside [1, MAX_N], max_tokens < 1, a bad temperature or top_p."""
  if req.model != model:
    return 404, f"The model `{req.model}` does not exist.", "NotFoundError"
  if req.stream:
    return 400, "stream is not supported by this server", "invalid_request_error"
  if not 1 <= req.n <= MAX_N:
    return 400, f"n must be in [1, {MAX_N}], got {req.n}", "invalid_request_error"
  if req.max_tokens is not None and req.max_tokens < 1:
    return 400, f"max_tokens must be >= 1, got {req.max_tokens}", "invalid_request_error"
  if not (req.temperature >= 0 and 0 < req.top_p <= 1):
    return 400, "temperature must be >= 0 and top_p in (0, 1]", "invalid_request_error"
  return None


def error_response(status: int, message: str, kind: str = "invalid_request_error"):
  """An OpenAI-style error answer: {"error": {"message", "type"}} with `status`."""
  from starlette.responses import JSONResponse

  return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


async def read_completion_request(request, decoder, model: str):
  """(the request, its prompts as a list) of a POST /v1/completions, or the 400/404 answer
  that refuses it (a body that does not decode, or `request_error`)."""
  try:
    req = decoder.decode(await request.body())
  except msgspec.DecodeError as e:
    return error_response(400, f"bad request body: {e}")
  refused = request_error(req, model)
  if refused is not None:
    return error_response(*refused)
  return req, [req.prompt] if isinstance(req.prompt, str) else req.prompt


def completion_body(req: CompletionRequest, number: int, choices: list, prompt_tokens: int,
                    completion_tokens: int) -> dict:  # fmt: skip
  """The OpenAI `text_completion` answer to request number `number`."""
  return {
    "id": f"cmpl-{number}",
    "object": "text_completion",
    "created": int(time.time()),
    "model": req.model,
    "choices": choices,
    "usage": {
      "prompt_tokens": prompt_tokens,
      "completion_tokens": completion_tokens,
      "total_tokens": prompt_tokens + completion_tokens,
    },
  }


def create_app():
  """The Starlette app: POST /v1/completions, GET /v1/models, GET /stats."""
  from starlette.requests import Request
  from starlette.responses import JSONResponse

  stats = {"requests": 0, "completions": 0}
  decoder = msgspec.json.Decoder(CompletionRequest)

  async def completions(request: Request):
    parsed = await read_completion_request(request, decoder, world.MODEL_NAME)
    if not isinstance(parsed, tuple):
      return parsed
    req, prompts = parsed
    choices, used = [], 0
    for p_index, prompt in enumerate(prompts):
      try:
        state = world.parse_prefix(prompt)
      except HindsightError as e:
        return error_response(400, str(e))
      for j in range(req.n):
        rng = np.random.default_rng(None if req.seed is None else [req.seed & (2**63 - 1), j])
        text, finish, tokens = complete_one(prompt, state, rng, req)
        used += tokens
        index = p_index * req.n + j
        choices.append({"index": index, "text": (prompt + text) if req.echo else text,
                        "finish_reason": finish, "logprobs": None})  # fmt: skip
    stats["requests"] += 1
    stats["completions"] += len(choices)
    prompt_tokens = sum(_words(p) for p in prompts)
    return JSONResponse(completion_body(req, stats["requests"], choices, prompt_tokens, used))

  return completions_app(completions, world.MODEL_NAME, stats)


def completions_app(completions, model: str, stats: dict):
  """A Starlette app serving the handler `completions` at POST /v1/completions, the one
  `model` at GET /v1/models and the counters `stats` at GET /stats."""
  from starlette.applications import Starlette
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  async def models(request):
    del request
    return JSONResponse({"object": "list", "data": [{"id": model, "object": "model"}]})

  async def get_stats(request):
    del request
    return JSONResponse(dict(stats))

  return Starlette(
    routes=[
      Route("/v1/completions", completions, methods=["POST"]),
      Route("/v1/models", models, methods=["GET"]),
      Route("/stats", get_stats, methods=["GET"]),
    ]
  )


def _server(host: str, port: int):
  import uvicorn

  config = uvicorn.Config(create_app(), host=host, port=port, log_level="warning")
  return uvicorn.Server(config)


def serve_world(host: str = "127.0.0.1", port: int = 8100) -> None:
  """Serves the text world until SIGTERM/SIGINT."""
  world.policy_table(0.5)  # compile the policy before the first request waits for it
  server = _server(host, port)
  print(f"hindsight: text world (model {world.MODEL_NAME}) on http://{host}:{port}/v1", flush=True)
  server.run()


@contextlib.contextmanager
def running_world(host: str = "127.0.0.1", port: int = 0):
  """The text world served from a thread: yields its base URL (http://HOST:PORT/v1)."""
  with running_app(create_app(), host, port) as url:
    yield url


@contextlib.contextmanager
def running_app(app, host: str = "127.0.0.1", port: int = 0):
  """An ASGI app served by uvicorn from a thread: yields its base URL (http://HOST:PORT/v1)."""
  import uvicorn

  server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
  thread = threading.Thread(target=server.run, daemon=True)
  thread.start()
  deadline = time.monotonic() + 30
  while not server.started:
    if not thread.is_alive() or time.monotonic() > deadline:
      raise HindsightError(f"the server did not start on {host}:{port}")
    time.sleep(0.01)
  bound = server.servers[0].sockets[0].getsockname()[1]
  try:
    yield f"http://{host}:{bound}/v1"
  finally:
    server.should_exit = True
    thread.join(timeout=10)
