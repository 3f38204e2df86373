"""Text traces: the format and chunking, verifiers, the completions client's failure modes,
the labeler against the text world's exact credit (served on loopback), resumability, and
the thought-anchors importer."""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import time

import httpx
import numpy as np
import pytest

from hindsight.credit.names import KLASS_NAMES
from hindsight.data import open_labels
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig, LabelJob
from hindsight.labeling.job import run_label_job
from hindsight.text.client import Budget, CompletionCache, CompletionClient, Draw, Sampling
from hindsight.text.options import TextOptions
from hindsight.text.similarity import Similarity
from hindsight.text.thought_anchors import import_thought_anchors
from hindsight.text.trace import TextStep, TextTrace, chunk_text, read_traces, write_traces
from hindsight.text.verify import boxed, last_boxed, load_verifier
from hindsight.worlds import world
from hindsight.worlds.exact import compare_to_exact
from hindsight.worlds.server import running_world
from tests.conftest import HINDSIGHT, ROOT, run_cli

NULL_TEXT = world.render(world.Problem(0, (1, 1, 1)), 0, 0) + " "


@pytest.fixture(scope="module")
def world_url():
  with running_world() as url:
    yield url


def _served(url: str) -> dict:
  return httpx.get(url.removesuffix("/v1") + "/stats").json()


def _job(path, episodes, url, K=16, replacement="policy", **text):
  options = TextOptions(endpoint=url, model=world.MODEL_NAME, **text)
  return LabelJob(f"text:{path}", episodes, LabelConfig(num_rollouts=K, replacement=replacement),
                  chunk_size=4, options=options)  # fmt: skip


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
  path = tmp_path_factory.mktemp("text") / "prompts.jsonl"
  write_traces(str(path), world.prompt_traces(0, 12))
  return str(path)


# -- format, chunking, verifiers -----------------------------------------------------------


def test_thought_anchors_chunking_tiles_the_text():
  text = "First we add. Then? Ok!\n\nNew paragraph here. 3. Last one without end"
  chunks = chunk_text(text)
  assert "".join(chunks) == text
  # "Then? " and "Ok!\n\n" are under 10 characters: merged into the next chunk.
  assert chunks == [
    "First we add. ",
    "Then? Ok!\n\nNew paragraph here. ",
    "3. Last one without end",
  ]
  assert chunk_text("a\nb\n", "newlines") == ["a\n", "b\n"]
  assert chunk_text("x;y;z", "re:;") == ["x;", "y;", "z"]
  # A piece with nothing visible is no step under any rule: it joins the step before it
  # (leading blank lines the first one).
  paragraphs = "\n\nOne.\n\nTwo.\n \n\nThree"
  assert chunk_text(paragraphs, "newlines") == ["\n\nOne.\n\n", "Two.\n \n\n", "Three"]
  assert chunk_text("a\n\n \nb", "re:\\n") == ["a\n\n \n", "b"]
  for rule in ("sentences", "newlines", "re:\\s"):
    for text in (paragraphs, "x \n\n\n y\t\n", "Ok.   Then.\n\n\n"):
      chunks = chunk_text(text, rule)
      assert "".join(chunks) == text and all(c.strip() for c in chunks), (rule, text)
  assert chunk_text("  \n", "newlines") == ["  \n"]  # nothing visible at all: one chunk
  with pytest.raises(HindsightError, match="unknown chunking 'words'"):
    chunk_text("x", "words")
  with pytest.raises(HindsightError, match="not a regular expression"):
    chunk_text("x", "re:(")


def test_trace_files_bad_lines_are_named(tmp_path):
  path = tmp_path / "t.jsonl"
  path.write_text('{"prompt": "p", "text": "a. b."}\n{"prompt": 3}\n')
  with pytest.raises(HindsightError, match=r"t.jsonl:2: not a trace"):
    read_traces(str(path))
  path.write_text('{"prompt": "p", "text": "x", "steps": [{"text": "y"}]}\n')
  with pytest.raises(HindsightError, match="one of `steps`, `text` or `messages`, not steps and"):
    read_traces(str(path))
  path.write_text('{"prompt": "p", "messages": [{"role": "user", "content": "q"}]}\n')
  with pytest.raises(HindsightError, match=r"holds its prompt in its messages.*drop `prompt`"):
    read_traces(str(path))
  path.write_text('{"id": "q", "text": "a."}\n')
  with pytest.raises(HindsightError, match=r"t.jsonl:1: a trace needs `prompt` \(or `messages`\)"):
    read_traces(str(path))
  path.write_text('{"prompt": "p", "steps": []}\n')
  with pytest.raises(HindsightError, match="`steps` is empty"):
    read_traces(str(path))
  path.write_text('{"prompt": "p", "text": "a."}\n{"id": "q", "prompt": "p", "steps": '
                  '[{"text": "a. "}, {"text": "\\n\\n"}]}\n')  # fmt: skip
  with pytest.raises(HindsightError, match=r"t.jsonl:2: trace q: step 1 is blank"):
    read_traces(str(path))
  with pytest.raises(HindsightError, match="cannot read it"):
    read_traces(str(tmp_path / "missing.jsonl"))
  trace = TextTrace(prompt="Q: ", steps=[TextStep("a. ", role="assistant"), TextStep("b.")])
  write_traces(str(path), [trace])
  assert read_traces(str(path)) == [trace]
  assert trace.prefix(1) == "Q: a. "


def test_a_verifier_beside_the_command_loads_without_pythonpath(tmp_path, monkeypatch):
  import sys

  from hindsight.plugins import import_function

  (tmp_path / "myverify_here.py").write_text("def verify(c, t):\n  return 1.0\n")
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
  _, fn = import_function("myverify_here:verify", "--verifier")
  assert fn("x", None) == 1.0
  with pytest.raises(HindsightError, match=f"looked up in {tmp_path} and on PYTHONPATH"):
    import_function("nosuch_module_here:verify", "--verifier")


def raising_verifier(completion, trace):
  raise RuntimeError("the grader is down")


def test_verifiers():
  assert last_boxed(r"so \boxed{\frac{1}{2}} then \boxed{42}") == "42"
  assert last_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
  assert last_boxed(r"\boxed{12") is None
  trace = TextTrace(prompt="", reference="1,000", id="t7")
  assert boxed(r"... \boxed{1000.0}", trace) == 1.0
  assert boxed(r"... \boxed{999}", trace) == 0.0
  assert boxed("no answer", trace) == 0.0
  with pytest.raises(HindsightError, match="no `reference`"):
    boxed(r"\boxed{1}", TextTrace(prompt=""))
  verify = load_verifier("tests.test_text:raising_verifier")
  with pytest.raises(HindsightError, match="raised RuntimeError on trace t7: the grader is down"):
    verify("x", trace)
  with pytest.raises(HindsightError, match="cannot load it"):
    load_verifier("tests.test_text:nothing_here")


def test_the_similarity_agrees_with_the_worlds_content_classes():
  """Same content class <=> cosine >= 0.8, for every pair of sentences the world can write
  in one configuration, over many problems: what makes the text labeler's rejection of
  restatements the exact DP's `policy_other`."""
  sim = Similarity()
  for problem in [*world.problems(3, 6), world.Problem(1, (5, 5, 5)), world.Problem(2, (9, 90, 9))]:
    for cfg in range(world.NUM_CONFIGS):
      texts = [world.render(problem, cfg, a) for a in range(world.NUM_ACTIONS)]
      for a, text in enumerate(texts):
        same = sim.same(text, texts)
        assert (same == (world.CLASS_OF_ACTION[a] == world.CLASS_OF_ACTION)).all(), text
      assert [world.parse_action(problem, t) for t in texts] == list(range(world.NUM_ACTIONS))


def test_the_worlds_dynamic_programme_matches_its_sampler():
  """V_0 of the DP against 4000 episodes sampled by the world's own continuation."""
  problem = world.problems(5, 1)[0]
  rng = np.random.default_rng(0)
  start = world.parse_prefix(problem.prompt())
  wins = []
  for _ in range(4000):
    last = world.continue_prefix(start, rng)[-1]
    wins.append(world.parse_action(problem, last) == world.ANSWER_RIGHT)
  # The exact value of the first step's state: progress + credit identities at t = 0.
  first = world.parse_action(problem, world.continue_prefix(start, np.random.default_rng(1))[0])
  exact = world.exact_credit(problem, [first], "policy")
  # Q(x_0, a_0) - V_0 is `progress`; V_0 itself from a one-step trace's realized credit:
  # G - V_0 with G = 0 for a non-answer step.
  v0 = -exact["credit_realized"][0] if first < world.ANSWER_RIGHT else None
  if v0 is not None:
    se = np.std(wins) / np.sqrt(len(wins))
    assert abs(np.mean(wins) - v0) < 4 * se + 1e-9, (np.mean(wins), v0)
  assert np.isclose(exact["credit"][0], exact["progress"][0])


# -- the client ------------------------------------------------------------------------------


def _choices(n, text="So \\boxed{1}."):
  return {"choices": [{"index": i, "text": text, "finish_reason": "stop"} for i in range(n)],
          "usage": {"completion_tokens": 2 * n}}  # fmt: skip


def _client(tmp_path, handler, **kw):
  cache = CompletionCache(str(tmp_path / "c.sqlite"))
  return CompletionClient("http://test/v1", "m", Sampling(), cache, backoff=0.001,
                          transport=httpx.MockTransport(handler), **kw)  # fmt: skip


def test_the_client_retries_what_is_worth_retrying(tmp_path):
  calls = []
  failures = [
    httpx.Response(429, headers={"retry-after": "0"}),
    httpx.Response(503),
    "timeout",
    httpx.Response(200, text="{not json"),
    httpx.Response(200, json={"choices": [{"index": 0, "text": "x"}]}),  # 1 choice for n = 2
  ]

  def handler(request):
    calls.append(json.loads(request.content))
    if len(calls) <= len(failures):
      f = failures[len(calls) - 1]
      if f == "timeout":
        raise httpx.ReadTimeout("slow", request=request)
      return f
    return httpx.Response(200, json=_choices(2))

  client = _client(tmp_path, handler)
  out = client.sample([Draw("p", 7, 0, 2)])
  assert [c.text for c in out[0]] == ["So \\boxed{1}."] * 2
  assert client.stats.retries == 5 and client.stats.tokens == 4
  assert {c["n"] for c in calls} == {2} and len({c["seed"] for c in calls}) == 1
  # A rerun asks for nothing: every sample is in the cache.
  again = _client(tmp_path, lambda r: pytest.fail("a cached sample was requested"))
  assert again.sample([Draw("p", 7, 0, 2)]) == out and again.stats.cached == 2


def test_the_client_gives_up_in_one_line(tmp_path):
  client = _client(tmp_path, lambda r: httpx.Response(500), retries=2)
  with pytest.raises(HindsightError, match=r"HTTP 500 after 2 retries"):
    client.sample([Draw("p", 1, 0, 1)])
  refused = _client(tmp_path, lambda r: httpx.Response(
    404, json={"error": {"message": "The model `m` does not exist."}}))  # fmt: skip
  with pytest.raises(HindsightError, match=r"refused the request \(HTTP 404\): The model `m`"):
    refused.sample([Draw("p", 1, 0, 1)])
  # Nothing listens on port 9 of loopback (discard): the endpoint is down.
  cache = CompletionCache(str(tmp_path / "d.sqlite"))
  down = CompletionClient("http://127.0.0.1:9/v1", "m", Sampling(), cache, retries=1,
                          backoff=0.001, timeout=2)  # fmt: skip
  with pytest.raises(HindsightError, match=r"unreachable .* after 1 retries"):
    down.sample([Draw("p", 1, 0, 1)])


def test_the_budget_stops_a_run_and_a_rerun_goes_on(tmp_path):
  handler = lambda r: httpx.Response(200, json=_choices(json.loads(r.content)["n"]))  # noqa: E731
  draws = [Draw(f"p{i}", i, 0, 4) for i in range(5)]
  client = _client(tmp_path, handler, concurrency=1, budget=Budget(completions=8))
  with pytest.raises(HindsightError, match="budget of 8 completions is spent"):
    client.sample(draws)
  assert len(client.cache) == 8  # what it got before the budget ran out is kept
  more = _client(tmp_path, handler, budget=Budget(completions=12))
  assert len(more.sample(draws)) == 5 and more.stats.completions == 12


# -- the labeler against the text world's exact credit ------------------------------------


def _honest(report, field="credit"):
  """No false exact zero, few |z| > 3, z RMS under 1.3, and klass as the truth says. The z
  RMS floor is low because most steps at K = 16 tie in every branch and carry the tie bound,
  conservative by design; where enough steps have a sample stderr, their z RMS must be near
  1 (a stderr 5x too wide fails)."""
  f = report["fields"][field]
  assert f["false_zeros"] == 0, f
  assert 0.2 < f["z_rms"] < 1.3, f
  assert f["z_over_3"] <= max(1, 0.01 * f["steps"]), f
  if field == "credit" and f["sampled_steps"] >= 20:
    assert 0.6 < f["z_rms_sampled"] < 1.4, f
  if field == "credit":  # a decided klass the exact credit contradicts: <= 5% of them
    assert f["klass_contradicted"] <= max(1, 0.05 * f["klass_decided"]), f


@pytest.mark.parametrize(
  ("replacement", "K", "episodes"),
  [("policy", 16, 12), ("policy", 64, 4), ("policy_other", 16, 8), ("null", 16, 4)],
)
def test_text_labels_match_the_worlds_exact_credit(tmp_path, world_url, prompts, replacement, K,
                                                   episodes):  # fmt: skip
  text = {"null_text": NULL_TEXT} if replacement == "null" else {}
  job = _job(prompts, episodes, world_url, K=K, replacement=replacement, **text)
  path = run_label_job(job, str(tmp_path / "out"), progress=False)
  report = compare_to_exact(path)
  for field in ("credit", "credit_realized", "progress", "phi"):
    _honest(report, field)
  hard = report["fields"]["phi_hard"]  # the indicator's sum against its expectation
  assert hard["steps"] > 0 and abs(hard["z"]) < 4 and hard["last_step_errors"] == 0, hard
  if K == 64:  # enough steps with sample stderrs for the near-1 check (measured: 31)
    assert report["fields"]["credit"]["sampled_steps"] >= 20, report["fields"]["credit"]
  assert report["summary"]["undefined_too_rare"] == 0
  assert report["summary"]["undefined_missed"] == 0
  labels = open_labels(path)
  example = labels[0]
  assert len(example["step_text"]) == len(example["credit"])
  assert labels.metadata.completions > 0 and labels.metadata.env_name == "text"


def test_no_repeat_conditions_on_the_content_never_coming_back(tmp_path, world_url, prompts):
  job = _job(prompts, 4, world_url, K=16, replacement="policy_no_repeat")
  report = compare_to_exact(run_label_job(job, str(tmp_path / "out"), progress=False))
  _honest(report)
  assert report["summary"]["undefined_missed"] == 0


def test_a_rerun_from_the_cache_sends_no_request(tmp_path, world_url, prompts):
  first = run_label_job(_job(prompts, 3, world_url), str(tmp_path / "a"), progress=False)
  before = _served(world_url)
  cache = str(tmp_path / "a" / "completions.sqlite")
  again = run_label_job(_job(prompts, 3, world_url, cache=cache), str(tmp_path / "b"),
                        progress=False)  # fmt: skip
  assert _served(world_url) == before
  a, b = open_labels(first), open_labels(again)
  for x, y in zip(a, b, strict=True):
    np.testing.assert_array_equal(x["credit"], y["credit"])
    np.testing.assert_array_equal(x["step_text"], y["step_text"])


def test_a_model_that_never_stops_is_cut_at_max_tokens(tmp_path, world_url, prompts, capfd):
  job = _job(prompts, 1, world_url, K=4, max_tokens=6)
  labels = open_labels(run_label_job(job, str(tmp_path / "out"), progress=False))
  assert "ended at their token cap (--max-tokens 6;" in capfd.readouterr().err
  assert labels[0]["length"] >= 1  # the base trace too was cut: its steps are what it wrote
  # Six tokens reach no \boxed{} answer: every continuation of both arms fails alike, so
  # each credit is exactly 0, bounded by the tie bound (not a false exact zero), and
  # undetermined. Cut continuations scored otherwise in one arm would show here.
  example = labels[0]
  assert not example["success"] and float(example["return"]) == 0.0
  for field in ("credit", "credit_realized", "phi", "progress"):
    np.testing.assert_array_equal(np.asarray(example[field]), 0.0, err_msg=field)
  assert np.asarray(example["credit_bounded"]).all()
  assert (np.asarray(example["credit_stderr"]) > 0).all()
  assert (np.asarray(example["klass"]) == KLASS_NAMES.index("undetermined")).all()


@pytest.mark.slow
def test_kill_9_mid_job_then_rerun_gives_the_same_dataset(tmp_path, world_url, prompts):
  args = ["label", "--env", f"text:{prompts}", "--episodes", "6", "--rollouts", "16",
          "--chunk-size", "2", "--endpoint", world_url, "--model", world.MODEL_NAME,
          "--concurrency", "2", "--samples-per-request", "8", "--no-progress"]  # fmt: skip
  whole = run_cli(*args, "--out", tmp_path / "whole")
  assert whole.returncode == 0, whole.stderr
  served_whole = _served(world_url)["completions"]
  out = tmp_path / "killed"
  cache = out / "completions.sqlite"
  env = dict(os.environ, XLA_FLAGS="--xla_backend_optimization_level=0")
  proc = subprocess.Popen([*HINDSIGHT, *args, "--out", str(out)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
  deadline = time.monotonic() + 120
  rows = 0
  while time.monotonic() < deadline and proc.poll() is None:
    time.sleep(0.05)
    try:
      with sqlite3.connect(cache) as db:
        rows = db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
    except sqlite3.Error:
      continue
    if rows >= 300:
      proc.send_signal(signal.SIGKILL)
      break
  proc.wait()
  assert proc.returncode == -signal.SIGKILL, "the job finished before it could be killed"
  with sqlite3.connect(cache) as db:
    cached = db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
  total = len(CompletionCache(str(tmp_path / "whole" / "completions.sqlite")))
  start = _served(world_url)["completions"]
  rerun = run_cli(*args, "--out", out)
  assert rerun.returncode == 0, rerun.stderr
  # Exactly the samples the killed job had not cached were requested.
  assert _served(world_url)["completions"] - start == total - cached
  assert served_whole > 0
  for x, y in zip(open_labels(str(tmp_path / "whole")), open_labels(str(out)), strict=True):
    for name in ("credit", "credit_stderr", "progress", "phi"):
      np.testing.assert_array_equal(x[name], y[name])


def test_text_cli_bad_input_is_one_line(tmp_path, prompts, world_url):
  base = ["label", "--env", f"text:{prompts}", "--episodes", "1", "--out", tmp_path / "o",
          "--no-progress"]  # fmt: skip
  cases = [
    ([*base], "needs --model NAME"),
    ([*base, "--model", "m", "--replacement", "uniform"], "has no meaning for text"),
    ([*base, "--model", "m", "--replacement", "null"], "needs --null-text"),
    ([*base, "--model", "m", "--episodes", "99"], "holds 12 traces"),
    (["label", "--env", "reasoning", "--episodes", "1", "--out", tmp_path / "r", "--model", "m"],
     "--model is for --env text"),
    ([*base, "--model", world.MODEL_NAME, "--endpoint", world_url, "--verifier",
      "tests.test_text:raising_verifier"], "raised RuntimeError"),
    ([*base, "--model", "nope", "--endpoint", world_url], "HTTP 404"),
  ]  # fmt: skip
  for i, (args, message) in enumerate(cases):
    r = run_cli(*[tmp_path / f"o{i}" if a == tmp_path / "o" else a for a in args])
    assert r.returncode == 2, (args, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (args, r.stderr)
    assert not os.path.exists(tmp_path / f"o{i}" / "hindsight_labels" / "1.0.0")


# -- thought-anchors importer ---------------------------------------------------------------


def _write_layout(root, problems):
  """problems: [(base_correct, chunks, per-chunk [(chunk_resampled, is_correct)])]."""
  for n, (base_correct, chunks, resamples) in enumerate(problems):
    d = root / f"problem_{n}"
    d.mkdir(parents=True)
    (d / "base_solution.json").write_text(json.dumps({
      "prompt": f"Q{n}", "solution": "", "full_cot": " ".join(chunks), "answer": "1",
      "is_correct": base_correct}))  # fmt: skip
    (d / "chunks.json").write_text(json.dumps({"source_text": "", "solution_text": "",
                                               "chunks": chunks}))  # fmt: skip
    for i, rows in enumerate(resamples):
      (d / f"chunk_{i}").mkdir()
      records = [
        {"chunk_removed": chunks[i], "prefix_without_chunk": "", "chunk_resampled": new,
         "rollout": "", "full_cot": "", "answer": "", "is_correct": ok}
        for new, ok in rows
      ]  # fmt: skip
      (d / f"chunk_{i}" / "solutions.json").write_text(json.dumps(records))


def test_thought_anchors_layout_becomes_a_dataset(tmp_path):
  chunks = ["We need the sum of the boxes.", "The first box holds seven apples.",
            "So the answer is seven."]  # fmt: skip
  same, other = "We need the sum of the boxes.", "Let me think about something else entirely."
  resamples = [
    [(same, True)] * 3 + [(other, False)] * 5,  # acc 3/8 before chunk 0
    [(other, True)] * 6 + [("x", None)] + [(other, False)] * 2,  # 6/8; one failed sample
    [(other, True)] * 4,  # 4/4
  ]
  _write_layout(tmp_path / "ta", [(True, chunks, resamples)])
  path = import_thought_anchors(str(tmp_path / "ta"), str(tmp_path / "out"))
  ex = open_labels(path)[0]
  acc = np.array([3 / 8, 6 / 8, 1.0, 1.0])  # the last: the base solution's is_correct
  np.testing.assert_allclose(ex["credit"], acc[1:] - acc[:-1], atol=1e-6)
  np.testing.assert_allclose(ex["phi"], acc[:-1], atol=1e-6)
  assert [s.decode() for s in ex["step_text"]] == chunks
  assert ex["prompt"].decode() == "Q0" and ex["credit_stderr"][0] > 0
  # Counterfactual importance: only resamples whose new chunk differs from chunk 0.
  cf = open_labels(import_thought_anchors(str(tmp_path / "ta"), str(tmp_path / "cf"),
                                          replacement="policy_other"))[0]  # fmt: skip
  np.testing.assert_allclose(cf["credit"][0], 6 / 8 - 0.0, atol=1e-6)
  with pytest.raises(HindsightError, match="already holds another dataset"):
    import_thought_anchors(str(tmp_path / "ta"), str(tmp_path / "out"), replacement="policy_other")
  os.remove(tmp_path / "ta" / "problem_0" / "chunk_1" / "solutions.json")
  with pytest.raises(HindsightError, match=r"chunk_1/solutions.json: cannot read it"):
    import_thought_anchors(str(tmp_path / "ta"), str(tmp_path / "again"))
  r = run_cli("import", "thought-anchors", tmp_path / "nowhere", "--out", tmp_path / "x")
  assert r.returncode == 2 and "no such directory" in r.stderr


def test_text_world_cli_prompts_and_exact(tmp_path, world_url, capsys):
  """`hindsight text-world prompts` writes prompts the world parses; `text-world exact`
  scores a dataset labeled through the world against its DP (in process: the commands are
  what is tested, not the process)."""
  from hindsight.cli import main

  assert main(["text-world", "prompts", "--episodes", "3", "--out", str(tmp_path / "p.jsonl")]) == 0
  traces = read_traces(str(tmp_path / "p.jsonl"))
  assert len(traces) == 3 and traces[0].steps is None and world.parse_problem(traces[0].prompt)
  job = _job(str(tmp_path / "p.jsonl"), 3, world_url, K=16)
  out = run_label_job(job, str(tmp_path / "labels"), progress=False)
  capsys.readouterr()
  report_path = tmp_path / "exact.json"
  assert main(["text-world", "exact", out, "--out", str(report_path)]) == 0
  report = json.loads(report_path.read_text())
  summary = report["summary"]
  labels = open_labels(out)
  assert summary["traces"] == 3
  assert summary["steps"] == report["fields"]["credit"]["steps"] > 0
  assert summary["steps"] <= sum(int(labels[i]["length"]) for i in range(3))
  # The report's numbers are compare_to_exact's, and the line printed says them.
  assert report == json.loads(json.dumps(compare_to_exact(out)))
  line = capsys.readouterr().out.strip()
  assert line.startswith(f"{summary['steps']} steps of 3 traces: z RMS {summary['z_rms']:.3f}")
  assert 0.3 < summary["z_rms"] < 2.0, summary  # K=16 labels against the truth


def test_the_summary_of_constant_credit_prints_no_scipy_warning():
  """A small text dataset often has every credit 0: the correlation is undefined, said as
  nan, not as scipy's ConstantInputWarning with a source path."""
  import warnings

  from hindsight.metrics.summary import tag_table

  T = 5
  ex = {"tags": ["step"] * T, "credit": np.zeros(T), "progress": np.zeros(T),
        "klass": np.zeros(T, int), "credit_stderr": np.zeros(T), "return": 1.0,
        "success": True}  # fmt: skip
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    table = tag_table([ex, ex])
  assert np.isnan(table["_all"]["spearman_progress_credit"])


def test_a_text_job_counts_what_was_served_and_its_bar_never_says_compiling(
  tmp_path, prompts, world_url, capfd
):
  """Traces sampled from their prompts: one completion each (not a request's n of them, one
  kept), so the dataset's cost is what the endpoint served; the bar never says "compiling"
  (a text job compiles nothing) and ends on that same count."""
  from hindsight.progress import CompileAwareBar
  from hindsight.text.source import TextSource

  assert TextSource(_job(prompts, 1, world_url), str(tmp_path)).info.compiles is False
  for compiles, shown in ((False, "label text"), (True, "label text (compiling)")):
    with CompileAwareBar(total=3, desc="label text", compiles=compiles, file=io.StringIO(),
                         mininterval=0) as bar:  # fmt: skip
      assert bar.format_dict["prefix"].rstrip(": ") == shown
      bar.update(1)  # after the first unit no bar says it
      assert bar.format_dict["prefix"].rstrip(": ") == "label text"
  before = _served(world_url)["completions"]
  job = _job(prompts, 3, world_url, K=4, samples_per_request=4)
  labels = open_labels(run_label_job(job, str(tmp_path / "out"), progress=True))
  served = _served(world_url)["completions"] - before
  steps = sum(int(labels[i]["length"]) for i in range(3))
  assert labels.metadata.completions == served == 3 + 4 * steps
  err = capfd.readouterr().err
  assert "label text" in err and "(compiling)" not in err, err
  assert f"completions={served}," in err.split("\r")[-1], err.split("\r")[-1]
