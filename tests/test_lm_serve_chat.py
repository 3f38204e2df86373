"""`hindsight lm serve`'s chat route against its own /v1/completions on the tiny random Qwen2
folder of tests/test_lm_server.py: a chat answer's default budget is the rest of the context,
`max_completion_tokens` wins over `max_tokens`, and text content parts are joined as vLLM
joins them."""

from __future__ import annotations

import pytest

from tests.test_lm_server import _post, write_folder

CHAT = pytest.mark.xdist_group("lm_serve_chat")
MESSAGES = [{"role": "user", "content": "Boxes hold 1 and 2."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  from hindsight.lm.server import running_lm

  folder = write_folder(str(tmp_path_factory.mktemp("chat_lm") / "tiny"))
  with running_lm(folder, name="tiny", max_batch=4) as (url, name):
    yield url, name


def _chat(url: str, name: str, messages: list, **fields) -> dict:
  got = _post(url, "/v1/chat/completions", {"model": name, "messages": messages, **fields})
  assert got.status_code == 200, got.text
  return got.json()


def _tokens(url: str, name: str, messages: list) -> list[int]:
  return _post(url, "/tokenize", {"model": name, "messages": messages}).json()["tokens"]


@CHAT
def test_a_chat_answer_without_a_budget_may_draw_the_rest_of_the_context(served):
  """No max_tokens: the answer is the completion of the rendered prompt at a budget of the
  rest of the 512-token context (vLLM's default), not the 16 of /v1/completions."""
  url, name = served
  ids = _tokens(url, name, MESSAGES)
  # A seed whose answer meets no EOS: it runs to the end of the context.
  for seed in range(30):
    chat = _chat(url, name, MESSAGES, seed=seed)
    if chat["choices"][0]["finish_reason"] == "length":
      break
  else:
    raise AssertionError("no seed ran to the end of the context")
  usage = chat["usage"]
  assert usage["prompt_tokens"] == len(ids)
  assert usage["prompt_tokens"] + usage["completion_tokens"] == 512
  plain = _post(url, "/v1/completions", {"model": name, "prompt": ids, "seed": seed,
                                         "max_tokens": 512 - len(ids)}).json()  # fmt: skip
  assert chat["choices"][0]["message"]["content"] == plain["choices"][0]["text"]
  assert plain["usage"]["completion_tokens"] == usage["completion_tokens"]


@CHAT
def test_max_completion_tokens_bounds_a_chat_answer_over_max_tokens(served):
  url, name = served
  ids = _tokens(url, name, MESSAGES)
  # A seed whose answer runs past 12 tokens.
  seed = next(s for s in range(30)
              if _chat(url, name, MESSAGES, seed=s, max_tokens=12)["usage"]["completion_tokens"]
              == 12)  # fmt: skip
  chat = _chat(url, name, MESSAGES, seed=seed, max_tokens=12, max_completion_tokens=5)
  assert chat["usage"]["completion_tokens"] == 5
  assert chat["choices"][0]["finish_reason"] == "length"
  plain = _post(url, "/v1/completions", {"model": name, "prompt": ids, "seed": seed,
                                         "max_tokens": 5}).json()  # fmt: skip
  assert chat["choices"][0]["message"]["content"] == plain["choices"][0]["text"]
  alone = _chat(url, name, MESSAGES, seed=seed, max_completion_tokens=7)
  assert alone["usage"]["completion_tokens"] == 7
  base = {"model": name, "messages": MESSAGES}
  zero = _post(url, "/v1/chat/completions", {**base, "max_completion_tokens": 0})
  assert zero.status_code == 400
  assert "max_completion_tokens must be >= 1, got 0" in zero.json()["error"]["message"]
  over = _post(url, "/v1/chat/completions", {**base, "max_completion_tokens": 512})
  assert over.status_code == 400
  message = over.json()["error"]["message"]
  assert "maximum context length is 512 tokens" in message and f"{len(ids) + 512}" in message


@CHAT
def test_text_content_parts_are_joined_one_per_line_as_vllm_joins_them(served):
  """A content given as text parts prompts what the string of their texts joined by "\\n"
  prompts (a part without text skipped); other parts, and a text that is no string, are a
  400."""
  url, name = served
  joined = [{"role": "user", "content": "Boxes hold 1\nand 2."}]
  first, second = {"type": "text", "text": "Boxes hold 1"}, {"type": "text", "text": "and 2."}
  parts = [{"role": "user", "content": [first, second]}]
  sparse = [{"role": "user", "content": [first, {"type": "text"}, second]}]
  expected = _tokens(url, name, joined)
  assert expected != _tokens(url, name, [{"role": "user", "content": "Boxes hold 1and 2."}])
  assert _tokens(url, name, parts) == _tokens(url, name, sparse) == expected
  answers = [_chat(url, name, m, seed=3, max_tokens=8) for m in (joined, parts)]
  assert answers[0]["choices"] == answers[1]["choices"]
  assert answers[0]["usage"] == answers[1]["usage"]
  for content, message in (
    ([{"type": "image_url", "image_url": {"url": "x"}}], "only text content parts"),
    ([{"type": "text", "text": 5}], "a text part's text must be a string"),
  ):
    got = _post(url, "/v1/chat/completions",
                {"model": name, "messages": [{"role": "user", "content": content}]})  # fmt: skip
    assert got.status_code == 400 and message in got.json()["error"]["message"], got.text
