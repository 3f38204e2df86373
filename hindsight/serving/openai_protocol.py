"""The OpenAI completions protocol both local servers speak (the text world, `hindsight.worlds.
server`; a language model, `hindsight.lm.server`), as vLLM serves it for the fields that
matter to a labeler or an RL loop:

  POST /v1/completions   `CompletionRequest` -> a `text_completion` body (`completion_body`)
  GET  /v1/models        the one model, with `max_model_len` (its context in tokens)
  GET  /v1/models/{id}   that model's card, or 404
  GET  /health           200 while the server is up
  GET  /stats            the server's counters

A request is refused with a 4xx and one line in OpenAI's error body, `{"error": {"message",
"type", "param", "code"}}` (`error_response`; the credit server answers in the same shape):
a body that does not decode or holds a field this protocol does not know (a typo, or an option
neither server implements), another model (404), n outside [1, MAX_N], a bad max_tokens,
temperature or top_p, `stream`, `logprobs`, and the vLLM sampling options left at anything
but their neutral value (`NEUTRAL`). Nothing is ignored silently.

Beside them, how either is served: `serve_until_stopped` (uvicorn until SIGTERM/SIGINT) and
`running_app` (from a thread, for tests and benchmarks).

JAX-free: the text world imports it, and so does the language model's server; it lives below
both (as vLLM's `entrypoints/openai/protocol.py` does), so neither reaches into the other.
"""

from __future__ import annotations

import contextlib
import threading
import time

import msgspec

from hindsight.errors import HindsightError, error_body

MAX_N = 256
# OpenAI's and vLLM's default max_tokens of /v1/completions.
DEFAULT_MAX_TOKENS = 16
# Options of vLLM's and OpenAI's requests that no server here implements: accepted at the
# value that means "off" (what a client sends by default), refused otherwise.
NEUTRAL = {
  "presence_penalty": 0.0,
  "frequency_penalty": 0.0,
  "repetition_penalty": 1.0,
  "top_k": -1,
  "min_p": 0.0,
  "best_of": None,
  "logit_bias": None,
  "suffix": None,
  "stream_options": None,
}


class SamplingRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
  """The fields a completions and a chat request share: the model, how many choices, how
  to sample them, and the options of `NEUTRAL` (accepted at their neutral values only)."""

  model: str
  n: int = 1
  max_tokens: int | None = None
  temperature: float = 1.0
  top_p: float = 1.0
  seed: int | None = None
  stop: str | list[str] | None = None
  stream: bool = False
  user: str | None = None
  presence_penalty: float = 0.0
  frequency_penalty: float = 0.0
  repetition_penalty: float = 1.0
  top_k: int = -1
  min_p: float = 0.0
  logit_bias: dict | None = None
  stream_options: dict | None = None

  @property
  def stops(self) -> tuple[str, ...]:
    """The stop strings (empty ones dropped)."""
    if isinstance(self.stop, str):
      return (self.stop,) if self.stop else ()
    return tuple(s for s in self.stop or () if s)


class CompletionRequest(SamplingRequest, kw_only=True):
  """A POST /v1/completions body. `prompt`: a string, a list of strings, a list of token
  ids, or a list of lists of token ids (`prompts_of`)."""

  prompt: str | list[str | int | list[int]]
  echo: bool = False
  logprobs: int | None = None
  best_of: int | None = None
  suffix: str | None = None


class Refusal(Exception):
  """A request refused with `status` and a one-line message of OpenAI's error `kind`."""

  def __init__(self, status: int, message: str, kind: str | None = None):
    super().__init__(message)
    self.status, self.kind = status, kind


def check_model(asked: str | None, model: str) -> None:
  """Refusal (404, OpenAI's message) of a request naming a model other than the one served
  (None: the request named none, as /tokenize may)."""
  if asked is not None and asked != model:
    raise Refusal(404, f"The model `{asked}` does not exist.", "NotFoundError")


def check_request(req, model: str) -> None:
  """Refusal of what neither server serves (module docstring); None if it may be served.
  `req`: a completions or chat request (their shared fields)."""
  check_model(req.model, model)
  if req.stream:
    raise Refusal(400, "stream is not supported by this server")
  logprobs = getattr(req, "logprobs", None)
  if logprobs is not None and logprobs is not False:  # 0 asks for them too
    raise Refusal(400, "logprobs is not supported by this server")
  if not 1 <= req.n <= MAX_N:
    raise Refusal(400, f"n must be in [1, {MAX_N}], got {req.n}")
  if req.max_tokens is not None and req.max_tokens < 1:
    raise Refusal(400, f"max_tokens must be >= 1, got {req.max_tokens}")
  if not (req.temperature >= 0 and 0 < req.top_p <= 1):
    raise Refusal(400, "temperature must be >= 0 and top_p in (0, 1]")
  for name, neutral in NEUTRAL.items():
    value = getattr(req, name, neutral)
    if value != neutral and not _also_neutral(name, value):
      shown = "left out" if neutral is None else f"{neutral}"
      raise Refusal(400, f"{name} is not supported by this server (it must be {shown})")


def _also_neutral(name: str, value) -> bool:
  """The other values clients send for "off": top_k 0 (OpenAI-style clients), best_of 1 (one
  candidate per choice), an empty logit_bias."""
  return (name, value) in (("top_k", 0), ("best_of", 1)) or (name == "logit_bias" and value == {})


def prompts_of(req: CompletionRequest) -> list[str | list[int]]:
  """The request's prompts: strings, or lists of token ids (Refusal: a mixed or empty list,
  an empty prompt)."""
  p = req.prompt
  if isinstance(p, str):
    out: list = [p]
  elif p and all(isinstance(x, str) for x in p):
    out = list(p)
  elif p and all(isinstance(x, int) for x in p):
    out = [list(p)]
  elif p and all(isinstance(x, list) for x in p):
    out = list(p)
  else:
    raise Refusal(400, "prompt must be a string, a list of strings, a list of token ids or "
                  "a list of lists of token ids (not empty, not mixed)")  # fmt: skip
  for i, x in enumerate(out):
    if not x:
      raise Refusal(400, f"prompt {i} is empty")
  return out


def error_response(status: int, message: str, kind: str | None = None):
  """OpenAI's error answer (`errors.error_body`) with `status`."""
  from starlette.responses import JSONResponse

  return JSONResponse(error_body(status, message, kind), status_code=status)


async def read_request(request, decoder):
  """The decoded body of a POST, or Refusal (400) naming what does not decode."""
  try:
    return decoder.decode(await request.body())
  except msgspec.DecodeError as e:  # ValidationError (a field of the wrong type) is one too
    raise Refusal(400, f"bad request body: {e}") from None


def completion_body(req, number: int, choices: list, prompt_tokens: int,
                    completion_tokens: int, kind: str = "text_completion") -> dict:  # fmt: skip
  """The OpenAI answer to request number `number` (a `text_completion`, or with kind
  "chat.completion" a chat answer)."""
  return {
    "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{number}",
    "object": kind,
    "created": int(time.time()),
    "model": req.model,
    "choices": choices,
    "usage": {
      "prompt_tokens": prompt_tokens,
      "completion_tokens": completion_tokens,
      "total_tokens": prompt_tokens + completion_tokens,
    },
  }


def model_card(model: str, max_model_len: int | None) -> dict:
  """A /v1/models entry as vLLM writes it."""
  card = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "hindsight",
          "root": model}  # fmt: skip
  if max_model_len is not None:
    card["max_model_len"] = int(max_model_len)
  return card


def protocol_app(routes: dict, model: str, stats: dict, max_model_len: int | None = None):
  """A Starlette app: the POST `routes` (path -> handler(request) -> answer or Refusal), and
  GET /v1/models, /v1/models/{id}, /health and /stats for the one `model`."""
  from starlette.applications import Starlette
  from starlette.exceptions import HTTPException
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  card = model_card(model, max_model_len)

  async def http_error(request, exc: HTTPException):
    """A route this server does not have, or a method it does not take, in the same body."""
    what = {404: f"{request.url.path} is not served here (routes: {', '.join(routes)}, "
                 "/v1/models, /health, /stats)"}.get(exc.status_code, exc.detail)  # fmt: skip
    return error_response(exc.status_code, what)

  def refusing(handler):
    async def route(request):
      try:
        return await handler(request)
      except Refusal as e:
        return error_response(e.status, str(e), e.kind)

    return route

  async def models(request):
    del request
    return JSONResponse({"object": "list", "data": [card]})

  async def one_model(request):
    check_model(request.path_params["name"], model)
    return JSONResponse(card)

  async def health(request):
    del request
    return JSONResponse({"status": "ok"})

  async def get_stats(request):
    del request
    return JSONResponse(dict(stats))

  return Starlette(
    routes=[
      *(Route(path, refusing(handler), methods=["POST"]) for path, handler in routes.items()),
      Route("/v1/models", models, methods=["GET"]),
      Route("/v1/models/{name:path}", refusing(one_model), methods=["GET"]),
      Route("/health", health, methods=["GET"]),
      Route("/stats", get_stats, methods=["GET"]),
    ],
    exception_handlers={HTTPException: http_error},
  )


def serve_until_stopped(app, host: str, port: int, listening: str) -> None:
  """Serves the ASGI `app` with uvicorn until SIGTERM/SIGINT, printing `listening` once its
  socket accepts connections (not before: a client that reads the line can connect)."""
  import uvicorn

  class Narrated(uvicorn.Server):
    async def startup(self, sockets=None):
      await super().startup(sockets=sockets)
      if self.started:
        print(listening, flush=True)

  Narrated(uvicorn.Config(app, host=host, port=port, log_level="warning")).run()


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
