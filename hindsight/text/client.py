"""Completions from an OpenAI-compatible `/v1/completions` endpoint: async, cached, bounded.

`CompletionClient.sample(draws)` returns the completions of a list of `Draw`s (a prompt, a
seed, a block of sample indices). It
  * looks every sample up in the on-disk `CompletionCache` first (SQLite, one committed
    transaction per response: a job killed at any moment keeps every response it received,
    and a rerun asks for nothing it already has);
  * sends what is missing with `n` samples per request, at most `concurrency` in flight, in
    the order given (the labeler orders draws by trace and prefix, so requests that share a
    prefix reach the server together and hit its prefix cache);
  * retries 408/409/429/5xx answers, timeouts, dropped connections and malformed JSON with
    exponential backoff (honouring Retry-After), `retries` times, then stops with a one-line
    error; any other 4xx is a one-line error at once (a wrong model name, a refused key);
  * refuses to go past its budget in completions or tokens (checked before each request:
    the run stops with what it has cached, and a rerun with a larger budget goes on).

`context` is the model's context in tokens from GET /v1/models (`max_model_len`, as vLLM and
`hindsight lm serve` report it; None where the endpoint says nothing), and
`count_tokens(prompts)` their lengths from POST /tokenize at the server's root (vLLM, SGLang
and `hindsight lm serve`; None where it is missing), cached beside the completions: the
labeler clamps each request's max_tokens to what its prompt leaves of the context.

A sample's cache key is SHA-256 of (model, prompt, sampling parameters, seed, index). Which
indices share a request is fixed by (start, n) of the draw, never by what is cached, so a
resumed job sends exactly the requests the killed one had not finished.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import hashlib
import json
import os
import sqlite3
import time
from urllib.parse import urlsplit

from hindsight.errors import HindsightError, one_line

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


@dataclasses.dataclass(frozen=True)
class Sampling:
  """The sampling parameters every request carries (part of every cache key)."""

  temperature: float = 1.0
  top_p: float = 1.0
  max_tokens: int = 1024
  stop: tuple[str, ...] = ()

  def body(self) -> dict:
    out = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
    if self.stop:
      out["stop"] = list(self.stop)
    return out


@dataclasses.dataclass(frozen=True)
class Completion:
  text: str
  finish_reason: str
  tokens: int


@dataclasses.dataclass(frozen=True)
class Draw:
  """Samples start .. start + n - 1 of (prompt, seed): one request when not cached.
  max_tokens: this draw's own cap (None: the client's sampling), where the prompt leaves
  less of the model's context than that; where: what it continues, for messages ("trace
  p3, step 7")."""

  prompt: str
  seed: int
  start: int
  n: int
  max_tokens: int | None = None
  where: str = ""
  episode: int = -1  # the trace it continues (the chat route's prompt messages)


def check_endpoint(endpoint: str) -> None:
  """A one-line HindsightError for an endpoint that is not a server's base URL (.../v1): a
  route's URL (the client adds /completions, /models itself) or a bare host (whose routes are
  under /v1), said before anything is sent rather than by a 404 on the first request."""
  if not endpoint.startswith(("http://", "https://")):
    raise HindsightError(f"endpoint {endpoint}: expected an http:// or https:// URL")
  parts = urlsplit(endpoint)
  host, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
  route = next((r for r in ("/chat/completions", "/completions") if path.endswith(r)), None)
  if route is not None:
    raise HindsightError(
      f"endpoint {endpoint}: give the server's base URL, --endpoint "
      f"{host}{path.removesuffix(route)} (hindsight adds the route, /completions or "
      "/chat/completions, itself)"
    )
  if not path:
    raise HindsightError(
      f"endpoint {endpoint}: give the server's base URL with its API path, --endpoint "
      f"{host}/v1 (where vLLM, SGLang and `hindsight lm serve` answer)"
    )


@dataclasses.dataclass
class ChatRoute:
  """Requests to /v1/chat/completions (`--api chat`): a draw's text (a trace's prompt and
  what was written after it) read back as messages, the prompt as the trace's own prompt
  messages (`heads`, by episode) and the rest as assistant turns with structured
  `tool_calls` and `tool` results (`chat_log.to_messages`); an answer's message written as
  text in the layout (its content, then its calls). A draw that ends inside an assistant
  turn (a step cut mid-turn, a null replacement) asks the server to continue that message
  (`continue_final_message`, as vLLM and SGLang take it)."""

  heads: list
  traces: list
  layout: object

  def body(self, draw: Draw) -> dict:
    from hindsight.text.chat_log import to_messages

    if not 0 <= draw.episode < len(self.traces):  # a draw of no trace: no prompt messages
      raise HindsightError(f"{draw.where}: the chat route needs the trace a draw continues")
    trace = self.traces[draw.episode]
    if not draw.prompt.startswith(trace.prompt):
      raise HindsightError(f"{draw.where}: its text does not start with its trace's prompt")
    messages = to_messages(self.heads[draw.episode], draw.prompt[len(trace.prompt) :],
                           self.layout)  # fmt: skip
    out = {"messages": messages}
    if messages[-1]["role"] == "assistant":
      out.update(continue_final_message=True, add_generation_prompt=False)
    if trace.tools:
      out["tools"] = trace.tools
    return out

  def tools_of(self, draw: Draw) -> list | None:
    """The tool schemas a draw's request offers (its trace's)."""
    return self.traces[draw.episode].tools if 0 <= draw.episode < len(self.traces) else None

  def text_of(self, message: dict) -> str:
    """An answer's message as the agent's text: its content, then its calls."""
    from hindsight.text.chat_log import content_text

    text = content_text(message.get("content"))
    for call in message.get("tool_calls") or []:
      function = call.get("function", call)
      arguments = function.get("arguments", "{}")
      if isinstance(arguments, str):
        try:
          arguments = json.loads(arguments)
        except ValueError:  # written as it came: the agent reads the parse error
          text += (self.layout.call_prefix + '{"name": ' + json.dumps(function.get("name"))
                   + ', "arguments": ' + arguments + "}" + self.layout.call_suffix)  # fmt: skip
          continue
      text += self.layout.render_call(str(function.get("name")), arguments)
    return text


def block_seed(seed: int, start: int) -> int:
  """The `seed` of the request for samples start .. start + n - 1 of a draw seeded `seed`:
  servers seed a request's choices from it, so every block needs its own (31 bits: what
  every server accepts)."""
  digest = hashlib.sha256(f"{seed}:{start}".encode()).digest()
  return int.from_bytes(digest[:4], "little") >> 1


class CompletionCache:
  """Completions on disk, keyed by `key(...)`; safe against a kill at any moment."""

  def __init__(self, path: str):
    self.path = path
    try:
      self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
      self._db.execute("PRAGMA journal_mode=WAL")
      # Durable against a killed process (what resuming needs), without an fsync per response.
      self._db.execute("PRAGMA synchronous=NORMAL")
      self._db.execute(
        "CREATE TABLE IF NOT EXISTS completions "
        "(key TEXT PRIMARY KEY, text TEXT NOT NULL, finish TEXT NOT NULL, tokens INTEGER)"
      )
      # Prompt lengths in the endpoint's tokens (`CompletionClient.count_tokens`).
      self._db.execute("CREATE TABLE IF NOT EXISTS prompt_tokens (key TEXT PRIMARY KEY, "
                       "count INTEGER NOT NULL)")  # fmt: skip
    except sqlite3.DatabaseError as e:
      raise HindsightError(f"cache {path}: not a completion cache ({e})") from None

  @staticmethod
  def key(model: str, prompt: str, sampling: Sampling, seed: int, index: int) -> str:
    blob = json.dumps([model, prompt, dataclasses.asdict(sampling), seed, index])
    return hashlib.sha256(blob.encode()).hexdigest()

  def _select(self, columns: str, table: str, keys: list[str]):
    """Rows (key, *columns) of `table` for `keys`, in queries of at most 500 keys."""
    for lo in range(0, len(keys), 500):
      part = keys[lo : lo + 500]
      marks = ",".join("?" * len(part))
      yield from self._db.execute(
        f"SELECT key, {columns} FROM {table} WHERE key IN ({marks})", part
      )

  def get(self, keys: list[str]) -> dict[str, Completion]:
    rows = self._select("text, finish, tokens", "completions", keys)
    return {k: Completion(t, f, n) for k, t, f, n in rows}

  def put(self, items: list[tuple[str, Completion]]) -> None:
    self._db.execute("BEGIN")
    self._db.executemany(
      "INSERT OR REPLACE INTO completions VALUES (?, ?, ?, ?)",
      [(k, c.text, c.finish_reason, c.tokens) for k, c in items],
    )
    self._db.execute("COMMIT")

  def get_counts(self, keys: list[str]) -> dict[str, int]:
    """Prompt lengths in the endpoint's tokens (`CompletionClient.count_tokens`), by key."""
    return dict(self._select("count", "prompt_tokens", keys))

  def put_counts(self, items: list[tuple[str, int]]) -> None:
    self._db.execute("BEGIN")
    self._db.executemany("INSERT OR REPLACE INTO prompt_tokens VALUES (?, ?)", items)
    self._db.execute("COMMIT")

  def __len__(self) -> int:
    return int(self._db.execute("SELECT COUNT(*) FROM completions").fetchone()[0])

  def close(self) -> None:
    self._db.close()


@dataclasses.dataclass
class Budget:
  """Most completions and tokens a run may request (0: no limit)."""

  completions: int = 0
  tokens: int = 0
  spent_completions: int = 0
  spent_tokens: int = 0

  def reserve(self, n: int) -> None:
    if self.completions and self.spent_completions + n > self.completions:
      raise HindsightError(
        f"the budget of {self.completions} completions is spent ({self.spent_completions} "
        "requested by this run; cached samples cost nothing): rerun with a larger "
        "--budget-completions to go on"
      )
    if self.tokens and self.spent_tokens >= self.tokens:
      raise HindsightError(
        f"the budget of {self.tokens} tokens is spent ({self.spent_tokens} by this run): rerun "
        "with a larger --budget-tokens to go on"
      )
    self.spent_completions += n


@dataclasses.dataclass
class ClientStats:
  requests: int = 0
  completions: int = 0
  cached: int = 0
  tokens: int = 0
  retries: int = 0
  truncated: int = 0  # finish_reason "length": max_tokens cut the sample short
  # ... of which at a cap below --max-tokens: their prefix left less of the model's context
  truncated_by_context: int = 0
  seconds: float = 0.0


class _Retry(Exception):
  """A failure worth another try (the message says what it was)."""

  def __init__(self, message: str, wait: float | None = None):
    super().__init__(message)
    self.wait = wait


class CompletionClient:
  """See the module docstring. `transport` replaces the network (tests: httpx.MockTransport)."""

  def __init__(
    self,
    endpoint: str,
    model: str,
    sampling: Sampling,
    cache: CompletionCache,
    *,
    api_key: str | None = None,
    concurrency: int = 16,
    retries: int = 6,
    timeout: float = 60.0,
    backoff: float = 0.5,
    budget: Budget | None = None,
    transport=None,
    bar=None,
    chat: ChatRoute | None = None,
  ):
    if concurrency < 1:
      raise HindsightError(f"concurrency must be >= 1, got {concurrency}")
    check_endpoint(endpoint)
    self.chat = chat
    self.url = endpoint.rstrip("/") + ("/chat/completions" if chat else "/completions")
    self.endpoint, self.model, self.sampling, self.cache = endpoint, model, sampling, cache
    self.api_key, self.concurrency, self.retries = api_key, concurrency, retries
    self.timeout, self.backoff, self.transport = timeout, backoff, transport
    self.budget = budget or Budget()
    self.stats = ClientStats()
    self.bar = bar  # a tqdm bar to show the rates on (its postfix)
    self._started = time.monotonic()

  def sampling_of(self, draw: Draw) -> Sampling:
    """The sampling a draw's requests carry: the client's, at the draw's own cap if any."""
    if draw.max_tokens is None:
      return self.sampling
    return dataclasses.replace(self.sampling, max_tokens=draw.max_tokens)

  def _keys(self, draw: Draw) -> list[str]:
    sampling = self.sampling_of(draw)
    # The chat route's answers are other samples than the same text's completions, and
    # depend on the tools the request offers.
    model = self.model
    if self.chat is not None:
      model += "\x00chat" + json.dumps(self.chat.tools_of(draw), sort_keys=True)
    return [
      CompletionCache.key(model, draw.prompt, sampling, draw.seed, draw.start + j)
      for j in range(draw.n)
    ]

  def sample(self, draws: list[Draw]) -> list[list[Completion]]:
    """The completions of every draw, in order ([len(draws)][n])."""
    keys = [self._keys(d) for d in draws]
    found = self.cache.get([k for ks in keys for k in ks])
    missing = [i for i, ks in enumerate(keys) if any(k not in found for k in ks)]
    self.stats.cached += sum(len(ks) for ks in keys) - sum(len(keys[i]) for i in missing)
    if missing:
      fetched = self._run_all([draws[i] for i in missing], self._fetch)
      for i, completions in zip(missing, fetched, strict=True):
        found.update(zip(keys[i], completions, strict=True))
    self._report(force=True)
    return [[found[k] for k in ks] for ks in keys]

  # -- the model's context --------------------------------------------------------------------
  @functools.cached_property
  def context(self) -> int | None:
    """The model's context in tokens as the endpoint reports it (`max_model_len` in its
    `/v1/models` entry, as vLLM, SGLang and `hindsight lm serve` give it), else None."""
    import httpx

    try:
      with httpx.Client(headers=self._headers(), timeout=self.timeout,
                        transport=self._sync_transport()) as http:  # fmt: skip
        response = http.get(self.endpoint.rstrip("/") + "/models")
      models = response.json()["data"] if response.status_code == 200 else []
      entry = next((m for m in models if m.get("id") == self.model), {})
      length = entry.get("max_model_len")
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
      return None
    return int(length) if isinstance(length, int) and length > 0 else None

  def count_tokens(self, prompts: list[str]) -> list[int] | None:
    """Each prompt's length in the endpoint's tokens (what its completions request would
    prefill, start tokens included) from its `/tokenize` route (vLLM's and SGLang's, at the
    server's root), cached with the completions; None when the endpoint has no such route."""
    keys = [_count_key(self.model, p) for p in prompts]
    found = self.cache.get_counts(keys)
    missing = sorted({p for p, k in zip(prompts, keys, strict=True) if k not in found})
    if missing:
      # One request first: an endpoint without the route answers it, and no more are sent.
      first = self._run_all(missing[:1], self._tokenize)
      if first[0] is None:
        return None
      counts = first + self._run_all(missing[1:], self._tokenize)
      new = [(_count_key(self.model, p), c) for p, c in zip(missing, counts, strict=True)]
      self.cache.put_counts(new)
      found.update(new)
    return [found[k] for k in keys]

  # -- requests -----------------------------------------------------------------------------
  def _headers(self) -> dict:
    return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

  def _sync_transport(self):
    """The transport of one-off synchronous requests (a test's mock transport serves both)."""
    import httpx

    if self.transport is None or isinstance(self.transport, httpx.BaseTransport):
      return self.transport
    return None

  def _run_all(self, items: list, fetch) -> list:
    """`await fetch(http, item)` of every item: `concurrency` workers take the items in
    order, each on a connection of its own (one shared httpx pool serialises its requests on
    a lock, and its throughput fell as concurrency rose: encode/httpx#3215)."""
    return asyncio.run(self._gather(items, fetch))

  async def _gather(self, items: list, fetch) -> list:
    import httpx

    # Ctrl-C raises KeyboardInterrupt in whichever worker runs then: the job reports it in
    # one line, and the worker's task, never awaited after it, stays quiet.
    asyncio.get_running_loop().set_exception_handler(_quiet_on_interrupt)
    # One TLS context for every worker (each would load the CA bundle again, 30 ms apiece).
    verify = _tls_context() if self.url.startswith("https://") else False
    todo = collections.deque(enumerate(items))
    results: list = [None] * len(items)
    started = self._started = time.monotonic()

    async def worker():
      limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
      async with httpx.AsyncClient(
        headers=self._headers(),
        timeout=self.timeout,
        limits=limits,
        transport=self.transport,
        verify=verify,
      ) as http:
        while todo:
          i, item = todo.popleft()
          results[i] = await fetch(http, item)

    try:
      async with asyncio.TaskGroup() as group:
        for _ in range(min(self.concurrency, len(items))):
          group.create_task(worker())
    except* HindsightError as errors:
      raise errors.exceptions[0] from None
    finally:
      self.stats.seconds += time.monotonic() - started
    return results

  async def _retried(self, request, where: str):
    """`await request()`, retried on the failures worth another try (module docstring)."""
    for attempt in range(self.retries + 1):
      try:
        return await request()
      except _Retry as e:
        if attempt == self.retries:
          raise HindsightError(
            f"endpoint {self.endpoint}: {e}{where} after {self.retries} retries"
          ) from None
        self.stats.retries += 1
        wait = self.backoff * 2**attempt if e.wait is None else e.wait
        await asyncio.sleep(min(wait, 30.0))
    raise AssertionError("unreachable")

  async def _fetch(self, http, draw: Draw) -> list[Completion]:
    """One draw: its request, retried (module docstring), its samples cached."""
    self.budget.reserve(draw.n)
    sampling = self.sampling_of(draw).body()
    if self.chat is None:
      body = {"model": self.model, "prompt": draw.prompt}
      parse = functools.partial(_choices, n=draw.n)
    else:
      body = {"model": self.model, **self.chat.body(draw)}
      sampling["max_completion_tokens"] = sampling.pop("max_tokens")
      parse = functools.partial(_choices, n=draw.n, text_of=self.chat.text_of)
    body.update(n=draw.n, seed=block_seed(draw.seed, draw.start), **sampling)
    where = f" (for {draw.where})" if draw.where else ""
    completions, tokens = await self._retried(
      lambda: self._request(http, self.url, body, parse, where), where
    )
    self.cache.put(list(zip(self._keys(draw), completions, strict=True)))
    self.budget.spent_tokens += tokens
    s = self.stats
    s.requests += 1
    s.completions += len(completions)
    s.tokens += tokens
    cut = sum(c.finish_reason == "length" for c in completions)
    s.truncated += cut
    if draw.max_tokens is not None:
      s.truncated_by_context += cut
    self._report()
    return completions

  async def _tokenize(self, http, prompt: str) -> int | None:
    """The prompt's token count from the endpoint's /tokenize, or None if it has none."""
    url = self.endpoint.rstrip("/").removesuffix("/v1") + "/tokenize"
    body = {"model": self.model, "prompt": prompt}
    return await self._retried(lambda: self._request(http, url, body, _count, missing=True), "")

  def _report(self, force: bool = False) -> None:
    """Completions, requests/s, tokens/s and the cache's share on the progress bar (at most
    5 times/s, and once more when a batch of draws is done, so its last figures are the
    totals)."""
    now = time.monotonic()
    if self.bar is None or (not force and now - getattr(self, "_reported", 0.0) < 0.2):
      return
    self._reported = now
    s = self.stats
    elapsed = max(s.seconds + (0 if force else now - self._started), 1e-9)
    rates = {"req_s": f"{s.requests / elapsed:.1f}", "tok_s": f"{s.tokens / elapsed:.3g}"}
    self.bar.set_postfix(completions=s.completions, cached=s.cached, **rates)

  async def _request(self, http, url: str, body: dict, parse, where: str = "",
                     missing: bool = False):  # fmt: skip
    """parse(the JSON answer) of one POST of `body` to `url`: a failure worth another try
    raises _Retry, a refusal a one-line HindsightError (naming `where`); `missing`: a route
    the server does not have (404, 405) answers None."""
    import httpx

    try:
      response = await http.post(url, json=body)
    except httpx.TimeoutException:
      raise _Retry(f"no answer within {self.timeout:g} s") from None
    except httpx.TransportError as e:
      raise _Retry(f"unreachable ({one_line(e) or type(e).__name__})") from None
    if response.status_code in RETRY_STATUS:
      wait = response.headers.get("retry-after")
      try:
        wait = float(wait) if wait is not None else None
      except ValueError:
        wait = None
      raise _Retry(f"HTTP {response.status_code}", wait)
    if missing and response.status_code in (404, 405):
      return None
    if response.status_code >= 400:
      raise HindsightError(
        f"endpoint {self.endpoint} refused the request{where} (HTTP {response.status_code}): "
        f"{_error_message(response)}"
      )
    try:
      return parse(response.json())
    except (ValueError, KeyError, TypeError, AttributeError):
      raise _Retry("malformed response (not a JSON answer of the route)") from None


def _quiet_on_interrupt(loop, context: dict) -> None:
  """The event loop's exception handler: an interrupted task's KeyboardInterrupt is the job's
  to report; anything else goes to asyncio's default handler."""
  if isinstance(context.get("exception"), KeyboardInterrupt):
    return
  loop.default_exception_handler(context)


def _count_key(model: str, prompt: str) -> str:
  return hashlib.sha256(json.dumps([model, prompt, "tokens"]).encode()).hexdigest()


def _choices(payload: dict, n: int, text_of=None) -> tuple[list[Completion], int]:
  """The n completions of a completions answer (or, with `text_of`, a chat answer: each
  choice's message as text) and the completion tokens it used (the server's `usage`, else
  the samples' words)."""
  choices = sorted(payload["choices"], key=lambda c: int(c["index"]))
  if text_of is not None:
    choices = [{"text": text_of(c["message"]), "finish_reason": c.get("finish_reason")}
               for c in choices]  # fmt: skip
  out = [_completion(c) for c in choices]
  if len(out) != n:
    raise _Retry(f"malformed response ({len(out)} choices for n = {n})")
  usage = payload.get("usage")
  tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
  return out, int(tokens) if isinstance(tokens, int) else sum(c.tokens for c in out)


def _count(payload: dict) -> int:
  """The token count of a /tokenize answer (vLLM's `count`, else its `tokens`)."""
  count = payload["count"] if "count" in payload else len(payload["tokens"])
  if not isinstance(count, int):
    raise TypeError("count")
  return count


@functools.cache
def _tls_context():
  import ssl

  import certifi

  return ssl.create_default_context(cafile=certifi.where())


def _completion(choice: dict) -> Completion:
  text = choice["text"]
  if not isinstance(text, str):
    raise TypeError("text")
  # Servers count tokens in `usage` for the whole request; a sample's own count is
  # estimated by its words (kept in the cache, for the record).
  finish = str(choice.get("finish_reason") or "stop")
  # A chat answer that ends in calls ends its turn as a stop does.
  return Completion(text, "stop" if finish == "tool_calls" else finish, len(text.split()))


def _error_message(response) -> str:
  try:
    payload = response.json()
    message = payload.get("error", {}).get("message") or payload.get("message") or ""
  except (ValueError, AttributeError):
    message = response.text[:200]
  return one_line(message) or response.reason_phrase


def api_key_from(env_var: str) -> str | None:
  """The API key in environment variable `env_var` (None: unset, no Authorization header)."""
  return os.environ.get(env_var) or None
