"""`hindsight serve`: credit over HTTP for RL loops that are not written in JAX.

  POST /v1/credit   {"trajectories": [{"observations", "actions", "rewards", "agent"?}]}
                    (JSON, or msgpack with Content-Type application/msgpack)
                 -> {"credit": [[...]], "credit_std": [[...]], "p_zero": [[...]],
                     "klass": [[name, ...]], "model": {"step", "digest"},
                     "steps": [[text, ...]] (a text model: each trace's steps as cut)}
  POST /pooling     vLLM's Pooling API, "task": "token_classify": per-step credit of text
                    traces cut at a step tag, one [1 - c, c] row per step (`formats`)
  POST /get_reward  OpenRLHF's remote reward model: {"query", "prompts", "labels"} ->
                    {"rewards"}, the steps' credit beside it (`formats`)
  GET  /v1/models   the served model, as vLLM lists it
  POST /v1/reload   {"checkpoint"?: DIR, "step"?: "run" | "best" | "last" | N}: load, verify, warm
                    up, then swap; requests in flight finish on the model they started on.
                    An admin action: it needs `Authorization: Bearer TOKEN` (the server's
                    --admin-token-file or $HINDSIGHT_ADMIN_TOKEN; without one it is off: 403),
                    and DIR must resolve inside the served run or --allow-reload-from (403)
  GET  /healthz     the process is up;  GET /readyz  the model is loaded and warmed up
  GET  /metrics     Prometheus: requests by code, latency, batch sizes, model step

Concurrent requests are batched dynamically: a batch takes every request that arrives within
`window_ms` of the one before it, up to `max_batch` trajectories, and is scored in one
`Predictor.score_checked` call on the compiled buckets (off the event loop, in a worker
thread). POST /v1/credit is a bare ASGI handler; the other routes go through Starlette.
Every request is validated before it joins a batch, so one bad request never fails another;
bad requests get a 4xx and a one-line message that names no server path (the server's log
keeps the detail). SIGHUP reloads the checkpoint directory served (the step `--step` names),
for the operator on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hmac
import logging
import os
import re
import signal
import time
from collections.abc import Callable

import jax
import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hindsight.data.episode import Episode
from hindsight.errors import HindsightError, error_body, note, one_line
from hindsight.model.predictor import Predictor
from hindsight.serving.config import ServeConfig
from hindsight.serving.formats import (
  FormatError,
  UnknownModel,
  checks_references,
  models_answer,
  openrlhf_answer,
  pooling_answer,
  read_openrlhf,
  read_pooling,
  step_lists,
  unverifiable_reference,
)

MSGPACK = "application/msgpack"
_log = logging.getLogger("hindsight.serve")


class _Failure(Exception):
  """A request that gets `status` and a one-line message."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


@dataclasses.dataclass
class _Job:
  episodes: list[dict]
  future: asyncio.Future


class Server:
  """The app's state: the model being served, the batcher, the metrics."""

  def __init__(self, cfg: ServeConfig):
    self.cfg = cfg
    self.predictor: Predictor | None = None
    self.queue: asyncio.Queue | None = None
    self.reload_lock: asyncio.Lock | None = None
    self.ready = False
    self.failure: str | None = None  # why the model never became ready (logged)
    self.registry = CollectorRegistry()
    self.requests = Counter(
      "hindsight_requests", "HTTP requests by route and status code", ["route", "code"],
      registry=self.registry,
    )  # fmt: skip
    self.latency = Histogram(
      "hindsight_request_seconds", "Latency of /v1/credit requests", registry=self.registry,
      buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
    )  # fmt: skip
    self.batch_sizes = Histogram(
      "hindsight_batch_trajectories", "Trajectories per scored batch", registry=self.registry,
      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    )  # fmt: skip
    self.admin_denied = Counter(
      "hindsight_admin_denied", "Admin requests refused, by reason", ["reason"],
      registry=self.registry,
    )  # fmt: skip
    self.model_step = Gauge(
      "hindsight_model_step", "Checkpoint step served", registry=self.registry
    )

  @property
  def max_steps(self) -> int:
    return self.cfg.steps_limit(self.predictor.spec)

  # -- model ------------------------------------------------------------------------------

  def load(self, checkpoint: str, step) -> Predictor:
    """A verified, warmed-up Predictor (blocking: runs in a worker thread)."""
    predictor = Predictor.load(checkpoint, step)
    if self.predictor is not None:
      _check_compatible(self.predictor, predictor)
    if self.cfg.warmup:
      predictor.warmup(self.cfg.steps_limit(predictor.spec))
    return predictor

  async def reload(self, checkpoint: str | None = None, step=None) -> Predictor:
    async with self.reload_lock:
      new = await asyncio.to_thread(
        self.load, checkpoint or self.cfg.checkpoint, self.cfg.step if step is None else step
      )
      self.predictor = new  # batches read it once each: in-flight ones keep the old model
      self.model_step.set(new.step)
      return new

  # -- batching ---------------------------------------------------------------------------

  async def score(self, episodes: list[dict]) -> tuple[list[dict], Predictor]:
    future = asyncio.get_running_loop().create_future()
    await self.queue.put(_Job(episodes, future))
    return await future

  async def batch_loop(self) -> None:
    """Collects a batch, scores it, answers it; then the next. The model and the event loop
    take turns: on a few CPU cores, parsing requests while the model runs slowed the model
    more than it saved."""
    while True:
      await self._score_jobs(await self._collect())

  async def _collect(self) -> list[_Job]:
    """The next batch: the first waiting request and every request that follows within
    `window_ms` of the one before it, up to `max_batch` trajectories."""
    jobs = [await self.queue.get()]
    count = len(jobs[0].episodes)
    while count < self.cfg.max_batch:
      try:
        job = await asyncio.wait_for(self.queue.get(), self.cfg.window_ms / 1000)
      except TimeoutError:
        break
      jobs.append(job)
      count += len(job.episodes)
    return jobs

  async def _score_jobs(self, jobs: list[_Job]) -> None:
    """Scores one batch in a worker thread and answers every request in it."""
    predictor = self.predictor
    episodes = [e for job in jobs for e in job.episodes]
    self.batch_sizes.observe(len(episodes))
    try:
      scores = await asyncio.to_thread(
        predictor.score_checked,
        episodes,
        self.cfg.max_batch,
        allow_longer=self.cfg.steps_limit(predictor.spec) > predictor.spec.max_length,
      )
    except Exception as e:  # every waiting request hears of it, none hangs
      for job in jobs:
        if not job.future.done():
          job.future.set_exception(e)
      return
    start = 0
    for job in jobs:
      part = scores[start : start + len(job.episodes)]
      start += len(job.episodes)
      if not job.future.done():
        job.future.set_result((part, predictor))


def _check_compatible(old: Predictor, new: Predictor) -> None:
  """A reloaded model must have the served one's tree structure, shapes and dtypes (and
  DataSpec inputs), so every client's requests stay valid."""
  if jax.tree.structure(old.state) != jax.tree.structure(new.state):
    raise HindsightError("the new checkpoint's parameter tree differs from the served model's")
  for a, b in zip(jax.tree.leaves(old.state), jax.tree.leaves(new.state), strict=True):
    if a.shape != b.shape or a.dtype != b.dtype:
      raise HindsightError(
        f"the new checkpoint has a {b.dtype}{list(b.shape)} parameter where the served model "
        f"has {a.dtype}{list(a.shape)}"
      )
  o, n = old.spec, new.spec
  if (o.encoder.signature, o.num_actions, o.num_agents) != (
    n.encoder.signature,
    n.num_actions,
    n.num_agents,
  ):
    raise HindsightError("the new checkpoint expects other observations or actions")


def _decode(request_body: bytes, content_type: str):
  try:
    if content_type.split(";")[0].strip() == MSGPACK:
      return msgspec.msgpack.decode(request_body)
    return msgspec.json.decode(request_body)
  except (msgspec.DecodeError, ValueError) as e:
    raise _Failure(
      400,
      f"the body is not valid {'msgpack' if MSGPACK in content_type else 'JSON'}: {one_line(e)}",
    ) from None


def _trajectories(body, server: Server) -> list[dict]:
  """The request's trajectories, each checked against the model (400 on the first bad one)."""
  if not isinstance(body, dict) or not isinstance(body.get("trajectories"), list):
    raise _Failure(400, 'expected {"trajectories": [...]}')
  trajs = body["trajectories"]
  if not trajs:
    raise _Failure(400, "'trajectories' is empty")
  if len(trajs) > server.cfg.max_trajectories:
    raise _Failure(
      413, f"{len(trajs)} trajectories in one request; the limit is {server.cfg.max_trajectories}"
    )
  spec = server.predictor.spec
  out = []
  for i, t in enumerate(trajs):
    where = f"trajectories[{i}]"
    refused = unverifiable_reference(t, spec, where)
    if refused is not None:
      raise _Failure(400, refused)
    # An episode's actions (or a dataset's step_text) are its steps: a long one is refused
    # unread. A trace's `steps` or `text` is counted as the model reads it, once parsed (an
    # agent trace's entries join into agent steps).
    given = None
    if isinstance(t, dict) and t.get("steps") is None and t.get("text") is None:
      given = next((t[k] for k in ("actions", "step_text") if t.get(k) is not None), None)
    if isinstance(given, list) and len(given) > server.max_steps:
      raise _Failure(413, _too_long(where, f"{len(given)} steps", server.max_steps))
    try:
      episode = Episode.parse(t, spec, where)
    except HindsightError as e:
      raise _Failure(400, one_line(e)) from None
    if len(episode) > server.max_steps:
      raise _Failure(413, _too_long(where, _length(t, len(episode)), server.max_steps))
    out.append(episode)
  return out


def _too_long(where: str, length: str, limit: int) -> str:
  return (f"{where}: {length}; the limit is {limit} (`hindsight serve --max-steps N` serves "
          "longer ones)")  # fmt: skip


def _length(trace: dict, steps: int) -> str:
  """A trace of `steps` steps as the model reads them, with the entries of its `steps` where
  they differ: an agent trace's entries join into agent steps as its labels cut them (each
  result into its call's step; `Episode.parse`)."""
  given = trace.get("steps")
  if not isinstance(given, list) or len(given) == steps:
    return f"{steps} steps"
  return f"{steps} agent steps (from {len(given)} entries in 'steps')"


def _answer(scores: list[dict], predictor: Predictor) -> dict:
  steps = step_lists(scores)
  out = {
    "credit": steps["credit"],
    "credit_std": steps["credit_std"],
    "p_zero": [s["p_zero"].astype(float).tolist() for s in scores],
    "klass": steps["klass"],
    "model": {"step": predictor.step, "digest": predictor.digest},
  }
  if all("steps" in s for s in scores):  # text traces: the steps as the model cut them
    out["steps"] = [s["steps"] for s in scores]
  return out


def create_app(
  cfg: ServeConfig,
  predictor: Predictor | None = None,
  on_failure: Callable[[str], None] | None = None,
) -> Starlette:
  """The ASGI app; the model (`predictor`, else loaded from cfg.checkpoint) warms up in the
  background after startup, and /readyz says ready when it has. If loading or warming up
  fails, /readyz answers 503 with the reason, the server's log says it, and
  `on_failure(reason)` is called (`serve` then ends the process with a one-line error)."""
  server = Server(cfg)
  token = cfg.admin_token()  # read once, at start: a bad token file fails the start
  model_name, default_outcome = cfg.model_name(), cfg.default_outcome()
  roots = cfg.reload_roots()

  def encoded(route: str, status: int, content: dict) -> tuple[int, bytes, str]:
    """(status, JSON body, media type) of an answer, counted in the metrics."""
    server.requests.labels(route, str(status)).inc()
    if "error" in content:  # clients never learn the server's paths; its log keeps them
      content = dict(content, **error_body(status, redact_paths(content["error"])))
    # msgspec encodes the nested float lists several times faster than the json module.
    return status, msgspec.json.encode(content), "application/json"

  def respond(route: str, status: int, content: dict) -> Response:
    status, body, media_type = encoded(route, status, content)
    return Response(body, status, media_type=media_type)

  async def read_body(scope, receive) -> bytes | None:
    """The request's body within the size limit (413 past it); None if the client left."""
    headers = dict(scope["headers"])
    length = headers.get(b"content-length", b"")
    if length.isdigit() and int(length) > cfg.max_body_bytes:
      raise _Failure(413, f"the body has {int(length)} bytes; the limit is {cfg.max_body_bytes}")
    body = bytearray()
    while True:
      message = await receive()
      if message["type"] == "http.disconnect":
        return None
      body += message.get("body", b"")
      if len(body) > cfg.max_body_bytes:
        raise _Failure(413, f"the body exceeds the limit of {cfg.max_body_bytes} bytes")
      if not message.get("more_body", False):
        return bytes(body)

  def scoring_route(route: str, parse, answer):
    """A bare ASGI handler for a route that scores traces: parse(decoded body) -> (episodes,
    what the answer needs), then answer(that, scores, predictor) -> the JSON body. The
    scoring routes skip Starlette's request and response objects (a third of the server's
    time per request)."""

    async def handler(scope, receive, send) -> None:
      tic = time.perf_counter()
      headers = dict(scope["headers"])
      content_type = headers.get(b"content-type", b"").decode("latin-1")
      try:
        if not server.ready:
          raise _Failure(503, "the model is still loading")
        raw = await read_body(scope, receive)
        if raw is None:
          return
        episodes, context = parse(_decode(raw, content_type))
        scores, predictor = await server.score(episodes)
        out = answer(context, scores, predictor)
      except _Failure as e:
        return await _send(send, *encoded(route, e.status, {"error": str(e)}))
      except (HindsightError, FormatError) as e:
        return await _send(send, *encoded(route, 400, {"error": one_line(e)}))
      except UnknownModel as e:  # vLLM's answer to another model's name
        return await _send(send, *encoded(route, 404, {"error": one_line(e)}))
      if route == "credit":
        server.latency.observe(time.perf_counter() - tic)
        if MSGPACK in headers.get(b"accept", b"").decode("latin-1"):
          server.requests.labels(route, "200").inc()
          return await _send(send, 200, msgspec.msgpack.encode(out), MSGPACK)
      await _send(send, *encoded(route, 200, out))

    return handler

  credit = scoring_route(
    "credit",
    lambda body: (_trajectories(body, server), None),
    lambda _, scores, predictor: _answer(scores, predictor),
  )

  def text_spec():
    """The served model's spec, if it reads text (the formats other stacks speak are text)."""
    spec = server.predictor.spec
    if not hasattr(spec.encoder, "tokens"):
      raise _Failure(400, "this route serves text credit models; the served model reads "
                     "other observations (POST /v1/credit serves it)")  # fmt: skip
    return spec

  def text_episodes(traces: list[dict], spec) -> list[Episode]:
    """Each trace checked against the model: more traces than a request may hold is a 413,
    more steps than the server reads a 400 (over its context, as vLLM answers a too-long
    input); a trace the model cuts into other steps than it was sent (tool markup) a 400."""
    if len(traces) > cfg.max_trajectories:
      raise _Failure(413, f"{len(traces)} inputs in one request; the limit is "
                     f"{cfg.max_trajectories}")  # fmt: skip
    out = []
    for t in traces:
      episode = Episode.parse(t, spec, t["id"])
      if len(episode) > server.max_steps:
        raise _Failure(400, f"{t['id']}: {len(episode)} steps; the model reads at most "
                       f"{server.max_steps} (`hindsight serve --max-steps N`)")  # fmt: skip
      if "steps" in t and len(episode) != len(t["steps"]):
        raise _Failure(400, f"{t['id']}: the model reads its {len(t['steps'])} steps as "
                       f"{len(episode)} (tool markup cut them otherwise); send it to "
                       "POST /v1/credit as an agent trace")  # fmt: skip
      out.append(episode)
    return out

  def parse_pooling(body):
    spec = text_spec()
    request = read_pooling(body, model=model_name, tokenizer=spec.encoder.tokens,
                           tag=cfg.step_tag, tag_id=cfg.step_tag_id,
                           response_start=cfg.response_start, outcome=default_outcome,
                           checked=checks_references(spec))  # fmt: skip
    episodes = text_episodes(request.traces, spec)
    return episodes, (request, episodes)

  pooling = scoring_route(
    "pooling", parse_pooling,
    lambda context, scores, _: pooling_answer(context[0], scores, model_name,
                                              sum(e.read_tokens or 0 for e in context[1])),
  )  # fmt: skip

  def parse_reward(body):
    spec = text_spec()
    traces = read_openrlhf(body, default_outcome, checks_references(spec))
    episodes = text_episodes(traces, spec)
    return episodes, episodes

  reward = scoring_route("get_reward", parse_reward,
                         lambda episodes, scores, _: openrlhf_answer(episodes, scores))  # fmt: skip
  scoring = {"/v1/credit": credit, "/pooling": pooling, "/get_reward": reward}
  started = int(time.time())

  async def models(request: Request) -> Response:
    if not server.ready:
      return respond("models", 503, {"error": "the model is still loading"})
    encoder = server.predictor.spec.encoder
    # the longest trace it reads, in tokens: a decoder's context, or a step encoder's longest
    # step times the steps served
    context = getattr(encoder, "max_tokens", None)
    if context is None:
      context = getattr(encoder, "max_step_tokens", 0) * server.max_steps
    return respond("models", 200, models_answer(model_name, int(context), started))

  def deny(reason: str, status: int, message: str) -> Response:
    server.admin_denied.labels(reason).inc()
    _log.warning("hindsight serve: reload refused (%s)", reason)
    return respond("reload", status, {"error": message})

  async def reload(request: Request) -> Response:
    if token is None:
      return deny("disabled", 403, "reload over HTTP is off on this server (it was started "
                  "without an admin token; SIGHUP reloads on the machine)")  # fmt: skip
    given = request.headers.get("authorization")
    if given is None:
      return deny("missing", 401, "an admin token is required: Authorization: Bearer TOKEN")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
      return deny("wrong", 401, "the admin token is wrong")
    try:
      body = _decode(await request.body() or b"{}", request.headers.get("content-type", ""))
      if not isinstance(body, dict):
        raise _Failure(400, 'expected {"checkpoint"?: DIR, "step"?: STEP}')
      checkpoint = body.get("checkpoint")
      if checkpoint is not None:
        if not isinstance(checkpoint, str) or not checkpoint:
          raise _Failure(400, "'checkpoint' must be a directory name")
        if not _inside(checkpoint, roots):
          return deny("outside", 403, "the checkpoint is outside the directories this server "
                      "may reload from (the served run and --allow-reload-from)")  # fmt: skip
      new = await server.reload(checkpoint, body.get("step"))
    except _Failure as e:
      return respond("reload", e.status, {"error": str(e)})
    except (HindsightError, OSError) as e:
      # Refused (damaged, incompatible, missing): the old model keeps serving.
      _log.warning("hindsight serve: reload refused: %s", one_line(e))
      return respond("reload", 409, {"error": one_line(e)})
    return respond("reload", 200, {"model": {"step": new.step, "digest": new.digest}})

  async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})

  async def readyz(request: Request) -> Response:
    if not server.ready:
      body = {"ready": False} if server.failure is None else {"ready": False, "error": "failed"}
      return JSONResponse(body, status_code=503)
    p = server.predictor
    return JSONResponse({"ready": True, "model": {"step": p.step, "digest": p.digest}})

  async def metrics(request: Request) -> Response:
    return Response(generate_latest(server.registry), media_type="text/plain; version=0.0.4")

  @contextlib.asynccontextmanager
  async def lifespan(app):
    server.queue = asyncio.Queue()
    server.reload_lock = asyncio.Lock()
    batcher = asyncio.create_task(server.batch_loop())

    async def start():
      try:
        if predictor is None:
          await server.reload()
        else:
          if cfg.warmup:
            await asyncio.to_thread(predictor.warmup, cfg.steps_limit(predictor.spec))
          server.predictor = predictor
          server.model_step.set(predictor.step)
      except Exception as e:  # any failure: a server that is never ready must say why
        model = predictor or server.predictor
        steps = f" of {cfg.steps_limit(model.spec)}-step buckets" if model is not None else ""
        server.failure = (
          f"loading or warming up the model{steps} failed ({type(e).__name__}: "
          f"{one_line(e)[:200]}); lower --max-steps or --max-batch"
        )
        _log.error("hindsight serve: %s", server.failure)
        if on_failure is not None:
          on_failure(server.failure)
        return
      server.ready = True

    loader = asyncio.create_task(start())
    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
      # SIGHUP reloads (only where the loop owns the main thread's signals).
      asyncio.get_running_loop().add_signal_handler(
        signal.SIGHUP, lambda: asyncio.ensure_future(_quiet(server.reload()))
      )
    app.state.server = server
    try:
      yield
    finally:
      loader.cancel()
      batcher.cancel()

  routes = [
    # Reached only by what `dispatch` passes on (a GET: 405); a partial is served as ASGI.
    *(Route(path, functools.partial(h), methods=["POST"]) for path, h in scoring.items()),
    Route("/v1/models", models),
    Route("/v1/reload", reload, methods=["POST"]),
    Route("/healthz", healthz),
    Route("/readyz", readyz),
    Route("/metrics", metrics),
  ]
  app = Starlette(routes=routes, lifespan=lifespan)

  async def dispatch(scope, receive, send) -> None:
    """A POST to a scoring route straight to its handler; everything else (lifespan, the
    other routes, a GET of a scoring route: 405) through Starlette."""
    if scope["type"] == "http" and scope["method"] == "POST":
      handler = scoring.get(scope["path"])
      if handler is not None:
        return await handler(scope, receive, send)
    await app(scope, receive, send)

  return dispatch


async def _send(send, status: int, body: bytes, media_type: str) -> None:
  """One complete ASGI response."""
  headers = [(b"content-type", media_type.encode()), (b"content-length", str(len(body)).encode())]
  await send({"type": "http.response.start", "status": status, "headers": headers})
  await send({"type": "http.response.body", "body": body})


def _inside(path: str, roots: list[str]) -> bool:
  """Whether `path`, resolved (symlinks and .. followed), is one of `roots` or below one."""
  resolved = os.path.realpath(path)
  return any(resolved == root or resolved.startswith(root + os.sep) for root in roots)


# An absolute path in a message: a slash that starts a word, up to the next separator.
_PATH = re.compile(r"(?<![\w.:/])/[^\s:;,'\"()\[\]]+")
# The server's own routes, which a message may point a client to.
ROUTES = ("/v1/credit", "/pooling", "/get_reward", "/v1/models", "/v1/reload", "/healthz",
          "/readyz", "/metrics")  # fmt: skip


def redact_paths(message: str) -> str:
  """`message` with every absolute path but the server's routes replaced by `<path>`: errors
  a client reads say what was wrong, not where the server keeps its files."""
  return _PATH.sub(lambda m: m[0] if m[0] in ROUTES else "<path>", message)


async def _quiet(coro) -> None:
  """A SIGHUP reload: a refused checkpoint leaves the served model in place."""
  with contextlib.suppress(HindsightError, OSError):
    await coro


def serve(cfg: ServeConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
  """Runs the server until SIGTERM/SIGINT (in-flight requests finish first). A model that
  fails to warm up ends it with a one-line HindsightError (the reason is logged too)."""
  import uvicorn

  # Load before listening: a bad checkpoint is a one-line error, not a server never ready.
  predictor = Predictor.load(cfg.checkpoint, cfg.step)
  failures: list[str] = []

  def stop(reason: str) -> None:
    failures.append(reason)
    server.should_exit = True

  config = uvicorn.Config(
    create_app(cfg, predictor, on_failure=stop),
    host=host,
    port=port,
    log_level="warning",
    timeout_graceful_shutdown=30,
  )
  server = uvicorn.Server(config)
  if cfg.admin_token() is None and host not in ("127.0.0.1", "localhost", "::1"):
    note(f"--host {host} without an admin token: reload over HTTP is disabled (SIGHUP still "
         "reloads; docs/serving.md shows the secure invocation)")  # fmt: skip
  limit = cfg.steps_limit(predictor.spec)
  longer = " (longer than it was trained on)" if limit > predictor.spec.max_length else ""
  print(
    f"hindsight: serving {cfg.checkpoint} (step {predictor.step}, up to {limit} steps per "
    f"trajectory{longer}) on http://{host}:{port}; /readyz says when it is warm",
    flush=True,
  )
  server.run()
  if failures:
    raise HindsightError(failures[0])
