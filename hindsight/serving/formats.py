"""The request formats other RL stacks speak, read into hindsight's text traces and answered
in their own shape (the routes are `serving.app`'s):

  POST /pooling      vLLM's Pooling API with "task": "token_classify" (STEP pooling, as vLLM
                     serves a process reward model): `input` a string, a list of strings, a
                     list of token ids or a list of such lists, or `messages` (chat). Each
                     input's response is cut at the step tag (`ServeConfig.step_tag`, Qwen's
                     PRM's "<extra_0>"; in token ids `step_tag_id`): every tag closes a step,
                     so an input has one step, and one output row, per tag. The prompt is the
                     text up to the last `response_start` marker (a chat template's assistant
                     turn; none: ""), or with `messages` every message but the last, whose
                     content is the response. Text after the last tag is no step (vLLM gives
                     it no row). Rows: [1 - c, c] with c = (1 + credit) / 2, credit in
                     [-1, 1] mapped to [0, 1] (a PRM's [p_negative, p_positive]); with
                     "output": "credit", [credit, credit_std] and the classes beside them.
                     `usage` counts the tokens the model reads (its tokenizer's: a step
                     encoder's the steps', an LM backbone's the prompt's too; no tag).
                     `messages` with tool calls or their results (an agent's conversation)
                     are a 400 pointing to /v1/credit, which reads agent traces.
  POST /get_reward   OpenRLHF's remote reward model: {"query": [prompt + response], "prompts":
                     [prompt], "labels": [reference]} -> {"rewards": [R]}, R the outcome the
                     model's verifier gives the response against its label, with the steps
                     (cut by the model's chunking rule), their credit and classes beside it.

A credit model reads the trace's outcome. A PRM client sends none: a request may carry
"outcome" (a number in [0, 1], or one per input) or "reference" (a string, or one per
input, checked by the model's verifier), else the server's `--outcome` is taken; with none
of them the request is a 400 naming the field. A model whose labels took the environment's
outcome (`--verifier env`) has no verifier to check a reference with: its reference (or
label) is a 400 saying to send "outcome", unless the server has an `--outcome`, which is
then taken instead. An empty step (a tag that opens the
response, or two in a row) did nothing: its credit is 0, its std 0, its class decorative,
and the model reads the trace without it.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

import numpy as np

from hindsight.credit.names import KLASS_NAMES

TASK = "token_classify"
OUTPUTS = ("probability", "credit")
_DECORATIVE = KLASS_NAMES.index("decorative")


class FormatError(ValueError):
  """A request that is not in the format: a 400 naming what is wrong."""


class UnknownModel(Exception):
  """A request naming another model than the one served: vLLM's 404."""


# -- vLLM's Pooling API ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PoolingRequest:
  """One /pooling request read into traces (`traces`: what the model scores, empty steps
  left out) and how to answer it (`layout[i]`: for each step tag of input i, the index of
  its step in traces[i], or None for an empty step; `output`: the rows' form)."""

  traces: list[dict]
  layout: list[list[int | None]]
  output: str


def checks_references(spec) -> bool:
  """Whether a reference can give the outcome of a trace the model reads: its labels'
  verifier checks a completion against one, but the environment's outcome (`--verifier
  env`, read off the environment's final state) cannot be had from a request."""
  options = json.loads(spec.label_options) if spec.label_options else {}
  return options.get("verifier") != "env"


def unverifiable_reference(trace, spec, where: str) -> str | None:
  """The one-line refusal of a trace whose outcome is to come from its `reference` (it sends
  no outcome, success or rewards) where the model checks none (`checks_references`); else
  None."""
  if checks_references(spec) or not isinstance(trace, dict) or trace.get("reference") is None:
    return None
  if any(trace.get(k) is not None for k in ("outcome", "success", "rewards")):
    return None
  return _unchecked(where, "reference", server_outcome=False)


def split_response(text: str, tag: str, response_start: str) -> tuple[str, list[str]]:
  """(prompt, steps) of one input string: the prompt up to and including the last
  `response_start` before the first tag ("" when there is none, or none is configured),
  then one step per `tag` (the text since the previous tag); text after the last tag is no
  step."""
  prompt, response = "", text
  if response_start:
    cut = text.split(tag, 1)[0].rfind(response_start)
    if cut >= 0:
      prompt, response = text[: cut + len(response_start)], text[cut + len(response_start) :]
  return prompt, response.split(tag)[:-1]


def _per_input(body: dict, name: str, n: int) -> list[Any]:
  """A per-input field: absent (None each), one value for every input, or a list of n."""
  value = body.get(name)
  if isinstance(value, list):
    if len(value) != n:
      raise FormatError(f"'{name}' has {len(value)} entries for {n} inputs")
    return value
  return [value] * n


def _inputs(body: dict, tokenizer, tag: str, tag_id: int, response_start: str):
  """[(prompt, steps)] of a request's `input` or `messages`."""
  if body.get("messages") is not None:
    messages = body["messages"]
    if isinstance(messages, list) and any(_tool_message(m) for m in messages):
      raise FormatError("'messages' is an agent conversation (tool calls and their results), "
                        "which /pooling does not read: send it to POST /v1/credit as an "
                        "agent trace (a prompt, then steps, each result a step of role "
                        "'tool')")  # fmt: skip
    if (
      not isinstance(messages, list)
      or not messages
      or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
    ):
      raise FormatError("'messages' must be a non-empty list of {role, content} objects")
    *before, last = messages
    if last.get("role") != "assistant":
      raise FormatError("the last message must be the assistant's response (its steps)")
    _, steps = split_response(last["content"], tag, "")
    return [("\n".join(m["content"] for m in before), steps)]
  given = body.get("input")
  if given is None:
    raise FormatError("expected 'input' (a string, strings or token ids) or 'messages'")
  if isinstance(given, str):
    given = [given]
  elif isinstance(given, list) and given and all(_is_id(x) for x in given):
    given = [given]  # one sequence of token ids
  if not isinstance(given, list) or not given:
    raise FormatError("'input' must be a string, a list of strings or lists of token ids")
  out = []
  for i, item in enumerate(given):
    if isinstance(item, str):
      out.append(split_response(item, tag, response_start))
    elif isinstance(item, list) and item and all(_is_id(x) for x in item):
      out.append(_split_ids(item, tokenizer, tag, tag_id, response_start, i))
    else:
      raise FormatError(f"input[{i}] must be a string or a non-empty list of token ids")
  return out


def _tool_message(message) -> bool:
  """Whether a chat message is a tool call or its result (OpenAI's and vLLM's forms)."""
  return isinstance(message, dict) and (
    message.get("role") in ("tool", "function")
    or bool(message.get("tool_calls"))
    or bool(message.get("function_call"))
  )


def _with_outcome(trace: dict, value, reference, default: float | None, missing: str,
                  unchecked: str | None = None) -> dict:  # fmt: skip
  """`trace` with its outcome: the request's value, else its reference (the verifier reads
  it), else the server's default; FormatError(`missing`) with none. `unchecked`: the model
  checks no reference (`checks_references`), and a reference without a default is
  FormatError(`unchecked`)."""
  if value is not None:
    return {**trace, "outcome": value}
  if reference is not None and unchecked is None:
    return {**trace, "reference": str(reference)}
  if default is not None:
    return {**trace, "outcome": default}
  raise FormatError(missing if reference is None else unchecked)


def _unchecked(where: str, field: str, server_outcome: bool = True) -> str:
  """What a reference sent to a model that checks none is told (`server_outcome`: where
  the server's `--outcome` would be taken)."""
  return (f"{where}: this model's outcome is its environment's (labels of --verifier env), "
          f"which '{field}' cannot give: send \"outcome\" (in [0, 1])"
          + ", or start the server with --outcome" * server_outcome)  # fmt: skip


def _is_id(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _split_ids(ids: list[int], tokenizer, tag: str, tag_id: int, response_start: str, i: int):
  """(prompt, steps) of one token-id input: the pieces between `tag_id`s decoded (a chat
  template's special tokens kept as text) and read as the string form is."""
  vocab = tokenizer.vocab_size
  bad = next((x for x in ids if x != tag_id and not 0 <= x < vocab), None)
  if bad is not None:
    raise FormatError(f"input[{i}]: token id {bad} is outside the model's vocabulary "
                      f"[0, {vocab}) and is not the step tag's id {tag_id}")  # fmt: skip
  pieces, current = [], []
  for x in ids:
    if x == tag_id:
      pieces.append(current)
      current = []
    else:
      current.append(x)
  text = "".join(tokenizer.decode(p, keep_special=True) + tag for p in pieces)
  return split_response(text, tag, response_start)


def read_pooling(body, *, model: str, tokenizer, tag: str, tag_id: int, response_start: str,
                 outcome: float | None, checked: bool = True) -> PoolingRequest:  # fmt: skip
  """A /pooling body (module docstring) -> `PoolingRequest`; FormatError on a bad one,
  UnknownModel for another model's name (vLLM's 404). `checked`: whether the model checks a
  reference (`checks_references`)."""
  if not isinstance(body, dict):
    raise FormatError('expected a JSON object: {"input": ..., "task": "token_classify"}')
  task = body.get("task")
  if task is not None and task != TASK:
    raise FormatError(f"task '{task}' is not served here: this server answers '{TASK}' "
                      "(per-step credit, as a process reward model)")  # fmt: skip
  name = body.get("model")
  if name is not None and name != model:
    raise UnknownModel(f"The model `{name}` does not exist.")
  output = body.get("output", OUTPUTS[0])
  if output not in OUTPUTS:
    raise FormatError(f"'output' must be one of {', '.join(OUTPUTS)}, got {output!r}")
  inputs = _inputs(body, tokenizer, tag, tag_id, response_start)
  outcomes = _per_input(body, "outcome", len(inputs))
  references = _per_input(body, "reference", len(inputs))
  traces, layout = [], []
  for i, ((prompt, steps), value, reference) in enumerate(
    zip(inputs, outcomes, references, strict=True)
  ):
    if not steps:
      raise FormatError(f"input[{i}] has no step tag '{tag}' (token id {tag_id}): each tag "
                        "closes a step, so it has no step to credit")  # fmt: skip
    kept = [s for s in steps if s.strip()]
    if not kept:
      raise FormatError(f"input[{i}]: every step is empty (nothing between its step tags)")
    rows, k = [], 0
    for s in steps:
      rows.append(k if s.strip() else None)
      k += bool(s.strip())
    trace = {"prompt": prompt, "steps": kept, "id": f"input[{i}]"}
    missing = (f"input[{i}] has no outcome: the credit model reads the trace's outcome; "
               "send \"outcome\" (in [0, 1])" + ' or "reference"' * checked +
               ", or start the server with --outcome")  # fmt: skip
    unchecked = None if checked else _unchecked(f"input[{i}]", "reference")
    traces.append(_with_outcome(trace, value, reference, outcome, missing, unchecked))
    layout.append(rows)
  return PoolingRequest(traces, layout, output)


def pooling_answer(request: PoolingRequest, scores: list[dict], model: str,
                   tokens: int) -> dict:  # fmt: skip
  """vLLM's PoolingResponse: one item per input, one row per step tag (module docstring);
  `usage` counts `tokens`, what the model read of the inputs."""
  data = []
  for i, (rows, s) in enumerate(zip(request.layout, scores, strict=True)):
    credit = np.asarray(s["credit"], np.float64)
    std = np.asarray(s["std"], np.float64)
    c = np.array([0.0 if k is None else credit[k] for k in rows])
    item: dict[str, Any] = {"index": i, "object": "pooling"}
    if request.output == "credit":
      sd = np.array([0.0 if k is None else std[k] for k in rows])
      item["data"] = np.stack([c, sd], 1).tolist()
      klass = np.asarray(s["klass"])
      item["klass"] = [KLASS_NAMES[_DECORATIVE if k is None else int(klass[k])] for k in rows]
    else:
      p = np.clip((1.0 + c) / 2.0, 0.0, 1.0)
      item["data"] = np.stack([1.0 - p, p], 1).tolist()
    data.append(item)
  usage = {"prompt_tokens": tokens, "total_tokens": tokens,
           "completion_tokens": 0, "prompt_tokens_details": None}  # fmt: skip
  return {"id": f"pool-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
          "model": model, "data": data, "usage": usage}  # fmt: skip


def models_answer(model: str, max_model_len: int, created: int) -> dict:
  """GET /v1/models as vLLM lists its model."""
  return {"object": "list", "data": [{
    "id": model, "object": "model", "created": created, "owned_by": "hindsight", "root": model,
    "parent": None, "max_model_len": max_model_len, "permission": [],
  }]}  # fmt: skip


# -- OpenRLHF's remote reward model ----------------------------------------------------------


def read_openrlhf(body, outcome: float | None, checked: bool = True) -> list[dict]:
  """{"query", "prompts", "labels"?} -> the traces (the response is the query after its
  prompt, cut into steps by the model's chunking rule; the outcome from the label).
  `checked`: whether the model checks a label (`checks_references`)."""
  if not isinstance(body, dict) or not isinstance(body.get("query"), list):
    raise FormatError('expected {"query": [...], "prompts": [...], "labels": [...]}')
  queries = body["query"]
  if not queries:
    raise FormatError("'query' is empty")
  prompts = _per_input(body, "prompts", len(queries))
  labels = _per_input(body, "labels", len(queries))
  outcomes = _per_input(body, "outcome", len(queries))
  traces = []
  for i, (q, p, label, value) in enumerate(zip(queries, prompts, labels, outcomes,
                                               strict=True)):  # fmt: skip
    if not isinstance(q, str):
      raise FormatError(f"query[{i}] must be a string")
    p = p or ""
    # the query is the prompt, then the response (after any left padding's text)
    start = q.find(p) if isinstance(p, str) else -1
    if start < 0:
      raise FormatError(f"query[{i}] does not hold prompts[{i}] (the query is the prompt "
                        "followed by the response)")  # fmt: skip
    response = q[start + len(p) :]
    if not response.strip():
      raise FormatError(f"query[{i}] has no response after its prompt")
    trace = {"prompt": p, "text": response, "id": f"query[{i}]"}
    if checked:
      missing = (f"query[{i}] has no label: the reward is the outcome the model's verifier "
                 "gives against 'labels' (or send \"outcome\", or start the server with "
                 "--outcome)")  # fmt: skip
      unchecked = None
    else:
      missing = (f"query[{i}] has no outcome: send \"outcome\" (in [0, 1]), or start the "
                 "server with --outcome")  # fmt: skip
      unchecked = _unchecked(f"query[{i}]", "labels")
    traces.append(_with_outcome(trace, value, label, outcome, missing, unchecked))
  return traces


def step_lists(scores: list[dict]) -> dict:
  """The scores' per-step credit, its std and classes (by name) as JSON lists, per trace."""
  names = np.asarray(KLASS_NAMES)
  return {"credit": [s["credit"].astype(float).tolist() for s in scores],
          "credit_std": [s["std"].astype(float).tolist() for s in scores],
          "klass": [names[s["klass"]].tolist() for s in scores]}  # fmt: skip


def openrlhf_answer(episodes: list, scores: list[dict]) -> dict:
  """{"rewards": [R]} (the outcome each response reached), with the steps, their credit and
  classes beside it."""
  steps = step_lists(scores)
  return {
    "rewards": [float(e.rewards.sum()) for e in episodes],
    "step_credit": steps["credit"],
    "step_credit_std": steps["credit_std"],
    "step_klass": steps["klass"],
    "steps": [list(s.get("steps", e.step_text)) for e, s in zip(episodes, scores, strict=True)],
  }
