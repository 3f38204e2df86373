"""What a user who brings their own tool environment and traces to `hindsight label --env
text:FILE --tools ENV` meets: the agent labeler's refusals, traces recorded by another agent
framework (a malformed call's own error text, calls after the episode ended), a state that
cannot be copied, a model whose context is shorter than --max-tokens on every turn, an
endpoint given as a route, and the commands around labeling (`--episodes`, the resampled
reference of `hindsight eval` from another directory, `hindsight train`'s summary)."""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

from hindsight.agentic.labeler import AgentLabeler
from hindsight.data import open_labels
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig, LabelJob
from hindsight.labeling.job import run_label_job
from hindsight.serving.openai_protocol import running_app
from hindsight.text.client import CompletionCache, CompletionClient, Sampling
from hindsight.text.labeler import Ask
from hindsight.text.options import TextOptions
from hindsight.text.tool_syntax import Malformed, render_call, render_result
from hindsight.text.trace import TextStep, TextTrace, read_traces, write_traces
from hindsight.worlds import tool_world as tw
from hindsight.worlds.server import create_app
from tests.conftest import ROOT, assert_one_line_error, run_cli

NULL_TEXT = tw.RESTATE_TEXT + " "
NOWHERE = "http://127.0.0.1:9/v1"  # never asked: these labelers make no request


def _options(**kw) -> TextOptions:
  kw = {"endpoint": NOWHERE, "tools": "tool-world", "verifier": "env", "null_text": NULL_TEXT,
        **kw}  # fmt: skip
  return TextOptions(model=tw.MODEL_NAME, **kw)


def _labeler(path, episodes=1, replacement="policy", K=4, **kw) -> AgentLabeler:
  config = LabelConfig(num_rollouts=K, replacement=replacement)
  return AgentLabeler(f"text:{path}", episodes, config, _options(**kw))


def _words(text: str) -> int:
  """Tokens as the tool world's server counts them (and the context apps below)."""
  return len(text.split())


def _task():
  """A tool-world task's prompt and its box counts."""
  prompt = tw.prompt_traces(3, 1)[0].prompt
  return prompt, tw.parse_task(prompt).counts


def _own(tmp_path, *traces_steps) -> str:
  """A trace file of the task's prompt with each of `traces_steps` as a trace's steps."""
  prompt, _ = _task()
  path = tmp_path / "own.jsonl"
  write_traces(str(path), [TextTrace(prompt=prompt, steps=list(steps), id=f"mine{i}")
                           for i, steps in enumerate(traces_steps)])  # fmt: skip
  return str(path)


def _call(name: str, arguments: dict, result: str) -> list[TextStep]:
  return [TextStep(render_call(name, arguments)), TextStep(render_result(result), role="tool")]


# -- the labeler's refusals --------------------------------------------------------------------


@pytest.mark.parametrize(
  ("kw", "message"),
  [
    ({"replacement": "policy_other"},
     "replacement 'policy_other' is not available for agent traces (--tools): choose policy or "
     "null"),
    ({"replacement": "policy_no_repeat"}, "replacement 'policy_no_repeat' is not available"),
    ({"replacement": "null", "null_text": "Checking again. " + render_call("read", {})},
     "--null-text makes a call: under null the step's call is not made"),
    ({"tools": "tests.tool_envs:NoOutcome"},
     "--verifier env: the environment tests.tool_envs:NoOutcome has no outcome()"),
    # ToolEnv's own outcome() scores nothing: it is no outcome of the environment's.
    ({"tools": "tests.tool_envs:BaseOutcome"},
     "--verifier env: the environment tests.tool_envs:BaseOutcome has no outcome()"),
  ],
)  # fmt: skip
def test_the_agent_labelers_refusals_are_one_line(played, kw, message):
  with pytest.raises(HindsightError) as e:
    _labeler(played, **kw)
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
  # The same labeler with what each refusal asks for is built.
  fixed = {"replacement": "policy", "null_text": NULL_TEXT, "tools": "tool-world"}
  assert _labeler(played, **{k: fixed[k] for k in kw}).env is not None


@pytest.mark.parametrize("value", [float("nan"), 5, -0.25, float("inf"), None, "high"])
def test_an_environment_outcome_outside_0_1_is_refused(played, value):
  """Neither a continuation's outcome nor the trace's own may leave [0, 1]: NaN or 5 would
  be credit in the dataset."""
  labeler = _labeler(played, tools="tests.tool_envs:Scored")
  labeler.env.value = value
  (trace,) = labeler.with_steps(labeler.traces, range(1), 0)
  rolled = [SimpleNamespace(state=labeler.branches[0].at(2))]
  said = re.escape(f"--verifier env: the environment's outcome() is {value} on trace {trace.id}")
  with pytest.raises(HindsightError, match=said + r", step 2: outcomes must be in \[0, 1\]"):
    labeler.outcomes_of(trace, 2, rolled)
  with pytest.raises(HindsightError, match=said + r": outcomes must be in \[0, 1\]"):
    labeler.trace_outcome(trace, 0)


def test_an_environment_outcome_in_0_1_is_taken(played):
  labeler = _labeler(played, tools="tests.tool_envs:Scored")
  (trace,) = labeler.with_steps(labeler.traces, range(1), 0)
  state = labeler.branches[0].at(1)
  for value in (0, 0.25, 1, True, np.float32(0.5)):
    labeler.env.value = value
    (got,) = labeler.outcomes_of(trace, 1, [SimpleNamespace(state=state)])
    assert got == float(value) and labeler.trace_outcome(trace, 0) == float(value)


def test_tools_without_verifier_env_suggest_it_where_the_environment_scores(played, capsys):
  _labeler(played, verifier="boxed")
  (line,) = capsys.readouterr().err.splitlines()
  assert "--tools tool-world: the environment has outcome()" in line and "--verifier env" in line
  _labeler(played)  # --verifier env: nothing to suggest
  _labeler(played, verifier="boxed", tools="tests.tool_envs:NoOutcome")  # nothing to score with
  assert capsys.readouterr().err == ""


# -- traces another framework recorded ---------------------------------------------------------


@pytest.mark.parametrize(
  "tools",
  ["tool-world", "hindsight.worlds.tool_world:replayed", "hindsight.worlds.tool_world:snapshotted"],
)
def test_a_malformed_call_keeps_the_error_its_trace_recorded(tmp_path, tools):
  """The framework that recorded the trace worded its parse error its own way: any `error:
  ...` result is the malformed call's (the environment never sees the call), under every
  branching, and replaying the trace past it reaches the same state."""
  _, counts = _task()
  steps = [
    TextStep('Looking box 1 up. <tool_call>{"name": "lookup", "arguments": {box: 1}}</tool_call>'),
    TextStep(render_result("Error: could not parse tool call arguments as JSON"), role="tool"),
    *_call("lookup", {"box": 1}, f"box 1 holds {counts[0]} apples"),
  ]
  labeler = _labeler(_own(tmp_path, steps), tools=tools)
  labeler.with_steps(labeler.traces, range(1), 0)
  assert [type(c) for c in labeler.views[0].calls[0]] == [Malformed]  # the step's one call
  assert labeler.branches[0].at(1).calls == []  # the malformed call reached no tool
  assert labeler.branches[0].at(2).calls == ["lookup"]
  assert labeler.branches[0].final.calls == ["lookup"]


def test_a_replay_that_differs_names_who_answered(tmp_path):
  """A malformed call is answered by hindsight's parser, a well-formed one by the
  environment: the refusal blames the one that answered."""
  _, counts = _task()
  malformed = [TextStep('<tool_call>{"name": "lookup", "arguments": {box: 1}}</tool_call>'),
               TextStep(render_result(f"box 1 holds {counts[0]} apples"), role="tool")]  # fmt: skip
  labeler = _labeler(_own(tmp_path, malformed))
  with pytest.raises(HindsightError) as e:
    labeler.with_steps(labeler.traces, range(1), 0)
  said = str(e.value)
  assert "trace mine0, step 0: a malformed call (the call is not JSON" in said, said
  assert "which hindsight's parser answers (the environment never sees it)" in said, said
  assert "record a malformed call's result as `error: ...`" in said, said
  assert "the environment answers" not in said and "\n" not in said

  wrong = _call("lookup", {"box": 1}, f"box 1 holds {counts[0] + 1} apples")
  labeler = _labeler(_own(tmp_path, wrong))
  with pytest.raises(HindsightError) as e:
    labeler.with_steps(labeler.traces, range(1), 0)
  assert (f"trace mine0, step 0: the environment answers 'box 1 holds {counts[0]} apples' where "
          f"the trace holds 'box 1 holds {counts[0] + 1} apples'") in str(e.value)  # fmt: skip


@pytest.mark.parametrize("tools", ["tool-world", "hindsight.worlds.tool_world:replayed"])
def test_calls_after_the_episode_ended_are_labeled_with_one_note_per_trace(tmp_path, capsys,
                                                                           tools):  # fmt: skip
  _, counts = _task()
  after = [*_call("submit", {}, "submitted None"), *_call("read", {}, "the ledger is empty"),
           *_call("lookup", {"box": 2}, f"box 2 holds {counts[1]} apples")]  # fmt: skip
  labeler = _labeler(_own(tmp_path, after, after[2:] + after[:2]), episodes=2, tools=tools)
  labeler.with_steps(labeler.traces, range(2), 0)
  notes = capsys.readouterr().err.splitlines()
  # The first trace submits at step 0 and goes on; the second submits last (no note).
  assert notes == [
    f"hindsight: {labeler.path}: trace mine0, step 1: a call after the environment said the "
    "episode was done (at step 0): labeled as given, run on the state the episode ended in"
  ]
  assert labeler.branches[0].final.calls == ["submit", "read", "lookup"]
  assert labeler.branches[0].at(3).calls == ["submit", "read", "lookup"]  # replays: no note
  assert capsys.readouterr().err == ""


def test_a_state_that_cannot_be_copied_names_the_fix(played):
  labeler = _labeler(played, tools="tests.tool_envs:Locked")
  with pytest.raises(HindsightError) as e:
    labeler.with_steps(labeler.traces, range(1), 0)
  said = str(e.value)
  assert "the environment's state cannot be deep-copied under branching 'functional' (" in said
  assert said.endswith(": use branching 'replay' or 'snapshot', or keep the handle out of the "
                       "state") and "\n" not in said, said  # fmt: skip


# -- a model's context -------------------------------------------------------------------------


def _with_context(app, context: int, seen: list):
  """`app` as vLLM serves a model of `context` tokens (words, as the worlds count them): GET
  /v1/models reports its `max_model_len`, POST /tokenize counts a prompt's tokens, and a
  completions request whose prompt and max_tokens exceed the context (or that asks for no
  token) is refused with HTTP 400, as vLLM refuses it. `seen` gets (prompt tokens,
  max_tokens) of every completions request."""
  from starlette.responses import JSONResponse

  async def served(scope, receive, send):
    if scope["type"] != "http" or scope["path"] not in ("/v1/models", "/tokenize",
                                                        "/v1/completions"):  # fmt: skip
      return await app(scope, receive, send)
    if scope["path"] == "/v1/models":
      card = {"id": tw.MODEL_NAME, "object": "model", "max_model_len": context}
      return await JSONResponse({"object": "list", "data": [card]})(scope, receive, send)
    chunks, more = [], True
    while more:
      message = await receive()
      chunks.append(message.get("body", b""))
      more = message.get("more_body", False)
    body = b"".join(chunks)
    request = json.loads(body)
    tokens = _words(request["prompt"])
    if scope["path"] == "/tokenize":
      return await JSONResponse({"count": tokens, "max_model_len": context})(scope, receive, send)
    seen.append((tokens, request["max_tokens"]))
    if request["max_tokens"] < 1 or tokens + request["max_tokens"] > context:
      message = (f"This model's maximum context length is {context} tokens. However, you "
                 f"requested {tokens + request['max_tokens']} tokens")  # fmt: skip
      answer = JSONResponse({"object": "error", "message": message}, status_code=400)
      return await answer(scope, receive, send)
    sent = []

    async def replay():
      if not sent:
        sent.append(True)
        return {"type": "http.request", "body": body, "more_body": False}
      return await receive()

    await app(scope, replay, send)

  return served


def _turns_app(turns: list[str]):
  """A completions endpoint whose k-th turn (k: the results in the prompt) is turns[k], cut
  at max_tokens words as a server cuts it (finish_reason "length")."""
  from starlette.applications import Starlette
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  async def completions(request):
    body = await request.json()
    k = min(body["prompt"].count("<tool_response>"), len(turns) - 1)
    text, finish = turns[k], "stop"
    if _words(text) > body["max_tokens"]:
      text, finish = " ".join(text.split()[: body["max_tokens"]]), "length"
    choices = [{"index": j, "text": text, "finish_reason": finish} for j in range(body["n"])]
    return JSONResponse({"choices": choices, "usage": {"completion_tokens": _words(text)}})

  return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def test_later_turns_ask_for_what_the_context_leaves_and_end_where_it_is_full(tmp_path):
  """Turn 0 asks for what the prompt leaves, turn 1 for what the prompt, turn 0 and its
  result leave (both below --max-tokens 1024); turn 1's result fills the context, so the
  continuation ends there (finish_reason length) without a request a server would refuse."""
  prompt, counts = _task()
  turns = ["Reading the boxes. " + render_call("lookup", {"box": 1}),
           render_call("lookup", {"box": 2}), render_call("lookup", {"box": 3}),
           "Done."]  # fmt: skip
  before_1 = prompt + turns[0] + render_result(f"box 1 holds {counts[0]} apples")
  context = _words(before_1 + turns[1])  # turn 1 fits exactly; its result does not
  path = _own(tmp_path, [TextStep("Starting on the task now. ")])
  seen: list = []
  with running_app(_with_context(_turns_app(turns), context, seen)) as url:
    labeler = _labeler(path, endpoint=url)
    labeler.open(str(tmp_path / "c.sqlite"))
    labeler.check_context()
    labeler.with_steps(labeler.traces, range(1), 0)
    ((roll,),) = labeler.sample([Ask(prompt, 5, 0, 1, "trace mine0, step 0", 0, 0)])
  assert seen == [(_words(prompt), context - _words(prompt)),
                  (_words(before_1), _words(turns[1]))]  # fmt: skip
  assert (roll.turns, roll.tool_calls, roll.finish_reason) == (2, 2, "length")
  assert roll.state.calls == ["lookup", "lookup"]
  assert labeler.context_ends == {0: 1}  # counted apart: the dataset's context_ends
  assert _words(prompt + roll.text) > context  # the second result is in the text


def test_agent_labels_fit_a_model_context_shorter_than_max_tokens(tmp_path, played):
  """The scripted agent behind a vLLM-like context (refusing any request past it) that
  leaves each trace's last prefix 12 tokens: every request fits, later turns are capped
  below --max-tokens, some continuations end because the context is full, and every trace
  is labeled."""
  traces = read_traces(played)
  labeler = _labeler(played, episodes=len(traces))
  views = [labeler.with_steps([t], range(1), 0)[0] for t in traces]
  context = max(_words(v.prefix(len(v.steps) - 1)) for v in views) + 12
  seen: list = []
  with running_app(_with_context(create_app(tools=True), context, seen)) as url:
    labeler = _labeler(played, episodes=len(traces), K=8, endpoint=url)
    labeler.open(str(tmp_path / "c.sqlite"))
    caps, turn_caps = [], labeler._turn_caps

    def recording(prompts):
      got = turn_caps(prompts)
      caps.extend(got)
      return got

    labeler._turn_caps = recording
    labeler.check_context()
    rows = labeler.label(0, len(traces), 0)
  assert all(n + m <= context for n, m in seen)
  assert 0 in caps, caps  # a continuation whose context is full ends without a request
  assert any(c is not None and 0 < c < 1024 for c in caps), caps
  assert sum(m < 1024 for _, m in seen) > len(seen) // 2
  assert len(rows) == len(traces)
  for row in rows:
    assert np.isfinite(row["credit"]).all() and row["completions"] > 0
  # Each continuation that ended for a full context is counted in its trace's row, once.
  assert sum(int(row["context_ends"]) for row in rows) == caps.count(0)


def test_the_datasets_context_ends_sum_its_chunks(tmp_path, capsys):
  """A label job (one trace a chunk) behind a context that leaves the longer trace's last
  prefix 4 tokens: the dataset's metadata counts the continuations that ended because their
  text filled the context, every chunk's, as the job's notes count them as it goes."""
  traces = [tw.sample_traces(1, 4)[i] for i in (0, 3)]  # the two longest
  path = tmp_path / "long.jsonl"
  write_traces(str(path), traces)
  labeler = _labeler(path, episodes=2)
  views = [labeler.with_steps([t], range(1), 0)[0] for t in traces]
  context = max(_words(v.prefix(len(v.steps) - 1)) for v in views) + 4
  with running_app(_with_context(create_app(tools=True), context, [])) as url:
    job = LabelJob(f"text:{path}", 2, LabelConfig(num_rollouts=8), chunk_size=1,
                   options=_options(endpoint=url))  # fmt: skip
    labels = open_labels(run_label_job(job, str(tmp_path / "labels"), progress=False))
  notes = re.findall(r"(\d+) continuations so far ended because their text .* filled the "
                     "model's context", capsys.readouterr().err)  # fmt: skip
  assert len(notes) == 2 and labels.metadata.context_ends == int(notes[1]) > int(notes[0]), notes


def test_check_context_refuses_a_prefix_that_fills_the_context_before_anything_is_spent(
  tmp_path, played
):
  traces = read_traces(played)
  labeler = _labeler(played, episodes=len(traces))
  views = [labeler.with_steps([t], range(1), 0)[0] for t in traces]
  lengths = [_words(v.prefix(len(v.steps) - 1)) for v in views]
  longest = int(np.argmax(lengths))
  name, T = views[longest].id, len(views[longest].steps)
  for context, replacement, fits in [(lengths[longest], "policy", False),
                                     (lengths[longest] + 1, "policy", True),
                                     (lengths[longest] + 1, "null", False)]:  # fmt: skip
    seen: list = []
    with running_app(_with_context(create_app(tools=True), context, seen)) as url:
      labeler = _labeler(played, episodes=len(traces), replacement=replacement, endpoint=url)
      labeler.open(str(tmp_path / f"{context}{replacement}.sqlite"))
      if fits:
        labeler.check_context()
      else:
        with pytest.raises(HindsightError) as e:
          labeler.check_context()
        assert f"trace {name}, step {T - 1}: the text before it is " in str(e.value)
        assert f"fills the model's context of {context}" in str(e.value)
    assert seen == []  # nothing requested


# -- the endpoint ------------------------------------------------------------------------------


@pytest.mark.parametrize(
  ("endpoint", "base"),
  [
    ("http://127.0.0.1:8000/v1/chat/completions", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/v1/completions/", "http://127.0.0.1:8000/v1"),
    ("https://api.example.com/openai/v1/chat/completions", "https://api.example.com/openai/v1"),
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1"),
  ],
)
def test_an_endpoint_that_is_no_base_url_is_refused_with_the_fix(tmp_path, endpoint, base):
  for build in (lambda: TextOptions(endpoint=endpoint, model="m"),
                lambda: CompletionClient(endpoint, "m", Sampling(),
                                         CompletionCache(str(tmp_path / "c.sqlite")))):  # fmt: skip
    with pytest.raises(HindsightError) as e:
      build()
    assert str(e.value).startswith(f"endpoint {endpoint}: give the server's base URL")
    assert f", --endpoint {base} (" in str(e.value) and "\n" not in str(e.value)
  for fine in ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/", "https://h.ai/api/v1"):
    TextOptions(endpoint=fine, model="m")


def test_the_label_command_names_the_endpoint_to_give(tmp_path, played):
  r = run_cli("label", "--env", f"text:{played}", "--episodes", "1", "--endpoint",
              "http://127.0.0.1:8000/v1/chat/completions", "--model", tw.MODEL_NAME, "--tools",
              "tool-world", "--verifier", "env", "--out", tmp_path / "o",
              "--no-progress")  # fmt: skip
  assert_one_line_error(r, "--endpoint http://127.0.0.1:8000/v1/chat/completions: give the "
                        "server's base URL, --endpoint http://127.0.0.1:8000/v1 (")  # fmt: skip
  assert not (tmp_path / "o").exists()


# -- around labeling ---------------------------------------------------------------------------


def test_label_takes_every_trace_of_the_file_and_records_it_absolute(tmp_path, tool_url, played):
  """Without --episodes a text job labels every trace in its file; the file is recorded
  absolute (given relative to the directory the command runs in); any other family still
  needs --episodes."""
  out = tmp_path / "labels"
  r = run_cli("label", "--env", f"text:{os.path.relpath(played, ROOT)}", "--rollouts", "2",
              "--endpoint", tool_url, "--model", tw.MODEL_NAME, "--tools", "tool-world",
              "--verifier", "env", "--out", out, "--no-progress")  # fmt: skip
  assert r.returncode == 0, r.stderr
  labels = open_labels(str(out))
  assert len(labels) == len(read_traces(played)) == labels.metadata.job_description["episodes"]
  assert labels.metadata.env == labels.metadata.job_description["env"] == f"text:{played}"
  r = run_cli("label", "--env", "key_corridor", "--out", tmp_path / "o", "--no-progress")
  assert_one_line_error(r, "--env key_corridor: give --episodes N")


@pytest.mark.parametrize("verifier", ["boxed", "env"])
def test_the_resampled_reference_finds_the_trace_file_from_another_directory(
  tmp_path, tool_url, monkeypatch, verifier
):
  """Labels made in a directory with the trace file given relative to it: `hindsight eval`'s
  resampled reference, run from elsewhere, finds the file above the labels, and each trace
  keeps its reference; where the file is not found, `--verifier env` does without it (the
  environment scores) and another verifier says where to run."""
  from hindsight.drift.config import DriftConfig
  from hindsight.drift.sets import Run
  from hindsight.text.evaluate import open_text, resampled_reference

  work = tmp_path / "project"
  work.mkdir()
  given = tw.sample_traces(5, 2)
  write_traces(str(work / "traces.jsonl"), given)
  monkeypatch.chdir(work)
  job = LabelJob("text:traces.jsonl", 2, LabelConfig(num_rollouts=2), chunk_size=2,
                 options=_options(endpoint=tool_url, verifier=verifier))  # fmt: skip
  labels_dir = os.path.abspath(run_label_job(job, "runs/labels", progress=False))
  labels = open_labels(labels_dir)
  examples, meta = [labels[i] for i in range(len(labels))], labels.metadata
  assert meta.job_description["env"] == "text:traces.jsonl"  # as the library was given it
  monkeypatch.chdir(tmp_path)  # elsewhere: traces.jsonl is not here

  # What `hindsight eval --run W --reference resample` evaluates (W's splits.json names the
  # labels by their absolute path).
  run = Run([str(tmp_path / "run")], {"labels": labels_dir}, labels,
            LabelConfig.from_metadata(meta), np.arange(len(labels)))  # fmt: skip
  cfg = DriftConfig(checkpoint=str(tmp_path / "run"), reference="resample",
                    reference_rollouts=2, endpoint=tool_url, progress=False)  # fmt: skip
  evaluation = open_text(cfg, run, None, str(tmp_path / "report"))
  main, _, spent = evaluation.sets()
  assert spent["completions"] > 0 and np.isfinite(main.reference["credit"]).any()
  (written,) = [os.path.join(d, "traces.jsonl") for d, _, files in os.walk(tmp_path / "report")
                if "traces.jsonl" in files]  # fmt: skip
  assert [t.reference for t in read_traces(written)] == [t.reference for t in given]

  # Without the labels' directory to search from, the file is not found.
  if verifier == "env":
    fields, _ = resampled_reference(examples, meta, str(tmp_path / "bare"), 2, tool_url, False)
    assert len(fields) == 2
    bare = read_traces(str(tmp_path / "bare" / "traces.jsonl"))
    assert [t.reference for t in bare] == [None, None]
  else:
    with pytest.raises(HindsightError) as e:
      resampled_reference(examples, meta, str(tmp_path / "bare"), 2, tool_url, False)
    said = str(e.value)
    assert said.startswith("traces.jsonl: the labels' trace file is not found (a relative path "
                           "is from the directory `hindsight label` ran in")  # fmt: skip
    assert "the verifier boxed checks each continuation against its trace's `reference`" in said


def test_the_training_summary_says_what_the_labels_reliability_is():
  from hindsight.evaluators.label_fit import summary_text

  report = {"env": "text:t.jsonl", "replacement": "policy", "episodes": {"test": 20},
            "steps": 160, "spearman": 0.4, "pearson": 0.4, "mae": 0.1, "constant_mae": 0.12,
            "spearman_mu": 0.4, "exact_zero_share": 0.1, "progress_spearman": 0.3,
            "z_rms": 1.0, "coverage_95": 0.95, "class_accuracy": 0.6, "per_tag": {}}  # fmt: skip
  for reliability, negative in ((0.88, False), (-1.234, True)):
    text = summary_text({**report, "label_reliability": reliability})
    (line,) = [s for s in text.splitlines() if "reliability" in s]
    assert f"reliability {reliability:.3f} (the share of the labels' variance that is credit, " \
           "not sampling noise" in line  # fmt: skip
    assert ("below 0: more noise than credit, label with more --rollouts" in line) == negative
