"""Agent traces as real chat models and agent stacks write them: the layout of calls and
results read off a model's chat template (Qwen2.5's, shipped in tests/data), OpenAI chat logs
(`messages`, `tool_calls` lists, parallel calls), one agent step per assistant turn, and
resampling through /v1/completions in the template's layout and through /v1/chat/completions
with structured tool calls (fake endpoints on loopback, a shopping-cart environment)."""

from __future__ import annotations

import copy
import json
import os
import re

import pytest

from hindsight.agentic.labeler import AgentLabeler
from hindsight.agentic.tools import ToolEnv, ToolError
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.serving.openai_protocol import running_app
from hindsight.text.agent_trace import agent_steps, agent_view
from hindsight.text.chat_log import from_messages, to_messages
from hindsight.text.chat_template import load_chat_template
from hindsight.text.options import TextOptions
from hindsight.text.tool_syntax import HERMES, ToolCall, ToolLayout, layout_from_template
from hindsight.text.trace import TextStep, TextTrace, write_traces

QWEN = os.path.join(os.path.dirname(__file__), "data", "qwen2_5_chat_template.jinja")
ITEM = "Crème brûlée"
# A call without arguments as Qwen2.5's template writes it (`.format(name)`).
QWEN_CALL = '<tool_call>\n{{"name": "{}", "arguments": {{}}}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen():
  template = load_chat_template(QWEN)
  return template, layout_from_template(template, "qwen2.5")


class Cart(ToolEnv):
  """A shopping cart: add(item), view(), checkout() (irreversible: ends the episode);
  outcome 1 iff the checked-out cart holds the dessert. Every call is logged in order."""

  branching = "functional"

  def __init__(self):
    self.log = []

  def reset(self, trace, seed):
    return {"cart": [], "paid": False}

  def step(self, state, call: ToolCall):
    self.log.append(call.name)
    if state["paid"]:
      raise ToolError("the order is closed")
    if call.name == "add":
      state["cart"].append(call.arguments["item"])
      return state, f"added {call.arguments['item']}", False
    if call.name == "view":
      return state, ", ".join(state["cart"]) or "empty", False
    if call.name == "checkout":
      state["paid"] = True
      return state, "paid", True
    raise ToolError(f"no tool {call.name}")

  def outcome(self, state):
    return float(state["paid"] and ITEM in state["cart"])


def _call(i: str, name: str, **arguments) -> dict:
  arguments = json.dumps(arguments, ensure_ascii=False)
  return {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}}


MESSAGES = [
  {"role": "system", "content": "You shop."},
  {"role": "user", "content": f"Buy the {ITEM}."},
  {"role": "assistant", "content": "Adding it and looking.",
   "tool_calls": [_call("a", "add", item=ITEM), _call("b", "view")]},
  {"role": "tool", "tool_call_id": "a", "content": f"added {ITEM}"},
  {"role": "tool", "tool_call_id": "b", "content": ITEM},
  {"role": "assistant", "content": None, "tool_calls": [_call("c", "checkout")]},
  {"role": "tool", "tool_call_id": "c", "content": "paid"},
  {"role": "assistant", "content": "Bought."},
]  # fmt: skip


# -- the layout ----------------------------------------------------------------------------------


def test_a_qwen_template_gives_the_layout_qwen_models_were_trained_on(qwen):
  _, layout = qwen
  written = layout.render_call("view", {}) + layout.render_results(["empty"])
  assert written == ('\n<tool_call>\n{"name": "view", "arguments": {}}\n</tool_call><|im_end|>\n'
                     "<|im_start|>user\n<tool_response>\nempty\n</tool_response><|im_end|>\n"
                     "<|im_start|>assistant\n")  # fmt: skip
  assert layout.turn_end == "<|im_end|>" and layout.stops() == ("<|im_end|>", "<tool_response>")
  two = layout.render_results(["a", "b"])
  assert two.count("<|im_start|>user") == 1 and layout.observations(two) == ["a", "b"]
  assert HERMES.stops() == ("</tool_call>", "<tool_response>")


def test_a_template_that_writes_calls_another_way_is_refused_in_one_line():
  from hindsight.text.chat_template import ChatTemplate

  plain = ChatTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
  with pytest.raises(HindsightError, match="does not write tool calls as"):
    layout_from_template(plain, "plain")


def test_a_messages_trace_reads_as_the_template_renders_the_conversation(qwen):
  template, layout = qwen
  trace, head = from_messages(TextTrace(messages=MESSAGES, id="m"), "f: trace m", layout, template)
  assert head == MESSAGES[:2]
  # The template's own rendering, with arguments as objects (what transformers documents: a
  # JSON string would be quoted again by its `tojson`).
  as_objects = copy.deepcopy(MESSAGES)
  for m in as_objects:
    for c in m.get("tool_calls") or []:
      c["function"]["arguments"] = json.loads(c["function"]["arguments"])
  rendered = template.render(as_objects, add_generation_prompt=False)
  assert trace.prompt + trace.completion() + "<|im_end|>\n" == rendered  # byte for byte
  view = agent_view(trace, "t", layout=layout)
  # One agent step per assistant turn; the first's two parallel calls in their order.
  assert [[c.name for c in calls] for calls in view.calls] == [["add", "view"], ["checkout"], []]
  assert view.observations[:2] == [(f"added {ITEM}", ITEM), ("paid",)]
  assert view.trace.steps[0].tool_call == {"parallel": [
    {"name": "add", "arguments": {"item": ITEM}}, {"name": "view", "arguments": {}}]}  # fmt: skip
  # A trace that offers tools: the template writes them into its prompt, as it would for the
  # model (Qwen2.5's: in the system message).
  schema = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
  offered, _ = from_messages(TextTrace(messages=MESSAGES, tools=schema), "t", layout, template)
  assert offered.prompt + offered.completion() + "<|im_end|>\n" == template.render(
    as_objects, add_generation_prompt=False, tools=schema)  # fmt: skip
  assert '"name": "add"' in offered.prompt and offered.prompt != trace.prompt


@pytest.mark.parametrize(
  ("change", "message"),
  [
    (lambda m: m.pop(3), "1 tool results for 2 calls"),
    (lambda m: m.insert(5, {"role": "user", "content": "hurry"}), "a user message after"),
    (lambda m: m[3].update(tool_call_id="z"), "the tool results answer"),
    (lambda m: m.pop(6), "an assistant turn before the results"),
    (lambda m: m.__delitem__(slice(6, None)), "makes calls and no `tool` message"),
    (lambda m: m.insert(7, {"role": "assistant", "content": "More."}), "right after one that"),
    (lambda m: m[2]["tool_calls"].__setitem__(0, {"function": {"name": 3}}), "not a call"),
  ],
)
def test_chat_logs_that_break_the_format_are_named(change, message):
  messages = copy.deepcopy(MESSAGES)
  change(messages)
  with pytest.raises(HindsightError, match=message):
    from_messages(TextTrace(messages=messages), "f: trace m")


def test_a_results_order_follows_its_calls_ids():
  messages = copy.deepcopy(MESSAGES)
  messages[3], messages[4] = messages[4], messages[3]
  trace, _ = from_messages(TextTrace(messages=messages), "t")
  assert agent_view(trace, "t").observations[0] == (f"added {ITEM}", ITEM)


def test_one_agent_step_is_one_turn_from_steps_and_from_text_alike():
  """A thought, its call and the call's result are one agent step (the turn) whether the
  trace gives them as steps or as one text; `chunks` keeps the old cut."""
  steps = [TextStep("I need the dessert. "), TextStep("Adding it. "),
           TextStep(HERMES.render_call("add", {"item": ITEM})),
           TextStep(HERMES.render_results([f"added {ITEM}"]), role="tool"),
           TextStep("Done now. Bye.")]  # fmt: skip
  by_steps = agent_view(TextTrace(prompt="p", steps=steps), "t")
  by_text = agent_view(TextTrace(prompt="p", text="".join(s.text for s in steps)), "t")
  assert [s.text for s in by_steps.trace.steps] == [s.text for s in by_text.trace.steps]
  assert len(by_steps.trace.steps) == 2 and [len(c) for c in by_steps.calls] == [1, 0]
  # The turn's record is its call's (the thought before it merged in), as the tags read it.
  for view in (by_steps, by_text):
    assert view.trace.steps[0].tool_call == {"name": "add", "arguments": {"item": ITEM}}
    assert view.trace.steps[1].tool_call is None
  chunks = agent_view(TextTrace(prompt="p", steps=steps), "t", unit="chunks")
  assert len(chunks.trace.steps) == 4


def test_a_tool_calls_list_must_be_the_calls_the_text_holds():
  text = HERMES.render_call("add", {"item": ITEM}) + HERMES.render_call("view", {})
  results = TextStep(HERMES.render_results([f"added {ITEM}", ITEM]), role="tool")
  ok = [TextStep(text, tool_calls=[_call("a", "add", item=ITEM), _call("b", "view")]), results]
  assert len(agent_view(TextTrace(prompt="p", steps=ok), "t").calls[0]) == 2
  swapped = [TextStep(text, tool_calls=[_call("b", "view"), _call("a", "add", item=ITEM)]), results]
  with pytest.raises(HindsightError, match="give view"):
    agent_view(TextTrace(prompt="p", steps=swapped), "t")
  with pytest.raises(HindsightError, match="1 results for the 2 calls"):
    agent_view(TextTrace(prompt="p", steps=[ok[0], TextStep(HERMES.render_results(["x"]),
                                                            role="tool")]), "t")  # fmt: skip


def test_to_messages_reads_a_prefix_back_as_the_chat_it_was(qwen):
  template, layout = qwen
  trace, head = from_messages(TextTrace(messages=MESSAGES), "t", layout, template)
  written = "".join(s.text for s in trace.steps[:4])  # both calling turns and their results
  back = to_messages(head, written, layout)
  assert [m["role"] for m in back] == ["system", "user", "assistant", "tool", "tool",
                                       "assistant", "tool"]  # fmt: skip
  assert back[2]["content"] == "Adding it and looking."
  assert [c["function"]["name"] for c in back[2]["tool_calls"]] == ["add", "view"]
  assert [m["tool_call_id"] for m in back[3:5]] == [c["id"] for c in back[2]["tool_calls"]]
  assert back[4]["content"] == ITEM and back[5]["content"] == ""
  # Every call has its own id across the turns: a result answers exactly one call.
  ids = [c["id"] for m in back for c in m.get("tool_calls") or []]
  assert len(ids) == len(set(ids)) == 3
  assert back[6]["tool_call_id"] == back[5]["tool_calls"][0]["id"]
  cut = to_messages(head, written + "Bought", layout)  # a turn cut short: continued
  assert cut[-1] == {"role": "assistant", "content": "Bought"}


# -- resampling ------------------------------------------------------------------------------------


def _fake_completions(turns: list[str], seen: list):
  """A /v1/completions endpoint whose k-th turn (k = result blocks so far) is turns[k]
  (ignoring stop sequences: the labeler cuts the text itself); every body it gets is kept
  in `seen`."""
  from starlette.applications import Starlette
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  async def completions(request):
    body = await request.json()
    seen.append(body)
    k = min(body["prompt"].count("</tool_response><|im_end|>"), len(turns) - 1)
    choices = [{"index": j, "text": turns[k], "finish_reason": "stop"} for j in range(body["n"])]
    return JSONResponse({"choices": choices})

  return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def _labeler(path, url, cache, **kw) -> AgentLabeler:
  options = TextOptions(endpoint=url, model="m", verifier="env",
                        tools="tests.test_agent_layouts:Cart", **kw)  # fmt: skip
  labeler = AgentLabeler(f"text:{path}", 1, LabelConfig(num_rollouts=2), options)
  labeler.open(str(cache))
  return labeler


def test_a_qwen_style_trace_is_labeled_in_its_own_layout_with_parallel_calls(tmp_path, qwen):
  """A chat log labeled with the model's template: every continuation shows the model its
  results in the template's layout, a turn's two calls run in order on the continuation's
  own fork, and the turn ends at the template's end of turn, not at the first call."""
  _, layout = qwen
  path = tmp_path / "cart.jsonl"
  write_traces(str(path), [TextTrace(messages=MESSAGES, id="cart0")])
  turns = ['Again.\n<tool_call>\n{"name": "add", "arguments": {"item": "Crème brûlée"}}\n'
           '</tool_call>\n<tool_call>\n{"name": "view", "arguments": {}}\n</tool_call>'
           "<|im_end|>and what the model never wrote",
           '<tool_call>\n{"name": "checkout", "arguments": {}}\n</tool_call>',
           "Bought."]  # fmt: skip
  seen: list = []
  with running_app(_fake_completions(turns, seen)) as url:
    labeler = _labeler(path, url, tmp_path / "c.sqlite", chat_template=QWEN)
    (row,) = labeler.label(0, 1, seed=0)
  assert len(row["step_text"]) == 3 and row["tool_calls"] > 0
  assert all(b["stop"] == ["<|im_end|>", "<tool_response>"] for b in seen)
  later = [b["prompt"] for b in seen if b["prompt"].count("<tool_response>") > 2]
  assert later and all(layout.render_results([f"added {ITEM}", ITEM]) in p for p in later)
  assert "never wrote" not in "".join(b["prompt"] for b in seen)
  # The trace's own calls once, then each continuation's in order: add before view.
  log = labeler.env.log
  assert log[:3] == ["add", "view", "checkout"]
  assert all(log[i + 1] == "view" for i in range(3, len(log) - 1) if log[i] == "add")
  # Every continuation from the first turn buys the dessert; the credit sees it.
  assert row["credit"].shape == (3,) and float(row["return"]) == 1.0


def _fake_chat(seen: list):
  """A /v1/chat/completions endpoint that answers with structured tool calls: add the
  dessert, then check out, then a last word (by the tool messages it was sent)."""
  from starlette.applications import Starlette
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  async def chat(request):
    body = await request.json()
    seen.append(body)
    tools = sum(m["role"] == "tool" for m in body["messages"])
    if tools == 0:  # two parallel calls in one message
      message = {"role": "assistant", "content": "Adding.",
                 "tool_calls": [_call("x", "add", item=ITEM), _call("w", "view")]}  # fmt: skip
    elif tools < 3:
      message = {"role": "assistant", "content": None, "tool_calls": [_call("y", "checkout")]}
    else:
      message = {"role": "assistant", "content": "Bought."}
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    choices = [{"index": j, "message": message, "finish_reason": finish}
               for j in range(body["n"])]  # fmt: skip
    return JSONResponse({"choices": choices, "usage": {"completion_tokens": 5 * body["n"]}})

  return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def test_the_chat_route_sends_messages_and_executes_structured_tool_calls(tmp_path):
  path = tmp_path / "cart.jsonl"
  schema = {"type": "function", "function": {"name": "add"}}
  write_traces(str(path), [TextTrace(messages=MESSAGES, id="cart0", tools=[schema])])
  seen: list = []
  with running_app(_fake_chat(seen)) as url:
    labeler = _labeler(path, url, tmp_path / "c.sqlite", api="chat")
    (row,) = labeler.label(0, 1, seed=0)
  assert seen and all("stop" not in b and b["tools"][0]["function"]["name"] == "add" for b in seen)
  for body in seen:
    roles = [m["role"] for m in body["messages"]]
    assert roles[:2] == ["system", "user"]
    for i, m in enumerate(body["messages"]):
      if m["role"] == "tool":  # each result answers a call of the assistant message before it
        calls = next(x for x in reversed(body["messages"][:i]) if x["role"] == "assistant")
        assert m["tool_call_id"] in [c["id"] for c in calls["tool_calls"]]
  assert labeler.env.log.count("checkout") > 1  # continuations' structured calls ran
  # A message's parallel calls all run, in order, though the inline layout has no end of turn.
  log = labeler.env.log
  assert log[:3] == ["add", "view", "checkout"] and log.count("add") > 1
  assert all(log[i + 1 : i + 2] == ["view"] for i in range(3, len(log)) if log[i] == "add")
  sent = [m for b in seen for m in b["messages"] if m.get("content") == "Adding."]
  assert sent and all(len(m["tool_calls"]) == 2 for m in sent)  # the answer's calls sent back
  # The chat route's token cap is its own field (OpenAI's: max_tokens is deprecated there).
  assert all("max_completion_tokens" in b and "max_tokens" not in b for b in seen)
  assert float(row["return"]) == 1.0 and len(row["step_text"]) == 3


class ClockCart(Cart):
  """A cart whose view() reads a clock (a counter across every call): nondeterminism the
  trace never exercises (it makes no view() call)."""

  ticks = 0

  def step(self, state, call: ToolCall):
    if call.name == "view":
      ClockCart.ticks += 1
      return state, f"at tick {ClockCart.ticks}", False
    return super().step(state, call)


def test_the_self_check_catches_a_tool_the_trace_never_called(tmp_path):
  """Without --tool-check a clock behind view() passes (the trace never calls it: its own
  replay cannot see it); with it the first continuation that views is run again on a fresh
  fork and refused in one line."""
  messages = [m for m in MESSAGES if m.get("tool_call_id") != "b"]
  messages[2] = {**messages[2], "tool_calls": [_call("a", "add", item=ITEM)]}
  path = tmp_path / "cart.jsonl"
  write_traces(str(path), [TextTrace(messages=messages, id="cart0")])
  turns = [QWEN_CALL.format("view"), QWEN_CALL.format("checkout"), "Bought."]
  with running_app(_fake_completions(turns, [])) as url:
    for check, cache in ((0, "a"), (2, "b")):
      env = "tests.test_agent_layouts:ClockCart"
      options = TextOptions(endpoint=url, model="m", verifier="env", chat_template=QWEN,
                            tools=env, tool_check=check)  # fmt: skip
      labeler = AgentLabeler(f"text:{path}", 1, LabelConfig(num_rollouts=2), options)
      labeler.open(str(tmp_path / f"{cache}.sqlite"))
      if not check:
        (row,) = labeler.label(0, 1, seed=0)
        assert row["tool_calls"] > 0
        continue
      with pytest.raises(HindsightError, match=r"call 1 \(view\(\{\}\)\) run again.*a clock"):
        labeler.label(0, 1, seed=0)


def test_every_route_reads_an_agent_trace_as_its_labels_cut_it(qwen):
  """score, /v1/credit and /get_reward read a trace through the labels' own options: one
  step per turn, results found in the template's layout, from steps and from text alike."""
  from types import SimpleNamespace

  from hindsight.text.episodes import parse_text_episode

  template, layout = qwen
  trace, _ = from_messages(TextTrace(messages=MESSAGES), "t", layout, template)
  view = agent_view(trace, "t", layout=layout)
  options = json.dumps({"agent_steps": "turn", "tool_layout": layout.to_json()})
  spec = SimpleNamespace(label_options=options,
                         encoder=SimpleNamespace(check_steps=lambda *a: None))  # fmt: skip
  as_steps = {"prompt": trace.prompt, "outcome": 1.0,
              "steps": [msgspec_builtins(s) for s in trace.steps]}  # fmt: skip
  as_text = {"prompt": trace.prompt, "outcome": 1.0, "text": trace.completion()}
  for episode in (as_steps, as_text):
    parsed = parse_text_episode(episode, spec, "t")
    assert list(parsed.step_text) == [s.text for s in view.trace.steps]
    assert list(parsed.tags) == ["tool_call", "tool_call", "step"]


def msgspec_builtins(step: TextStep) -> dict:
  import msgspec

  return msgspec.to_builtins(step)


def test_a_step_too_long_for_the_model_is_named_by_its_entry_too():
  """The step encoder's refusal names the merged agent step and the `steps` entry it
  begins at (a thought and its call are one step: the entries run ahead)."""
  from types import SimpleNamespace

  import numpy as np

  from hindsight.model.encoders.text import TextEncoder
  from hindsight.text.episodes import parse_text_episode

  tokens = SimpleNamespace(encode_batch=lambda texts: [np.zeros(len(t)) for t in texts])
  check = TextEncoder.check_steps.__get__(SimpleNamespace(tokens=tokens, max_step_tokens=200))
  spec = SimpleNamespace(label_options=json.dumps({"agent_steps": "turn"}),
                         encoder=SimpleNamespace(check_steps=check))  # fmt: skip
  last = "A last word that goes on and on, well past what the model reads in one step. " * 4
  steps = [{"text": "Short. "}, {"text": HERMES.render_call("add", {"item": ITEM})},
           {"text": HERMES.render_results(["ok"]), "role": "tool"}, {"text": last}]  # fmt: skip
  with pytest.raises(HindsightError, match=r"step 1 \(entry 3 of 'steps'\) is \d+ tokens"):
    parse_text_episode({"prompt": "p", "outcome": 1.0, "steps": steps}, spec, "t")


class LongCart(Cart):
  """A cart whose view() writes a page of text, cut by the environment's max_result_chars."""

  max_result_chars = 40

  def step(self, state, call: ToolCall):
    if call.name == "view":
      return state, "Crème brûlée, " * 20, False
    return super().step(state, call)


def test_an_environment_cuts_its_long_results_everywhere_it_runs():
  from hindsight.agentic.tools import Branches, cut_result, execute

  env = LongCart()
  _, seen, done = execute(env, env.reset(None, 0), ToolCall("view", {}))
  assert seen == ("Crème brûlée, " * 20)[:40] + " [... 240 more characters]" and not done
  assert cut_result("short", 40) == "short" and cut_result("x" * 41, None) == "x" * 41
  # A recorded trace holds the result cut: its replay checks it against the cut result.
  text = HERMES.render_call("view", {})
  steps = [TextStep(text), TextStep(HERMES.render_results([seen]), role="tool")]
  view = agent_view(TextTrace(prompt="p", steps=steps), "t")
  Branches(env, view.trace, 0, view.calls, view.observations, "t")  # no mismatch
  steps[1] = TextStep(HERMES.render_results(["Crème brûlée, " * 20]), role="tool")
  uncut = agent_view(TextTrace(prompt="p", steps=steps), "t")
  with pytest.raises(HindsightError, match="the environment answers"):
    Branches(env, uncut.trace, 0, uncut.calls, uncut.observations, "t")


class StartedCart(Cart):
  """A cart that starts from the trace's recorded state (`trace.metadata`)."""

  def reset(self, trace, seed):
    return {"cart": list(trace.metadata["cart"]), "paid": False}


def test_a_traces_metadata_reaches_the_environments_reset(tmp_path):
  messages = [m for m in MESSAGES if m.get("tool_call_id") != "a"]
  messages[2] = {**messages[2], "tool_calls": [_call("b", "view")]}
  trace, _ = from_messages(TextTrace(messages=messages, metadata={"cart": [ITEM]}), "t")
  view = agent_view(trace, "t")
  from hindsight.agentic.tools import Branches

  branches = Branches(StartedCart(), trace, 0, view.calls, view.observations, "t")
  assert branches.at(1)["cart"] == [ITEM] and branches.final["paid"]


# -- turns, the chat route, the self-check: what a broken implementation would still pass ----------

NOWHERE = "http://127.0.0.1:9/v1"  # never asked


def test_a_call_that_ends_the_episode_is_its_turns_last(tmp_path, qwen):
  """A turn of three calls whose second ends the episode (checkout): the call after it is cut
  from the turn's text and never run; the results block holds the two that ran."""
  from hindsight.agentic.labeler import _Live
  from hindsight.text.client import Completion
  from hindsight.text.labeler import Ask

  _, layout = qwen
  path = tmp_path / "cart.jsonl"
  write_traces(str(path), [TextTrace(messages=MESSAGES, id="cart0")])
  labeler = _labeler(path, NOWHERE, tmp_path / "c.sqlite", chat_template=QWEN)
  ran = "Paying. " + layout.render_call("add", {"item": ITEM}) + layout.render_call("checkout", {})
  live = _Live(Ask("p", 0, 0, 1, "t", 0, 0), 0, {"cart": [], "paid": False})
  labeler._take(live, Completion(ran + layout.render_call("add", {"item": "tea"}), "stop", 9))
  assert labeler.env.log == ["add", "checkout"]  # the call after checkout never reached it
  assert live.text == ran + layout.render_results([f"added {ITEM}", "paid"])
  assert (live.done, live.calls, live.turns) == (True, 2, 1)
  assert live.state == {"cart": [ITEM], "paid": True}


def test_a_turn_ends_at_its_end_of_turn_and_a_cut_call_is_no_call(qwen):
  _, layout = qwen
  call = layout.render_call("view", {})
  # Text past the end-of-turn marker is never the model's turn (a server that kept the stop).
  assert layout.end_turn("Bought.<|im_end|>\n<|im_start|>user\nmore", "stop") == ("Bought.", False)
  assert layout.end_turn("Looking." + call + "<|im_end|>junk", "stop") == ("Looking." + call, True)
  # A call cut by the token cap is no call; one left open at a stop is closed (malformed).
  open_call = "Looking." + call[: -len(layout.call_suffix)]
  assert layout.end_turn(open_call, "length") == ("Looking.\n", False)
  assert layout.end_turn(open_call, "stop") == ("Looking." + call, True)
  # Spacing a layout writes after its call's close tag is the call's, not the next turn's.
  spaced = ToolLayout(call_suffix="</tool_call>\n", turn_end="<|eot_id|>", name="spaced")
  made = spaced.render_call("view", {})
  assert made.endswith("</tool_call>\n") and spaced.end_turn(made, "stop") == (made, True)


def test_chunks_keep_a_turns_parallel_calls_in_one_step():
  two = HERMES.render_call("add", {"item": ITEM}) + HERMES.render_call("view", {})
  results = HERMES.render_results([f"added {ITEM}", ITEM])
  steps = agent_steps("Both at once. " + two + results + "Done.", "sentences", unit="chunks")
  assert [(s.text, s.role) for s in steps] == [("Both at once. ", None), (two, None),
                                               (results, "tool"), ("Done.", None)]  # fmt: skip
  view = agent_view(TextTrace(prompt="p", steps=steps), "t", unit="chunks")
  assert [[c.name for c in calls] for calls in view.calls] == [[], ["add", "view"], []]


def test_a_messages_prompt_without_a_template_joins_its_contents():
  """Without a chat template the prompt is the prompt messages' contents, a blank line
  between messages, a message's text parts one per line (its other parts dropped)."""
  parts = [{"type": "text", "text": "Buy it."}, {"type": "image_url", "image_url": {"url": "x"}},
           {"type": "text", "text": "Quickly."}]  # fmt: skip
  messages = [MESSAGES[0], {"role": "user", "content": parts}, MESSAGES[-1]]
  trace, head = from_messages(TextTrace(messages=messages), "t")
  assert trace.prompt == "You shop.\n\nBuy it.\nQuickly." and head == messages[:2]
  assert [s.text for s in trace.steps] == ["Bought."]


def test_the_chat_route_continues_a_turn_cut_short_and_asks_for_one_after_results(qwen):
  """A draw that ends inside an assistant turn asks the server to continue that message; one
  that ends after a results block (or at the prompt) asks for a new turn. The prompt
  messages are the trace's own, and a text that is not the trace's is refused."""
  from hindsight.text.client import ChatRoute, Draw

  template, layout = qwen
  schema = [{"type": "function", "function": {"name": "add"}}]
  trace, head = from_messages(TextTrace(messages=MESSAGES, tools=schema), "t", layout, template)
  route = ChatRoute([head], [trace], layout)

  def body(written: str) -> dict:
    return route.body(Draw(trace.prompt + written, 0, 0, 1, None, "d", 0))

  turns = "".join(s.text for s in trace.steps[:4])  # both calling turns and their results
  for written, last in (("", "user"), (trace.steps[0].text + trace.steps[1].text, "tool"),
                        (turns, "tool")):  # fmt: skip
    b = body(written)
    assert b["messages"][-1]["role"] == last and b["tools"] == schema
    assert "continue_final_message" not in b and "add_generation_prompt" not in b
    assert b["messages"][:2] == MESSAGES[:2]
  for written, content in (("Adding", "Adding"), (turns + "Bou", "Bou")):
    b = body(written)
    assert b["messages"][-1] == {"role": "assistant", "content": content}
    assert b["continue_final_message"] is True and b["add_generation_prompt"] is False
  with pytest.raises(HindsightError, match="does not start with its trace's prompt"):
    route.body(Draw("Another prompt." + turns, 0, 0, 1, None, "d", 0))


def test_a_chat_answers_call_with_arguments_that_do_not_parse_is_a_malformed_call(qwen):
  """An answer's `tool_calls` as the agent's text in the layout: arguments that are not JSON
  are written as they came, so the agent reads the parse error, not a call it never made."""
  from hindsight.text.client import ChatRoute
  from hindsight.text.tool_syntax import Malformed

  _, layout = qwen
  route = ChatRoute([], [], layout)
  good = {
    "content": "Adding.",
    "tool_calls": [_call("a", "add", item=ITEM), {"function": {"name": "view", "arguments": {}}}],
  }
  text = route.text_of(good)
  assert text == "Adding." + layout.render_call("add", {"item": ITEM}) + layout.render_call(
    "view", {})  # fmt: skip
  bad = {"content": None, "tool_calls": [{"function": {"name": "add", "arguments": "{item"}}]}
  (call,) = layout.trailing_calls(route.text_of(bad))
  assert isinstance(call, Malformed) and "not JSON" in call.reason


def _both_routes(seen: dict):
  """/v1/completions and /v1/chat/completions answering "Bought." (no call), each request
  counted by its route."""
  from starlette.applications import Starlette
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  async def answer(request):
    body = await request.json()
    chat = request.url.path.endswith("/chat/completions")
    seen["chat" if chat else "completions"] += 1
    one = {"message": {"role": "assistant", "content": "Bought."}} if chat else {"text": "Bought."}
    choices = [{"index": j, "finish_reason": "stop", **one} for j in range(body["n"])]
    return JSONResponse({"choices": choices})

  return Starlette(routes=[Route("/v1/completions", answer, methods=["POST"]),
                           Route("/v1/chat/completions", answer, methods=["POST"])])  # fmt: skip


def test_the_chat_routes_answers_are_cached_apart_from_the_completions(tmp_path):
  """The same text continued through /v1/chat/completions is another sample than its
  completion: a chat job on a completions job's cache (the same sampling) asks its server."""
  path = tmp_path / "cart.jsonl"
  write_traces(str(path), [TextTrace(messages=MESSAGES, id="cart0")])
  seen = {"chat": 0, "completions": 0}
  with running_app(_both_routes(seen)) as url:
    for api in ("completions", "chat"):
      labeler = _labeler(path, url, tmp_path / "c.sqlite", api=api, stop=HERMES.stops())
      labeler.label(0, 1, seed=0)
      assert seen[api] > 0, api
    asked = dict(seen)
    _labeler(path, url, tmp_path / "c.sqlite", api="chat", stop=HERMES.stops()).label(0, 1, 0)
    assert seen == asked  # and the chat route's own answers are cached


def test_the_self_check_reruns_as_many_continuations_as_asked_each_on_its_steps_fork(tmp_path):
  """--tool-check N reruns the calls of the first N continuations that made calls; a
  deterministic environment passes however many, each rerun from the state before the
  continuation's own step (the cart holds the dessert after the trace's first turn)."""
  messages = [m for m in MESSAGES if m.get("tool_call_id") != "b"]
  messages[2] = {**messages[2], "tool_calls": [_call("a", "add", item=ITEM)]}
  path = tmp_path / "cart.jsonl"
  write_traces(str(path), [TextTrace(messages=messages, id="cart0")])
  # By the results so far: a view from steps 0 and 1 (the cart empty, then holding the dessert),
  # a checkout (refused from step 2: the trace paid), then a last word.
  turns = [
    QWEN_CALL.format("view"),
    QWEN_CALL.format("view"),
    QWEN_CALL.format("checkout"),
    "Bought.",
  ]
  counts = {}
  with running_app(_fake_completions(turns, [])) as url:
    for check in (1, 100):
      labeler = _labeler(path, url, tmp_path / f"{check}.sqlite", chat_template=QWEN,
                         tool_check=check)  # fmt: skip
      (row,) = labeler.label(0, 1, seed=0)
      counts[check] = row["tool_checked"]  # what the dataset's tool_checked sums
  assert counts == {1: 1, 100: 6}  # K = 2 continuations from each of the 3 steps make calls


def test_a_replay_that_differs_names_which_of_a_turns_calls_it_was():
  messages = copy.deepcopy(MESSAGES)
  messages[4]["content"] = "empty"  # the view after the add: the cart holds the dessert
  trace, _ = from_messages(TextTrace(messages=messages), "t")
  view = agent_view(trace, "t")
  from hindsight.agentic.tools import Branches

  said = f"t, step 0 (call 2 of 2): the environment answers '{ITEM}' where the trace holds 'empty'"
  with pytest.raises(HindsightError, match=re.escape(said)):
    Branches(Cart(), trace, 0, view.calls, view.observations, "t")


def test_continuations_cut_at_max_turns_are_counted_apart(tmp_path):
  """A turn budget that ends continuations before the model or the environment does is
  counted per trace (the dataset's turn_ends), as the context's ends are."""
  path = tmp_path / "cart.jsonl"
  write_traces(str(path), [TextTrace(messages=MESSAGES, id="cart0")])
  turns = [
    QWEN_CALL.format("view"),
    QWEN_CALL.format("view"),
    QWEN_CALL.format("checkout"),
    "Bought.",
  ]
  rows = {}
  with running_app(_fake_completions(turns, [])) as url:
    for most in (1, 32):
      labeler = _labeler(path, url, tmp_path / f"{most}.sqlite", chat_template=QWEN,
                         max_turns=most)  # fmt: skip
      (rows[most],) = labeler.label(0, 1, seed=0)
  # Every continuation of steps 0 and 1 views first: at one turn, each is cut there.
  assert rows[1]["turn_ends"] >= 4 and rows[32]["turn_ends"] == 0


def test_a_step_of_an_unknown_role_is_refused_naming_it():
  steps = [TextStep(HERMES.render_call("view", {})),
           TextStep(HERMES.render_results(["x"]), role="tools")]  # fmt: skip
  with pytest.raises(HindsightError, match="role 'tools': an agent trace's step is the agent"):
    agent_view(TextTrace(prompt="p", steps=steps), "t")
  bad = [TextStep(HERMES.render_call("view", {})), TextStep("<tool_response>x", role="tool")]
  with pytest.raises(HindsightError, match="it holds '<tool_response>x'"):
    agent_view(TextTrace(prompt="p", steps=bad), "t")


def test_an_interrupted_workers_keyboard_interrupt_is_not_logged_again():
  """Ctrl-C lands in a worker task: the job says it in one line, and the task's exception is
  not printed again as 'Task exception was never retrieved'."""
  from hindsight.text.client import _quiet_on_interrupt

  seen = []
  loop = type("Loop", (), {"default_exception_handler": lambda self, c: seen.append(c)})()
  _quiet_on_interrupt(loop, {"exception": KeyboardInterrupt()})
  assert seen == []
  other = {"exception": ValueError("boom")}
  _quiet_on_interrupt(loop, other)
  assert seen == [other]
