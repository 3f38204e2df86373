"""Agent traces: tool calls executed by an environment in every resample (`--tools`), the
three ways to branch its state, the multi-turn loop's stops, and the labels against the tool
world's exact credit (served on loopback)."""

from __future__ import annotations

import json
import os

import httpx
import numpy as np
import pytest

from hindsight.agentic.labeler import AgentLabeler
from hindsight.data import open_labels
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig, LabelJob
from hindsight.labeling.job import run_label_job
from hindsight.serving.openai_protocol import running_app
from hindsight.text.agent_trace import agent_steps, agent_view, unmerged
from hindsight.text.labeler import Ask
from hindsight.text.options import TextOptions
from hindsight.text.tool_syntax import pieces, render_call, render_result, result_of, trailing_call
from hindsight.text.trace import TextStep, TextTrace, read_traces, write_traces
from hindsight.worlds import tool_world as tw
from hindsight.worlds.exact import compare_to_exact
from hindsight.worlds.server import create_app
from tests.conftest import assert_one_line_error, run_cli
from tests.tool_envs import Recording

NULL_TEXT = tw.RESTATE_TEXT + " "


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
  """Prompt-only traces: the labeler samples each from the endpoint, tools executed."""
  path = tmp_path_factory.mktemp("tools") / "tasks.jsonl"
  write_traces(str(path), tw.prompt_traces(0, 8))
  return str(path)


def _options(url, **kw) -> TextOptions:
  kw.setdefault("tools", "tool-world")
  return TextOptions(endpoint=url, model=tw.MODEL_NAME, verifier="env", null_text=NULL_TEXT, **kw)


def _job(path, episodes, url, K, replacement="policy", **kw) -> LabelJob:
  return LabelJob(f"text:{path}", episodes, LabelConfig(num_rollouts=K, replacement=replacement),
                  chunk_size=4, options=_options(url, **kw))  # fmt: skip


def _served(url: str) -> int:
  return httpx.get(url.removesuffix("/v1") + "/stats").json()["completions"]


# -- the format -------------------------------------------------------------------------------


def test_agent_steps_tile_the_text_and_merge_each_result_into_its_call():
  trace = tw.sample_traces(2, 1)[0]
  text = "".join(s.text for s in trace.steps)
  cut = agent_steps(text, "sentences", unit="chunks")
  assert "".join(s.text for s in cut) == text
  assert [s.role for s in cut] == [s.role for s in trace.steps]
  view = agent_view(trace, "t", unit="chunks")
  agent = [s for s in trace.steps if s.role != "tool"]
  assert len(view.trace.steps) == len(agent) == len(view.calls)
  assert view.trace.completion() == text  # merging keeps the text, byte for byte
  for step, call, seen in zip(view.trace.steps, view.calls, view.observations, strict=True):
    assert (not call) == (seen is None) == (step.tool_call is None)
    if call:
      assert step.text.endswith(render_result(*seen)) and call[0].name == step.tool_call["name"]


def test_a_labeled_traces_steps_unmerge_to_the_trace():
  """What the resampled reference of `hindsight eval` writes back from a dataset's steps."""
  trace = tw.sample_traces(4, 1)[0]
  back = unmerged([s.text for s in agent_view(trace, "t", unit="chunks").trace.steps])
  assert [(s.text, s.role) for s in back] == [(s.text, s.role) for s in trace.steps]


def test_a_credit_model_reads_an_agent_trace_with_the_labels_steps():
  """`parse_text_episode` (score, serve) merges each result into its call, from steps and
  from inline text alike, as the labels do."""
  from types import SimpleNamespace

  from hindsight.text.episodes import parse_text_episode

  # What parse_text_episode reads of a text model's DataSpec: its labels' options, its encoder.
  spec = SimpleNamespace(label_options="", encoder=SimpleNamespace(check_steps=lambda *a: None))
  trace = tw.sample_traces(6, 1)[0]
  view = agent_view(trace, "t", unit="chunks")  # labels without a unit of their own: chunks
  as_steps = {"prompt": trace.prompt, "outcome": 1.0,
              "steps": [{"text": s.text, "role": s.role} for s in trace.steps]}  # fmt: skip
  as_text = {"prompt": trace.prompt, "outcome": 1.0, "text": trace.completion()}
  for episode in (as_steps, as_text):
    parsed = parse_text_episode(episode, spec, "t")
    assert list(parsed.step_text) == [s.text for s in view.trace.steps]
    assert list(parsed.tags) == ["tool_call" if c else "step" for c in view.calls]


@pytest.mark.parametrize(
  ("steps", "message"),
  [
    ([TextStep(render_result("x"), role="tool")], "follows no call"),
    ([TextStep(render_call("read", {}))], "no `tool` step after it"),
    ([TextStep("Hi " + render_call("read", {}) + " and on.")], "markup inside the step"),
    ([TextStep(render_call("read", {}), tool_call={"name": "write", "arguments": "{}"}),
      TextStep(render_result("x"), role="tool")], "`tool_call.s.` give write"),
    ([TextStep("Nothing here.", tool_call={"name": "read", "arguments": {}})], "step's text holds"),
  ],
)  # fmt: skip
def test_agent_traces_that_break_the_format_are_named(steps, message):
  with pytest.raises(HindsightError, match=message):
    agent_view(TextTrace(prompt="p", steps=steps, id="a"), "f.jsonl: trace a")


def test_openai_tool_call_format_is_read():
  """A step's `tool_call` as OpenAI's API writes it (arguments a JSON string, or the
  `tool_calls` entry with `function`) names the call its text holds."""
  text = render_call("lookup", {"box": 2})
  function = {"name": "lookup", "arguments": '{"box": 2}'}
  for given in (function, {"type": "function", "function": function}):
    steps = [TextStep(text, tool_call=given), TextStep(render_result("box 2 holds 4"), role="tool")]
    view = agent_view(TextTrace(prompt="p", steps=steps), "t")
    assert view.calls[0][0].arguments == {"box": 2}


# -- the world --------------------------------------------------------------------------------


def test_the_tool_worlds_dynamic_programme_matches_its_sampler():
  """V_0 of each task's competence against the outcomes the scripted agent and the
  environment reach (400 traces: |mean(G - V_0)| under 4 standard errors), and the exact
  labels of every trace tile its steps."""
  traces = tw.sample_traces(3, 400)
  gap = []
  for t in traces:
    task = tw.parse_task(t.prompt)
    gap.append(t.outcome - tw.value_tables(task.competence)[1][0, 0])
    texts = [s.text for s in agent_view(t, "t", unit="chunks").trace.steps]
    # The DP's reward is the environment's outcome on every trace (the ledger's class).
    actions = tw.parse_steps(task, texts).actions
    before_last = tw.parse_steps(task, texts[:-1]).config
    reward = tw.SUBMIT_REWARD[before_last] if actions[-1] == tw.SUBMIT else 0.0
    assert t.outcome == reward, (t.id, actions)
    truth = tw.exact_labels(t.prompt, texts, "policy")
    assert truth["credit_realized"][-1] == pytest.approx(reward - truth["phi"][-1])
  gap = np.asarray(gap)
  assert abs(gap.mean()) < 4 * gap.std() / np.sqrt(gap.size), gap.mean()
  assert 0.5 < np.mean([t.outcome for t in traces]) < 0.95  # neither trivial nor hopeless


# -- labels against the exact credit ----------------------------------------------------------


@pytest.mark.parametrize(("replacement", "K", "episodes"), [("policy", 64, 6), ("null", 16, 4)])
def test_agent_labels_match_the_tool_worlds_exact_credit(tmp_path, tool_url, tasks, replacement,
                                                         K, episodes):  # fmt: skip
  before = _served(tool_url)
  path = run_label_job(_job(tasks, episodes, tool_url, K, replacement), str(tmp_path / "o"),
                       progress=False)  # fmt: skip
  report = compare_to_exact(path)
  c = report["fields"]["credit"]
  assert c["false_zeros"] == 0 and c["z_over_3"] <= max(1, 0.01 * c["steps"]), c
  assert c["klass_contradicted"] <= max(1, 0.05 * c["klass_decided"]), c
  if K == 64:  # honest stderrs: z RMS near 1 where the stderr is a sample stderr
    assert c["sampled_steps"] >= 20 and 0.7 < c["z_rms_sampled"] < 1.35, c
    assert 0.7 < c["z_rms"] < 1.3 and c["coverage_95"] >= 0.9, c
  else:
    assert 0.2 < c["z_rms"] < 1.3, c
  labels = open_labels(path)
  meta = labels.metadata
  # Every turn of every continuation is a completion the server served (nothing cached).
  assert meta.completions == _served(tool_url) - before
  assert 0 < meta.tool_calls <= meta.completions
  assert report["summary"]["tool_calls"] == meta.tool_calls
  for example in labels:
    texts = [s.decode() for s in example["step_text"]]
    tags = [s.decode() for s in example["tags"]]
    assert tags == ["tool_call" if trailing_call(p[0][1]) else "step"
                    for p in (pieces(t) for t in texts)]  # fmt: skip
    assert not any(result_of(t) for t in texts)  # no result is a step of its own


def test_forked_replayed_and_snapshot_branching_give_identical_labels(tmp_path, tool_url, played):
  out = {}
  for name, tools in [("fork", "tool-world"), ("replay", "hindsight.worlds.tool_world:replayed"),
                      ("snapshot", "hindsight.worlds.tool_world:snapshotted")]:  # fmt: skip
    job = _job(played, 3, tool_url, 8, tools=tools)
    out[name] = open_labels(run_label_job(job, str(tmp_path / name), progress=False))
  for other in ("replay", "snapshot"):
    for a, b in zip(out["fork"], out[other], strict=True):
      for field in ("credit", "credit_stderr", "progress", "phi", "step_text"):
        np.testing.assert_array_equal(a[field], b[field], err_msg=f"{other}: {field}")
    assert out[other].metadata.tool_calls == out["fork"].metadata.tool_calls


def _label_args(path, url, out, *more):
  return ["label", "--env", f"text:{path}", "--episodes", "2", "--rollouts", "4", "--endpoint",
          url, "--model", tw.MODEL_NAME, "--verifier", "env", "--out", out, "--no-progress",
          *more]  # fmt: skip


def test_what_cannot_be_branched_or_replayed_is_refused_in_one_line(tmp_path, tool_url, played):
  cases = [
    ("tests.tool_envs:Unbranchable", "cannot be branched"),
    ("tests.tool_envs:SnapshotWithoutRestore", "cannot be branched"),
    ("tests.tool_envs:DriftingReplay", "not deterministic"),
    ("tests.tool_envs:LateDriftReplay", "not deterministic"),
    ("tests.tool_envs:Shifted", "comes from another environment"),
    ("tests.tool_envs:Crashing", "step(lookup) raised ZeroDivisionError: the tool broke"),
    ("nope", "no such environment"),
  ]
  for i, (tools, message) in enumerate(cases):
    out = tmp_path / f"o{i}"
    assert_one_line_error(run_cli(*_label_args(played, tool_url, out, "--tools", tools)), message)
    assert not os.path.exists(out / "hindsight_labels" / "1.0.0")


def test_tool_traces_on_the_text_path_are_refused_in_one_line(tmp_path, tool_url, played):
  """Without --tools a trace with tool calls is refused (as steps, and as one text with the
  markup inline); with it the same file is labeled."""
  text = tmp_path / "inline.jsonl"
  trace = read_traces(played)[0]
  write_traces(str(text), [TextTrace(prompt=trace.prompt, text=trace.completion(), id="inline")])
  for path in (played, str(text)):
    r = run_cli(*_label_args(path, tool_url, tmp_path / "o", "--episodes", "1"))
    assert_one_line_error(r, "calls tools: label it with --tools ENV")
  r = run_cli(*_label_args(str(text), tool_url, tmp_path / "ok", "--episodes", "1", "--tools",
                           "tool-world"))  # fmt: skip
  assert r.returncode == 0, r.stderr
  labels = open_labels(str(tmp_path / "ok"))
  assert len(labels[0]["step_text"]) == len(agent_view(trace, "t", unit="chunks").trace.steps)


# -- the multi-turn loop ----------------------------------------------------------------------


def _labeler(path, url, cache, episodes=2, env=None, K=8, replacement="policy", **kw):
  labeler = AgentLabeler(f"text:{path}", episodes, LabelConfig(num_rollouts=K,
                         replacement=replacement), _options(url, **kw))  # fmt: skip
  if env is not None:
    labeler.env = env
  labeler.open(str(cache))
  return labeler


def _calls_of(text: str) -> list[str]:
  return [json.loads(p[len("<tool_call>") : -len("</tool_call>")])["name"]
          for kind, p in pieces(text) if kind == "call"]  # fmt: skip


@pytest.mark.parametrize("branching", ["functional", "replay", "snapshot"])
def test_results_are_the_environments_and_side_effects_stay_in_their_branch(
  tmp_path, tool_url, played, branching
):
  """Every result in every continuation is one the environment wrote; a continuation's state
  holds the trace's calls before its step and its own calls, none of another branch's; a
  read after a write in the same branch sees the write; and the null branch of the trace's
  last step (the irreversible submit) starts from a state where nothing was submitted."""
  env = Recording(branching)
  labeler = _labeler(played, tool_url, tmp_path / "c.sqlite", env=env)
  found = labeler.resamples(0, 2, seed=0)
  made = sum(roll.tool_calls for r in found for pool in r.pools for roll in pool)
  assert sum(labeler.tool_calls.values()) == made > 0  # what the dataset's tool_calls counts
  if branching == "functional":  # the environment ran the traces' calls once, then these
    own = sum(len(c) for v in labeler.views.values() for c in v.calls)
    assert len(env.written) == own + made
  for r in found:
    view = labeler.views[r.episode]
    for t, pool in enumerate(r.pools):
      before = [c.name for calls in view.calls[:t] for c in calls]
      prefix = view.trace.prefix(t)
      for roll in pool:
        results = [result_of(p) for kind, p in pieces(roll.text) if kind == "result"]
        own = _calls_of(roll.text)
        assert len(results) == len(own) == roll.tool_calls
        assert set(results) <= set(env.written)
        assert roll.state.calls == before + own
        ledger = None  # the ledger as this branch left it, read back by its own read()s
        for kind, p in pieces(prefix + roll.text):
          if kind == "call" and _calls_of(p) == ["write"]:
            ledger = json.loads(p[len("<tool_call>") : -len("</tool_call>")])["arguments"]["value"]
          if kind == "result" and result_of(p).startswith("the ledger "):
            held = "is empty" if ledger is None else f"holds {ledger}"
            assert result_of(p) in (f"the ledger {held}", f"the ledger now holds {ledger}")
    T = len(view.trace.steps)
    assert view.calls[-1][0].name == "submit"
    (nulls,) = labeler.sample([Ask(view.trace.prefix(T - 1) + NULL_TEXT, 7, 0, 8, "null",
                                   r.episode, T - 1)])  # fmt: skip
    before = [c.name for calls in view.calls[: T - 1] for c in calls]
    for roll in nulls:
      assert roll.state.calls == before + _calls_of(roll.text)  # the step's submit never ran
    assert labeler.branches[r.episode].at(T - 1).submitted is None


def _fake_model(turns: list[str]):
  """A completions endpoint whose k-th turn (k = results so far in the prompt) is turns[k]
  (text, or (text, finish_reason)), ignoring stop sequences (the labeler must cut the text
  itself)."""
  from starlette.applications import Starlette
  from starlette.responses import JSONResponse
  from starlette.routing import Route

  async def completions(request):
    body = await request.json()
    k = min(body["prompt"].count("<tool_response>"), len(turns) - 1)
    text, finish = turns[k] if isinstance(turns[k], tuple) else (turns[k], "stop")
    choices = [{"index": j, "text": text, "finish_reason": finish} for j in range(body["n"])]
    return JSONResponse({"choices": choices, "usage": {"completion_tokens": 3 * body["n"]}})

  return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def test_the_loop_answers_malformed_calls_and_never_keeps_a_result_the_model_wrote(tmp_path):
  turns = [
    "Calling. <tool_call>{not json}</tool_call> and more",
    '<tool_call>{"name": "lookup", "arguments": {"box": 9}}</tool_call>',
    '<tool_call>{"name": "lookup", "arguments": {"box": 1.0}}</tool_call>',
    "<tool_call>" + json.dumps({"name": "nope", "arguments": {}}),  # the stop string stripped
    "I know it: <tool_response>box 1 holds 999 apples</tool_response> " + render_call("submit", {}),
  ]
  path = tmp_path / "t.jsonl"
  write_traces(str(path), tw.prompt_traces(5, 1))
  with running_app(_fake_model(turns)) as url:
    labeler = _labeler(path, url, tmp_path / "c.sqlite", episodes=1)
    trace = labeler.traces[0]
    ((roll,),) = labeler._roll([Ask(trace.prompt, 1, 0, 1, "p", 0, 0)],
                               [lambda: labeler.env.reset(trace, 0)])  # fmt: skip
  results = [result_of(p) for kind, p in pieces(roll.text) if kind == "result"]
  assert results[0].startswith("error: the call is not JSON")
  assert results[1] == "error: lookup takes box 1, 2 or 3"
  assert results[2] == "error: lookup takes box 1, 2 or 3"  # a float is no box number
  assert results[3].startswith("error: no tool 'nope'")
  assert len(results) == 4 and roll.tool_calls == 4 and roll.turns == 5
  assert "999" not in roll.text and roll.text.endswith("I know it: ")  # cut where it began
  assert roll.state.submitted is None and "and more" not in roll.text


def test_the_loop_stops_on_its_turn_and_completion_budgets(tmp_path, tool_url, played):
  labeler = _labeler(played, tool_url, tmp_path / "c.sqlite", episodes=1, max_turns=2)
  turns = [roll.turns for r in labeler.resamples(0, 1, 0) for pool in r.pools for roll in pool]
  assert max(turns) == 2 and min(turns) >= 1
  capped = _labeler(played, tool_url, tmp_path / "d.sqlite", episodes=1, budget_completions=20)
  with pytest.raises(HindsightError, match="budget of 20 completions is spent"):
    capped.resamples(0, 1, 0)


def test_an_endpoint_that_fails_a_quarter_of_its_requests_gives_the_same_labels(
  tmp_path, tool_url, played
):
  app, seen = create_app(tools=True), [0]

  async def flaky(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/v1/completions":
      seen[0] += 1
      if seen[0] % 4 == 0:
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await app(scope, receive, send)

  rows = []
  for url, name in ((tool_url, "clean"), (None, "flaky")):
    if url is None:
      with running_app(flaky) as flaky_url:
        labeler = _labeler(played, flaky_url, tmp_path / f"{name}.sqlite", K=4)
        labeler.client.backoff = 0.001
        rows.append(labeler.label(0, 2, 0))
    else:
      rows.append(_labeler(played, url, tmp_path / f"{name}.sqlite", K=4).label(0, 2, 0))
  assert seen[0] >= 40 and labeler.client.stats.retries >= seen[0] // 4 - 1
  for a, b in zip(*rows, strict=True):
    assert a.keys() == b.keys()
    for field in a:
      np.testing.assert_array_equal(np.asarray(a[field]), np.asarray(b[field]), err_msg=field)


def test_text_world_cli_serves_prompts_and_scores_the_tool_world(tmp_path, tool_url, capsys):
  prompts = tmp_path / "p.jsonl"
  r = run_cli("text-world", "prompts", "--tools", "--episodes", "2", "--out", prompts)
  assert r.returncode == 0, r.stderr
  assert [t.reference for t in read_traces(str(prompts))] == [
    str(tw.Task(int(t.id.split("_")[1])).total) for t in read_traces(str(prompts))
  ]
  out = tmp_path / "labels"
  r = run_cli(*_label_args(prompts, tool_url, out, "--tools", "tool-world"))
  assert r.returncode == 0, r.stderr
  r = run_cli("text-world", "exact", out, "--out", tmp_path / "exact.json")
  assert r.returncode == 0, r.stderr
  report = json.loads((tmp_path / "exact.json").read_text())
  assert report["summary"]["traces"] == 2 and report["summary"]["tool_calls"] > 0
  assert "z RMS" in r.stdout


def test_the_agent_credit_eval_reports_shares_within_their_intervals(tmp_path, tool_url, played):
  from eval import agent_credit

  path = run_label_job(_job(played, 2, tool_url, 4), str(tmp_path / "labels"), progress=False)
  out, figure = tmp_path / "report.json", tmp_path / "kinds.png"
  code = agent_credit.main(["--traces", "40", "--labels", path, "--out", str(out), "--plot",
                            str(figure)])  # fmt: skip
  assert code == 0 and figure.stat().st_size > 0
  report = json.loads(out.read_text())
  s = report["scripted"]
  assert sum(v["steps"] for v in s["by_kind"].values()) == s["steps"]
  for name, value in s.items():
    if name.startswith(("decorative_", "harmful_", "prm_")):
      point, lo, hi = value
      assert -1 <= lo <= point <= hi <= 1, (name, value)
  # Under null a restatement is replaced by itself: exactly 0, decorative every time.
  assert s["by_kind"]["restate"]["decorative_null"] == 1.0
  (labels,) = report["labels"]
  assert labels["traces"] == 2 and labels["tool_calls"] == open_labels(path).metadata.tool_calls


def test_the_audit_refuses_agent_runs_in_one_line():
  """The audit resamples as text: an agent run's traces are refused there, named."""
  from types import SimpleNamespace

  from hindsight.data.metadata import LabelMetadata
  from hindsight.text.audit import prepare_text_audit

  meta = LabelMetadata(job=json.dumps({"text": {"tools": "tool-world"}}))
  cfg = SimpleNamespace(trajectories="traces.jsonl", endpoint="http://127.0.0.1:1/v1")
  with pytest.raises(HindsightError, match="does not resample agent traces"):
    prepare_text_audit(cfg, None, meta, "unused")


def test_the_null_arm_forks_each_step_before_its_call(tmp_path, tool_url, played):
  """`label` under null asks, for every step t, the prefix before t and the null text, from
  the environment's state before t: step t's call is not in it."""
  labeler = _labeler(played, tool_url, tmp_path / "c.sqlite", episodes=1, K=2,
                     replacement="null")  # fmt: skip
  asked, sample = [], labeler.sample

  def recording(asks):
    asked.extend(asks)
    return sample(asks)

  labeler.sample = recording
  labeler.label(0, 1, 0)
  view, nulls = labeler.views[0], [a for a in asked if "null replacement" in a.where]
  assert sorted(a.t for a in nulls) == list(range(len(view.trace.steps)))
  for a in nulls:
    assert a.prompt == view.trace.prefix(a.t) + NULL_TEXT
    before = [c.name for calls in view.calls[: a.t] for c in calls]
    assert labeler.branches[0].at(a.t).calls == before


def test_roles_and_cut_calls_a_user_or_a_model_writes_are_labeled(tmp_path, tool_url, played):
  """An agent step with role `assistant` (the documented format) is labeled like one
  without; a call the token cap cut is dropped and the episode ends, so a trace sampled
  that way is labeled, not refused."""
  traces = read_traces(played)[:1]
  path = tmp_path / "roles.jsonl"
  write_traces(str(path), [TextTrace(prompt=t.prompt, id=t.id, steps=[
    TextStep(s.text, role=s.role or "assistant", tool_call=s.tool_call) for s in t.steps])
    for t in traces])  # fmt: skip
  (row,) = _labeler(path, tool_url, tmp_path / "a.sqlite", episodes=1, K=2).label(0, 1, 0)
  assert set(row["tags"]) <= {0, 1} and len(row["step_text"]) == len(agent_view(
    traces[0], "t", unit="chunks").trace.steps)  # fmt: skip
  cut = [("Reading the boxes. " + '<tool_call>{"name": "look', "length")]
  prompts = tmp_path / "p.jsonl"
  write_traces(str(prompts), tw.prompt_traces(7, 1))
  with running_app(_fake_model(cut)) as url:
    (row,) = _labeler(prompts, url, tmp_path / "b.sqlite", episodes=1, K=2).label(0, 1, 0)
  assert row["step_text"] == ["Reading the boxes. "] and row["completions"] == 1 + 2


def test_the_language_model_learns_the_tool_worlds_text():
  """`lm train --world tools`: each row is a tool-world trace of the scripted agent and its
  environment (calls and results inline), the loss on exactly its completion and EOS."""
  from hindsight.lm.config import LMTrainConfig
  from hindsight.lm.train import training_sequences

  cfg = LMTrainConfig(world="tools", traces=6, max_count=5, max_len=768)
  tok, ids, mask, _ = training_sequences(cfg)
  for i, trace in enumerate(tw.sample_traces(cfg.seed, cfg.traces, cfg.max_count)):
    assert "<tool_response>" in trace.completion() and trace.prompt.startswith("Task ")
    targets = ids[i, 1:][mask[i, :-1] > 0]
    np.testing.assert_array_equal(targets, [*tok.encode(trace.completion()), 1])
  with pytest.raises(HindsightError, match="world must be text or tools"):
    LMTrainConfig(world="chat")
