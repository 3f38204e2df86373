"""The text world (and the tool world's agent) behind an OpenAI-compatible `/v1/completions`
endpoint, on loopback.

`hindsight text-world serve --port P` serves it (`--tools`: the tool world's agent, whose
choices are one turn each, `tool_world`); `running_world()` starts it in a thread
(tests, benchmarks, examples). A request's `prompt` is any prefix of a world trace (the
problem header and whole sentences); every choice continues it by parsing it back to the
state (`world.parse_prefix`) and sampling the scripted policy to the end of the episode.

The protocol is `serving.openai_protocol`'s (the fields vLLM and SGLang take that matter here, the
same refusals and error bodies as `hindsight lm serve`): `prompt` (a string or a list:
choices come back flattened, prompt-major; token ids are refused, the world has no
tokenizer), `n`, `max_tokens` (tokens are words here, default WORLD_MAX_TOKENS; a
continuation cut short ends with finish_reason "length"), `temperature`, `top_p`, `seed`
(choice j of a seeded request draws from the generator seeded with (seed, j), so a seeded
request is reproducible at any concurrency), `stop`, `echo`. `GET /stats` counts the requests
and completions served (what a rerun from the cache must leave unchanged).
"""

from __future__ import annotations

import contextlib

import msgspec
import numpy as np

from hindsight.errors import HindsightError
from hindsight.serving.openai_protocol import (
  CompletionRequest,
  Refusal,
  check_request,
  completion_body,
  prompts_of,
  protocol_app,
  read_request,
  running_app,
  serve_until_stopped,
)
from hindsight.worlds import world

# A whole continuation: the world's episodes are far shorter than this many words.
WORLD_MAX_TOKENS = 512


def _words(text: str) -> int:
  return len(text.split())


def _cut(text: str, req: CompletionRequest) -> tuple[str, str, int]:
  """(text, finish_reason, completion tokens): `text` cut at the request's first stop string
  (which is dropped, as OpenAI's servers drop it) and at its max_tokens words."""
  finish = "stop"
  cut = min((i for i in (text.find(s) for s in req.stops) if i >= 0), default=-1)
  if cut >= 0:
    text = text[:cut]
  limit = WORLD_MAX_TOKENS if req.max_tokens is None else req.max_tokens
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


def _lead(prompt: str, text: str) -> str:
  """A space between the prompt and what continues it, where the prompt ends in none."""
  return text if not text or prompt[-1:].isspace() else " " + text


def complete_one(
  prompt: str, state: world.WorldState, rng: np.random.Generator, req: CompletionRequest
) -> tuple[str, str, int]:
  """(text, finish_reason, completion tokens) of one choice continuing `prompt` (whose
  state is `state`): the text world's policy to the end of the episode."""
  sentences = world.continue_prefix(state, rng, req.temperature, req.top_p)
  return _cut(_lead(prompt, " ".join(sentences)), req)


def complete_turn(prompt: str, state, rng: np.random.Generator, req: CompletionRequest):
  """The tool world's choice: the agent's next turn (`tool_world.continue_turn`), up to and
  including its next call (which the stop sequence </tool_call> cuts, as it would a model's)."""
  from hindsight.worlds import tool_world

  return _cut(_lead(prompt, tool_world.continue_turn(state, rng, req.temperature, req.top_p)), req)


def create_app(tools: bool = False):
  """The Starlette app: POST /v1/completions and `protocol_app`'s GET routes; the text world's
  model, or with `tools` the tool world's agent (`tool_world`: one turn per choice)."""
  import copy

  from hindsight.worlds import tool_world

  model = tool_world.MODEL_NAME if tools else world.MODEL_NAME
  parse = tool_world.parse_prefix if tools else world.parse_prefix
  write = complete_turn if tools else complete_one
  stats = {"requests": 0, "completions": 0}
  decoder = msgspec.json.Decoder(CompletionRequest)

  async def completions(request):
    from starlette.responses import JSONResponse

    req = await read_request(request, decoder)
    check_request(req, model)
    prompts = prompts_of(req)
    if not all(isinstance(p, str) for p in prompts):
      raise Refusal(400, "prompt: the world reads text, not token ids")
    choices, used = [], 0
    for p_index, prompt in enumerate(prompts):
      try:
        state = parse(prompt)
      except HindsightError as e:
        raise Refusal(400, str(e)) from None
      for j in range(req.n):
        rng = np.random.default_rng(None if req.seed is None else [req.seed & (2**63 - 1), j])
        text, finish, tokens = write(prompt, copy.deepcopy(state), rng, req)
        used += tokens
        index = p_index * req.n + j
        choices.append({"index": index, "text": (prompt + text) if req.echo else text,
                        "finish_reason": finish, "logprobs": None})  # fmt: skip
    stats["requests"] += 1
    stats["completions"] += len(choices)
    prompt_tokens = sum(_words(p) for p in prompts)
    return JSONResponse(completion_body(req, stats["requests"], choices, prompt_tokens, used))

  return protocol_app({"/v1/completions": completions}, model, stats)


def serve_world(host: str = "127.0.0.1", port: int = 8100, tools: bool = False) -> None:
  """Serves the text world (or, `tools`, the tool world's agent) until SIGTERM/SIGINT."""
  from hindsight.worlds import tool_world

  if tools:
    name, model = "tool world", tool_world.MODEL_NAME
  else:
    world.policy_table(0.5)  # compile the policy before the first request waits for it
    name, model = "text world", world.MODEL_NAME
  serve_until_stopped(create_app(tools), host, port,
                      f"hindsight: {name} (model {model}) on http://{host}:{port}/v1")  # fmt: skip


@contextlib.contextmanager
def running_world(host: str = "127.0.0.1", port: int = 0, tools: bool = False):
  """The text world (`tools`: the tool world's agent) served from a thread: yields its base
  URL (http://HOST:PORT/v1)."""
  with running_app(create_app(tools), host, port) as url:
    yield url
