"""The "your own model" route of docs/text.md, through the CLI as a new user runs it: a tiny
random Qwen2 folder (context 512) served by `hindsight lm serve`, paragraph traces labeled
through it with `--chunking newlines` and the default `--max-tokens 1024`, a credit model
trained on them, scored and served, and `hindsight eval` on a one-trace test split."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from hindsight.data import open_labels
from hindsight.text.trace import chunk_text
from hindsight.worlds import world
from tests.conftest import assert_one_line_error, run_cli
from tests.test_lm_server import write_folder

OWN_LM = pytest.mark.xdist_group("own_lm")
VERIFIER = "tests.text_verifiers:first_boxed"


def _paragraph_traces(n: int) -> list[dict]:
  """World traces of at most 8 sentences (well inside the context) written as paragraphs:
  every sentence, then a blank line."""
  out = []
  short = [t for t in world.sample_traces(5, 4 * n, (1, 6)) if len(t.steps) <= 8][:n]
  for i, t in enumerate(short):
    text = "\n\n".join(s.text.strip() for s in t.steps) + "\n"
    out.append({"id": f"p{i}", "prompt": t.prompt, "text": text, "reference": t.reference})
  return out


@pytest.fixture(scope="module")
def own(tmp_path_factory):
  """The served folder, the labels of 24 paragraph traces and a run trained on them (one
  trace held out for its test split)."""
  from hindsight.lm.server import running_lm

  root = tmp_path_factory.mktemp("own_lm")
  folder = write_folder(str(root / "tiny"), seed=3)
  traces = _paragraph_traces(24)
  (root / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces))
  with running_lm(folder) as (url, name):
    stats = url.removesuffix("/v1") + "/stats"
    got = run_cli("label", "--env", f"text:{root / 'traces.jsonl'}", "--endpoint", url,
                  "--model", name, "--episodes", 24, "--rollouts", 4, "--chunking", "newlines",
                  "--verifier", VERIFIER, "--out", root / "labels", "--no-progress")  # fmt: skip
    assert got.returncode == 0, got.stderr
    served = httpx.get(stats).json()["completions"]
    train = run_cli("train", "--config", "text:smoke", "--labels", root / "labels",
                    "--workdir", root / "run", "--config.train.steps=30",
                    "--config.train.eval_every=30", "--config.data.test_fraction=0.04")  # fmt: skip
    assert train.returncode == 0, train.stderr
    yield {"root": root, "url": url, "name": name, "stats": stats, "served": served,
           "traces": traces, "train": train, "label": got}  # fmt: skip


@OWN_LM
def test_blank_lines_are_no_steps_and_the_dataset_counts_what_was_served(own):
  labels = open_labels(str(own["root"] / "labels"))
  for i, trace in enumerate(own["traces"]):
    steps = [s.decode() if isinstance(s, bytes) else s for s in labels[i]["step_text"]]
    assert "".join(steps) == trace["text"]  # the steps tile the text
    assert all(s.strip() for s in steps)  # a blank line joined the step before it
    assert len(steps) == trace["text"].count("\n\n") + 1
  # Every completion the endpoint served is in the dataset's cost, and no more.
  assert (
    labels.metadata.completions
    == own["served"]
    == 4 * sum(len(labels[i]["step_text"]) for i in range(len(labels)))
  )
  # The default --max-tokens 1024 is more than a 512-token model leaves: each request asked
  # for the rest of the context, and the note says which cap cut the continuations.
  note = own["label"].stderr
  assert "ended at their token cap (--max-tokens 1024; " in note, note
  assert "at fewer, what the text before them left of the model's 512-token context" in note


@OWN_LM
def test_a_prefix_over_the_context_is_one_line_before_anything_is_spent(own):
  root = own["root"]
  long = {"id": "long", "prompt": "Problem 3: " + "apples " * 480, "reference": "3",
          "text": "One two three four.\n\nFive six seven eight nine ten.\n\nDone.\n"}  # fmt: skip
  (root / "long.jsonl").write_text(json.dumps(long) + "\n")
  before = httpx.get(own["stats"]).json()["completions"]
  args = ["label", "--env", f"text:{root / 'long.jsonl'}", "--endpoint", own["url"], "--model",
          own["name"], "--episodes", 1, "--rollouts", 4, "--chunking", "newlines", "--out",
          root / "long", "--no-progress"]  # fmt: skip
  got = run_cli(*args)
  assert_one_line_error(got, "trace long, step 2:", "fills the model's context of 512")
  assert httpx.get(own["stats"]).json()["completions"] == before
  # Its rerun with other arguments names the one that differs.
  again = run_cli(*args, "--max-tokens", 64)
  assert_one_line_error(again, "unfinished job", "text.max_tokens: 1024 stored, 64 given")


@OWN_LM
def test_training_warns_and_eval_refuses_a_one_trace_test_split(own):
  assert "the test split holds 1 of 24 episodes" in own["train"].stderr
  tic = time.perf_counter()
  got = run_cli("eval", "--run", own["root"] / "run", "--endpoint", own["url"], "--no-progress")
  assert_one_line_error(got, "test split holds 1 episode(s)", "at least 2")
  assert time.perf_counter() - tic < 30  # refused before any relabeling


@OWN_LM
def test_score_and_serve_read_text_as_the_labels_did_and_return_the_steps(own, tmp_path):
  from starlette.testclient import TestClient

  from hindsight.model.predictor import Predictor
  from hindsight.serving.app import create_app
  from hindsight.serving.config import ServeConfig

  run = str(own["root"] / "run")
  text = "Box one holds 1. So \\boxed{6}.\n\nNo: the answer is \\boxed{5}.\n"
  trace = {"prompt": "Problem 2: boxes hold 1, 2 and 3.\n", "text": text, "reference": "6"}
  (tmp_path / "in.jsonl").write_text(json.dumps(trace) + "\n")
  got = run_cli("score", "--run", run, "--input", tmp_path / "in.jsonl", "--out",
                tmp_path / "out.jsonl", "--no-progress")  # fmt: skip
  assert got.returncode == 0, got.stderr
  row = json.loads((tmp_path / "out.jsonl").read_text())
  # Cut by the labels' rule (newlines; sentences would cut after "1. " too) and returned.
  assert chunk_text(text, "sentences") != chunk_text(text, "newlines")
  assert row["step_text"] == chunk_text(text, "newlines")
  assert len(row["step_text"]) == 2
  # The reference is checked by the labels' verifier (the first \boxed{}: correct), not by
  # the built-in `boxed` (the last: wrong).
  predictor = Predictor.load(run)
  steps = row["step_text"]
  right = predictor.score([{"steps": steps, "outcome": 1.0}])[0]["credit"]
  wrong = predictor.score([{"steps": steps, "outcome": 0.0}])[0]["credit"]
  np.testing.assert_allclose(row["predicted_credit"], right, atol=1e-6)
  assert not np.allclose(right, wrong)
  app = create_app(ServeConfig(checkpoint=run, warmup=False), predictor=predictor)
  with TestClient(app) as client:
    for _ in range(300):
      if client.get("/readyz").status_code == 200:
        break
      time.sleep(0.1)
    answer = client.post("/v1/credit", json={"trajectories": [trace]}).json()
  assert answer["steps"] == [steps]
  np.testing.assert_allclose(answer["credit"][0], right, atol=1e-6)
