"""`hindsight serve` in the formats other RL stacks speak: vLLM's Pooling API as a process
reward model answers it, OpenRLHF's remote reward model, GET /v1/models; held against the
server's own /v1/credit on the same traces."""

from __future__ import annotations

import re

import msgspec
import numpy as np
import pytest

pytestmark = pytest.mark.xdist_group("text_model")

TAG = "<extra_0>"
NAME = "Qwen/Qwen2.5-Math-PRM-7B"

# vLLM's documented request for a process reward model (docs/models/pooling_models/reward.md:
# `llm.encode("Hello, my name is<extra_0><extra_0><extra_0>", pooling_task="token_classify")`,
# in the Pooling API's online form of docs/models/pooling_models/README.md: {"model", "input",
# "task"}), and the token ids of the same text with Qwen's step tag id (151651, vLLM's
# Qwen2ForProcessRewardModel default) in place of the tag.
VLLM_PRM_REQUEST = {"model": NAME, "input": "Hello, my name is<extra_0><extra_0><extra_0>",
                    "task": "token_classify"}  # fmt: skip
QWEN_STEP_TAG_ID = 151651


# What a vLLM client parses: vLLM's response types (vllm/entrypoints/pooling/pooling/
# protocol.py, vllm/entrypoints/openai/engine/protocol.py), as msgspec structs.
class UsageInfo(msgspec.Struct):
  prompt_tokens: int = 0
  total_tokens: int = 0
  completion_tokens: int | None = 0
  prompt_tokens_details: dict | None = None


class PoolingResponseData(msgspec.Struct):
  index: int
  data: list[list[float]]
  object: str = "pooling"


class PoolingResponse(msgspec.Struct):
  model: str
  data: list[PoolingResponseData]
  usage: UsageInfo
  id: str = ""
  object: str = "list"
  created: int = 0


@pytest.fixture(scope="module")
def served(text_run):
  """The text credit model served under vLLM's PRM's name, outcome 1 for requests without
  one; and its tokenizer."""
  from starlette.testclient import TestClient

  from hindsight.model.predictor import Predictor
  from hindsight.serving.app import create_app
  from hindsight.serving.config import ServeConfig

  predictor = Predictor.load(text_run["workdir"])
  cfg = ServeConfig(checkpoint=text_run["workdir"], served_model_name=NAME, outcome="1",
                    warmup=False, max_steps=12)  # fmt: skip
  with TestClient(create_app(cfg, predictor=predictor)) as client:
    _ready(client)
    yield client, predictor.spec.encoder.tokens, predictor


def _ready(client) -> None:
  import time

  for _ in range(600):
    if client.get("/readyz").status_code == 200:
      return
    time.sleep(0.1)
  raise AssertionError("the server never became ready")


def _credit(client, steps: list[str], prompt: str = "", **outcome) -> np.ndarray:
  """/v1/credit's credit of one trace (outcome 1 unless given)."""
  trace = {"prompt": prompt, "steps": steps, **(outcome or {"outcome": 1})}
  r = client.post("/v1/credit", json={"trajectories": [trace]})
  assert r.status_code == 200, r.text
  return np.asarray(r.json()["credit"][0])


def _rows(r) -> list[np.ndarray]:
  assert r.status_code == 200, r.text
  parsed = msgspec.json.decode(r.content, type=PoolingResponse)  # what a vLLM client reads
  return [np.asarray(item.data) for item in parsed.data]


def _probability(credit) -> np.ndarray:
  p = np.clip((1 + np.asarray(credit, float)) / 2, 0, 1)
  return np.stack([1 - p, p], 1)


def test_vllms_documented_prm_request_is_answered_in_vllms_shape(served):
  """The string form and the token-id form of vLLM's PRM example: one item, one [1 - c, c]
  row per step tag. The first step's c is /v1/credit's credit of the trace mapped to [0,
  1]; the two empty steps (tags in a row) did nothing: credit 0, [0.5, 0.5]. Usage counts
  the tokens the model read."""
  client, tok, _ = served
  r = client.post("/pooling", json=VLLM_PRM_REQUEST)
  (rows,) = _rows(r)
  body = r.json()
  assert body["model"] == NAME and body["object"] == "list" and body["id"].startswith("pool-")
  assert rows.shape == (3, 2)
  want = _probability([_credit(client, ["Hello, my name is"])[0], 0.0, 0.0])
  np.testing.assert_allclose(rows, want, atol=1e-6)
  # usage: the tokens the model read (this step encoder reads the steps, not the tags)
  assert body["usage"]["prompt_tokens"] == len(tok.encode("Hello, my name is"))
  assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"]
  ids = [*tok.encode("Hello, my name is").tolist(), *[QWEN_STEP_TAG_ID] * 3]
  (by_ids,) = _rows(client.post("/pooling", json={**VLLM_PRM_REQUEST, "input": ids}))
  np.testing.assert_allclose(by_ids, rows, atol=1e-6)
  # token ids of a chat template's text read as the string is: the prompt up to the
  # assistant's turn, then the steps
  chat = "<|im_start|>user\nHow many?<|im_end|>\n<|im_start|>assistant\nHello, my name is"
  (as_text,) = _rows(client.post("/pooling", json={"input": chat + TAG + "Bob. " + TAG}))
  chat_ids = [*tok.encode(chat).tolist(), QWEN_STEP_TAG_ID, *tok.encode("Bob. ").tolist(),
              QWEN_STEP_TAG_ID]  # fmt: skip
  (as_ids,) = _rows(client.post("/pooling", json={"input": chat_ids}))
  np.testing.assert_allclose(as_ids, as_text, atol=1e-6)
  models = client.get("/v1/models").json()
  assert [m["id"] for m in models["data"]] == [NAME] and models["object"] == "list"


def test_step_tags_at_the_start_the_end_repeated_and_absent(served):
  client, _, _ = served
  a, b = "Alice has 3 boxes. ", "Each holds 2 balls. "
  both = _credit(client, [a, b])

  def rows(text, **extra):
    (out,) = _rows(client.post("/pooling", json={"input": text, **extra}))
    return out

  np.testing.assert_allclose(rows(f"{a}{TAG}{b}{TAG}"), _probability(both), atol=1e-6)
  # text after the last tag is no step (vLLM gives it no row)
  np.testing.assert_allclose(rows(f"{a}{TAG}{b}{TAG}unfinished"), _probability(both), atol=1e-6)
  # a tag that opens the response: an empty first step
  only_b = _credit(client, [b])
  np.testing.assert_allclose(rows(f"{TAG}{b}{TAG}"), _probability([0.0, only_b[0]]), atol=1e-6)
  # repeated: an empty step between
  np.testing.assert_allclose(rows(f"{a}{TAG}{TAG}{b}{TAG}"),
                             _probability([both[0], 0.0, both[1]]), atol=1e-6)  # fmt: skip
  # absent: a 400 naming the tag as configured
  r = client.post("/pooling", json={"input": f"{a}{b}"})
  assert r.status_code == 400 and f"no step tag '{TAG}'" in r.json()["error"]["message"], r.text
  # the prompt: up to a chat template's assistant turn, or every message but the last
  prompt = "<|im_start|>user\nHow many balls?<|im_end|>\n<|im_start|>assistant\n"
  with_prompt = _credit(client, [a, b], prompt=prompt)
  np.testing.assert_allclose(rows(f"{prompt}{a}{TAG}{b}{TAG}"), _probability(with_prompt),
                             atol=1e-6)  # fmt: skip
  chat = {"messages": [{"role": "user", "content": "How many balls?"},
                       {"role": "assistant", "content": f"{a}{TAG}{b}{TAG}"}]}  # fmt: skip
  (by_chat,) = _rows(client.post("/pooling", json=chat))
  np.testing.assert_allclose(by_chat, _probability(_credit(client, [a, b], "How many balls?")),
                             atol=1e-6)  # fmt: skip
  # several inputs, each its own item; the raw credit with its std and classes on request
  r = client.post("/pooling", json={"input": [f"{a}{TAG}", f"{a}{TAG}{b}{TAG}"],
                                    "output": "credit", "outcome": [0, 1]})  # fmt: skip
  first, second = _rows(r)
  np.testing.assert_allclose(first[:, 0], _credit(client, [a], outcome=0), atol=1e-6)
  np.testing.assert_allclose(second[:, 0], both, atol=1e-6)
  assert (first[:, 1] > 0).all() and len(r.json()["data"][1]["klass"]) == 2
  # an empty step in raw output: credit 0, std 0, decorative
  r = client.post("/pooling", json={"input": f"{a}{TAG}{TAG}", "output": "credit"})
  (raw,) = _rows(r)
  assert raw[1].tolist() == [0.0, 0.0] and r.json()["data"][0]["klass"][1] == "decorative"
  # a reference is checked by the model's verifier: a wrong one is outcome 0
  answer = "So the answer is \\boxed{7}."
  right = rows(f"{a}{TAG}{answer}{TAG}", reference="7")
  wrong = rows(f"{a}{TAG}{answer}{TAG}", reference="8")
  np.testing.assert_allclose(right, _probability(_credit(client, [a, answer], outcome=1)),
                             atol=1e-6)  # fmt: skip
  np.testing.assert_allclose(wrong, _probability(_credit(client, [a, answer], outcome=0)),
                             atol=1e-6)  # fmt: skip
  assert not np.allclose(right, wrong)


def test_bad_pooling_requests_are_4xx_naming_the_problem(served, text_run):
  from starlette.testclient import TestClient

  from hindsight.serving.app import create_app
  from hindsight.serving.config import ServeConfig

  client, tok, predictor = served
  step = "Alice has 3 boxes. "
  cases = [
    ({"input": (step + TAG) * 13}, 400, "13 steps; the model reads at most 12"),
    ({"input": "word " * 400 + TAG}, 400, "tokens, longer than the"),  # over the model's steps
    ({**VLLM_PRM_REQUEST, "model": "other"}, 404, "The model `other` does not exist"),
    ({**VLLM_PRM_REQUEST, "task": "embed"}, 400, "task 'embed' is not served"),
    ({"input": [1.5]}, 400, "input[0] must be a string"),
    ({"input": [tok.vocab_size + 5, QWEN_STEP_TAG_ID]}, 400, "outside the model's vocabulary"),
    ({"input": f"{TAG}{TAG}"}, 400, "every step is empty"),
    ({"input": [f"a{TAG}", f"b{TAG}"], "outcome": [1]}, 400, "'outcome' has 1 entries"),
    (
      {"messages": [{"role": "assistant", "content": f"a{TAG}"}, {"role": "user", "content": "b"}]},
      400,
      "the last message must be",
    ),
    ({"messages": [{"role": "user", "content": 3}]}, 400, "'messages' must be"),
    ({"input": [f"a{TAG}"] * 300}, 413, "300 inputs in one request; the limit is 256"),
    ({"input": f"a{TAG}", "outcome": 2}, 400, "'outcome' must be a number in [0, 1]"),
  ]
  for body, status, fragment in cases:
    r = client.post("/pooling", json=body)
    assert r.status_code == status and fragment in r.json()["error"]["message"], (body, r.text)
  raw = b'{"input": "caf\xe9<extra_0>"}'  # not UTF-8
  r = client.post("/pooling", content=raw, headers={"content-type": "application/json"})
  assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text
  from hindsight.errors import HindsightError

  for bad in ("2", "yes"):  # a server-wide outcome is a number in [0, 1], checked at start
    with pytest.raises(HindsightError, match="outcome must be a number in"):
      ServeConfig(checkpoint=text_run["workdir"], outcome=bad)
  # without a server-wide outcome, a request with no outcome is a 400 naming the field; a
  # custom step tag is the one named when absent
  cfg = ServeConfig(checkpoint=text_run["workdir"], warmup=False, step_tag="<step>")
  with TestClient(create_app(cfg, predictor=predictor)) as other:
    _ready(other)
    r = other.post("/pooling", json={"input": f"{step}<step>"})
    assert r.status_code == 400 and "no outcome" in r.json()["error"]["message"], r.text
    r = other.post("/pooling", json={"input": f"{step}{TAG}", "outcome": 1})
    assert r.status_code == 400 and "no step tag '<step>'" in r.json()["error"]["message"]


def test_openrlhfs_remote_reward_request_gets_the_outcome_and_the_steps_credit(served):
  """{"query": prompt + response, "prompts", "labels"} -> rewards: the verifier's outcome of
  the response against its label; the steps (cut by the model's rule) and their credit are
  /v1/credit's for the same trace."""
  from hindsight.worlds import world

  client, _, _ = served
  traces = [t for t in world.sample_traces(5, 12) if len(t.steps) <= 12][:3]
  prompts = [t.prompt for t in traces]
  body = {"query": [t.prompt + t.completion() for t in traces], "prompts": prompts,
          "labels": [t.reference for t in traces]}  # fmt: skip
  r = client.post("/get_reward", json=body)
  assert r.status_code == 200, r.text
  got = r.json()
  same = client.post("/v1/credit", json={"trajectories": [
    {"prompt": t.prompt, "text": t.completion(), "reference": t.reference} for t in traces
  ]}).json()  # fmt: skip
  assert got["steps"] == same["steps"]
  for mine, theirs in zip(got["step_credit"], same["credit"], strict=True):
    np.testing.assert_allclose(mine, theirs, atol=1e-6)
  # each trace's outcome read off its text: its boxed answer against the reference
  boxed = [re.search(r"\\boxed\{([^}]*)\}", t.completion()) for t in traces]
  assert got["rewards"] == [float(b is not None and b.group(1) == t.reference)
                            for b, t in zip(boxed, traces, strict=True)]  # fmt: skip
  wrong = dict(body, labels=["-1"] * 3)  # an answer the world never gives
  assert client.post("/get_reward", json=wrong).json()["rewards"] == [0.0, 0.0, 0.0]
  r = client.post("/get_reward", json=dict(body, prompts=["nope"] * 3))
  assert r.status_code == 400 and "does not hold prompts[0]" in r.text
  # a left-padded query (OpenRLHF decodes its padded sequences as text): the response is
  # what follows the prompt
  padded = dict(body, query=["<pad><pad>" + q for q in body["query"]])
  again = client.post("/get_reward", json=padded).json()
  assert again["steps"] == got["steps"] and again["rewards"] == got["rewards"]


def test_an_agent_conversation_sent_to_pooling_is_refused_pointing_to_v1_credit(served):
  """vLLM's chat form of an agent's turns (an assistant message with `tool_calls`, the
  result as a `tool` message) is no PRM request: /pooling would read every message but the
  last as the prompt, the calls lost. It is a 400 naming /v1/credit, which reads agent
  traces; the same conversation without its tool turns is scored."""
  client, _, _ = served
  call = {"id": "call_0", "type": "function",
          "function": {"name": "read", "arguments": '{"box": 1}'}}  # fmt: skip
  messages = [
    {"role": "user", "content": "How many apples are in box 1?"},
    {"role": "assistant", "content": "Reading box 1.", "tool_calls": [call]},
    {"role": "tool", "tool_call_id": "call_0", "content": "box 1 holds 3"},
    {"role": "assistant", "content": f"Box 1 holds 3. {TAG}So the answer is 3.{TAG}"},
  ]
  without_content = [dict(m, content=None) if "tool_calls" in m else m for m in messages]
  only_result = [m for m in messages if "tool_calls" not in m]
  for conversation in (messages, without_content, only_result):
    message = _error(client.post("/pooling", json={"messages": conversation, "outcome": 1}), 400)
    assert message.startswith("'messages' is an agent conversation"), message
    assert "send it to POST /v1/credit as an agent trace" in message, message
  (rows,) = _rows(client.post("/pooling", json={"messages": [messages[0], messages[-1]],
                                                 "outcome": 1}))  # fmt: skip
  assert rows.shape == (2, 2)


@pytest.mark.parametrize(
  "turn",
  [
    {"role": "tool", "tool_call_id": "c", "content": "box 1 holds 3"},
    {"role": "function", "name": "read", "content": "box 1 holds 3"},  # the legacy result
    {"role": "assistant", "content": "Reading.", "tool_calls": [
      {"id": "c", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
    {"role": "assistant", "content": None,
     "function_call": {"name": "read", "arguments": "{}"}},  # the legacy call
  ],
)  # fmt: skip
def test_every_form_of_a_tool_turn_makes_messages_an_agent_conversation(turn):
  """OpenAI's tool calls and results, and their legacy `function` forms, each make a
  /pooling conversation an agent's (refused before the model reads anything); an assistant
  message whose `tool_calls` list is empty is a plain one."""
  from hindsight.serving.formats import FormatError, read_pooling

  def read(middle):
    messages = [{"role": "user", "content": "How many?"}, middle,
                {"role": "assistant", "content": f"Box 1 holds 3. {TAG}"}]  # fmt: skip
    body = {"messages": messages, "outcome": 1}
    return read_pooling(body, model=NAME, tokenizer=None, tag=TAG, tag_id=QWEN_STEP_TAG_ID,
                        response_start="", outcome=None)  # fmt: skip

  with pytest.raises(FormatError, match=r"^'messages' is an agent conversation"):
    read(turn)
  plain = read({"role": "assistant", "content": "Thinking.", "tool_calls": []})
  assert [t["steps"] for t in plain.traces] == [["Box 1 holds 3. "]]


# -- agent traces ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_model(text_run):
  """The text model as a model of agent traces labeled with the environment's outcome
  (`--verifier env`) that reads a call with its result: steps of up to 256 tokens (the test
  model learned short sentences; positions past those reuse the last it knows)."""
  import dataclasses
  import json

  from hindsight.model.predictor import Predictor

  p = Predictor.load(text_run["workdir"])
  options = {**json.loads(p.spec.label_options), "verifier": "env"}
  encoder = dataclasses.replace(p.spec.encoder, max_step_tokens=256)
  spec = dataclasses.replace(p.spec, label_options=json.dumps(options), encoder=encoder)
  return Predictor(p.graphdef, p.state, spec, p.model_config, p.step, p.sigma_scale)


def _agent_client(predictor, text_run, **cfg):
  from starlette.testclient import TestClient

  from hindsight.serving.app import create_app
  from hindsight.serving.config import ServeConfig

  cfg = ServeConfig(checkpoint=text_run["workdir"], warmup=False, max_steps=8, **cfg)
  return TestClient(create_app(cfg, predictor=predictor))


def _agent_trace(agent_steps: int, calls: int, **fields) -> dict:
  """A trace of `agent_steps` agent steps, the first `calls` of them calls, each followed by
  its result (a step of role `tool`): agent_steps + calls entries in `steps`."""
  from hindsight.text.tool_syntax import render_call, render_result

  steps = []
  for j in range(agent_steps):
    if j < calls:
      steps.append({"text": f"Reading box {j}. " + render_call("read", {"box": j})})
      steps.append({"text": render_result(f"box {j} holds {j + 2}"), "role": "tool"})
    else:
      steps.append({"text": f"Adding them up gives {j}. "})
  return {"prompt": "Count the apples.\n", "steps": steps, **fields}


def _error(r, status: int) -> str:
  assert r.status_code == status, r.text
  return r.json()["error"]["message"]


def test_the_step_limit_counts_an_agent_traces_agent_steps(agent_model, text_run, tmp_path):
  """A 5-step agent trace whose 4 calls each have their result is 9 entries in `steps`: the
  model reads 5 steps, each result joined to its call, so a server of 8 steps scores it, as
  `hindsight score` does; one of 9 agent steps (13 entries) is a 413 that counts both."""
  import json

  from hindsight.serving.batch import score_file

  trace = _agent_trace(5, 4, outcome=1)
  entries = [s["text"] for s in trace["steps"]]
  merged = [a + b for a, b in zip(entries[0:8:2], entries[1:8:2], strict=True)] + entries[8:]
  with _agent_client(agent_model, text_run) as client:
    _ready(client)
    r = client.post("/v1/credit", json={"trajectories": [trace]})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["steps"] == [merged] and len(got["credit"][0]) == 5
    path, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    path.write_text(json.dumps(trace) + "\n")
    score_file(agent_model, str(path), str(out), progress=False)
    scored = json.loads(out.read_text())
    assert scored["step_text"] == merged
    np.testing.assert_allclose(got["credit"][0], scored["predicted_credit"], atol=1e-6)
    r = client.post("/v1/credit", json={"trajectories": [trace, _agent_trace(9, 4, outcome=1)]})
    assert _error(r, 413) == (
      "trajectories[1]: 9 agent steps (from 13 entries in 'steps'); the limit is 8 "
      "(`hindsight serve --max-steps N` serves longer ones)"
    )


def test_a_model_of_the_environments_outcome_asks_for_the_outcome_not_a_reference(
  agent_model, text_run, tmp_path
):
  """Labels of `--verifier env` took the outcome off the environment's final state: no
  verifier checks a reference. A request that sends one (a PRM's `reference`, OpenRLHF's
  `labels`) is told to send `outcome`, or to start the server with `--outcome`, which is
  then the outcome of such a request."""
  import json

  from hindsight.errors import HindsightError
  from hindsight.serving.batch import score_file

  trace = _agent_trace(2, 1, reference="5")
  pooling = {"input": f"Box 1 holds 3. {TAG}", "reference": "5"}
  reward = {"query": ["Count.\nBox 1 holds 3."], "prompts": ["Count.\n"], "labels": ["5"]}
  with _agent_client(agent_model, text_run) as client:
    _ready(client)
    message = _error(client.post("/v1/credit", json={"trajectories": [trace]}), 400)
    assert message == ("trajectories[0]: this model's outcome is its environment's (labels of "
                       "--verifier env), which 'reference' cannot give: send \"outcome\" (in "
                       "[0, 1])")  # fmt: skip
    assert client.post("/v1/credit", json={"trajectories": [dict(trace, outcome=1)]}).is_success
    for route, body, start in (("/pooling", pooling, "input[0]: "),
                               ("/get_reward", reward, "query[0]: ")):  # fmt: skip
      message = _error(client.post(route, json=body), 400)
      assert message.startswith(f"{start}this model's outcome is its environment's"), message
      assert message.endswith('send "outcome" (in [0, 1]), or start the server with --outcome')
    message = _error(client.post("/pooling", json={"input": pooling["input"]}), 400)
    assert "no outcome" in message and "reference" not in message, message
  with _agent_client(agent_model, text_run, outcome="1") as client:
    _ready(client)
    r = client.post("/get_reward", json=reward)
    assert r.status_code == 200 and r.json()["rewards"] == [1.0], r.text
    (rows,) = _rows(client.post("/pooling", json=pooling))
    assert rows.shape == (1, 2)
  path = tmp_path / "in.jsonl"
  path.write_text(json.dumps(trace) + "\n")
  with pytest.raises(HindsightError, match="episode 0: this model's outcome is its environment"):
    score_file(agent_model, str(path), str(tmp_path / "out.jsonl"), progress=False)


@pytest.mark.slow
def test_bench_serve_times_the_pooling_route_beside_v1_credit(text_run):
  """eval/bench_serve.py on a text model: the same trace through /v1/credit and as a vLLM
  PRM request through /pooling, each route's rows and the /pooling goals printed."""
  import os
  import subprocess
  import sys

  from tests.conftest import ROOT

  port = 18000 + os.getpid() % 1000
  proc = subprocess.run(
    [sys.executable, "eval/bench_serve.py", "--checkpoint", text_run["workdir"], "--steps", "8",
     "--clients", "1,16", "--seconds", "0.3", "--port", str(port), "--load-generator",
     "threads"],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  for path in ("/v1/credit", "/pooling"):
    block = proc.stdout.split(f"POST {path}:")[1].split("POST ")[0]
    rows = re.findall(r"(\d+) clients: +(\d+) requests", block)
    assert [int(c) for c, _ in rows] == [1, 16] and all(int(n) > 0 for _, n in rows), block
  assert re.search(r"/pooling p99, one client, 8-step trace: [\d.]+ ms", proc.stdout)
  assert re.search(r"/pooling / /v1/credit steps/s at 16 clients: +\d+%", proc.stdout)
