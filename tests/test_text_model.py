"""The credit model on text, the small language model and its endpoint, held against the
text world's exact credit where it exists."""

from __future__ import annotations

import json
import os
import time

import httpx
import jax
import numpy as np
import pytest
from scipy import stats

from hindsight.data import open_labels
from hindsight.data.episode import Episode
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.job import LabelJob, run_label_job
from hindsight.model.encoders import TextEncoder
from hindsight.model.encoders.tokenizer import Tokenizer, bytes_tokenizer, train_bpe
from hindsight.text import world
from hindsight.text.options import TextOptions
from hindsight.text.server import running_world
from hindsight.text.trace import write_traces
from tests.conftest import run_cli

# Two groups, each on one worker with its module fixture: the credit model on text, and the
# small language model.
TEXT_MODEL = pytest.mark.xdist_group("text_model")
SMALL_LM = pytest.mark.xdist_group("small_lm")


# -- tokenizers ------------------------------------------------------------------------------


def test_tokenizers_round_trip_any_text_and_are_deterministic():
  texts = [t.prompt + t.completion() for t in world.sample_traces(3, 20)]
  bpe = train_bpe(texts, 512)
  assert bpe == train_bpe(texts, 512)  # the same texts give the same ids
  assert Tokenizer.from_json(bpe.to_json()) == bpe
  odd = ["Héllo wörld ✓ \\boxed{42}.", "tab\tand\nnewline  ", "日本語のテキスト"]
  for tok in (bpe, bytes_tokenizer()):
    for t in texts[:5] + odd:
      assert tok.decode(tok.encode(t)) == t
  # Merges learned from the world's sentences make its steps short.
  assert len(bpe.encode(texts[0])) < len(texts[0].encode()) / 3
  with pytest.raises(HindsightError, match="not valid UTF-8"):
    bpe.encode("broken \udc80 surrogate")


# -- the credit model on text ----------------------------------------------------------------


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
  """Labels of 96 text-world traces at K = 8 and a small credit model trained on them."""
  root = tmp_path_factory.mktemp("text_model")
  prompts = root / "prompts.jsonl"
  write_traces(str(prompts), world.prompt_traces(0, 96))
  with running_world() as url:
    job = LabelJob(f"text:{prompts}", 96, LabelConfig(num_rollouts=8), chunk_size=32,
                   options=TextOptions(endpoint=url, model=world.MODEL_NAME))  # fmt: skip
    labels = run_label_job(job, str(root / "labels"), progress=False)
  workdir = str(root / "model")
  got = run_cli("train", "--config", "text:smoke", "--labels", labels, "--workdir", workdir,
                "--config.train.steps=150", "--config.train.eval_every=50")  # fmt: skip
  assert got.returncode == 0, got.stderr
  return {"root": root, "labels": labels, "workdir": workdir}


@TEXT_MODEL
def test_the_checkpoint_restores_the_tokenizer_and_scores_the_trace_format(text_run):
  from hindsight.model.predictor import Predictor

  predictor = Predictor.load(text_run["workdir"])
  encoder = predictor.spec.encoder
  assert isinstance(encoder, TextEncoder) and encoder.max_step_tokens == 2 * encoder.step_tokens
  tok = Tokenizer.from_json(encoder.tokenizer)
  assert tok.kind == "bpe" and tok.vocab_size == 512
  labels = open_labels(text_run["labels"])
  ex = labels[0]
  texts = [s.decode() if isinstance(s, bytes) else s for s in ex["step_text"]]
  # The same trace as a dataset episode, as JSONL steps, as strings: the same scores.
  a = predictor.score([Episode.from_example(ex)])[0]["credit"]
  outcome = float(ex["return"])
  b = predictor.score([{"steps": [{"text": t} for t in texts], "outcome": outcome}])[0]["credit"]
  c = predictor.score([{"steps": texts, "success": outcome > 0.5}])[0]["credit"]
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(a, c)
  # A reference checked by the built-in verifier gives the same outcome as the dataset's.
  prompt = ex["prompt"].decode() if isinstance(ex["prompt"], bytes) else ex["prompt"]
  reference = str(world.parse_problem(prompt).total)
  d = predictor.score([{"steps": texts, "reference": reference}])[0]["credit"]
  np.testing.assert_array_equal(a, d)


@TEXT_MODEL
def test_a_steady_stream_of_traces_compiles_nothing_after_warmup(text_run):
  from hindsight.model.predictor import Predictor

  predictor = Predictor.load(text_run["workdir"])
  compiled = predictor.warmup()
  assert compiled == predictor.compiled_programs()
  rng = np.random.default_rng(0)
  traces = [t for t in world.sample_traces(7, 40) if len(t.steps) <= predictor.spec.max_length]
  for _ in range(6):
    pick = rng.choice(len(traces), size=rng.integers(1, 20))
    batch = [{"steps": [s.text for s in traces[i].steps], "reference": traces[i].reference}
             for i in pick]  # fmt: skip
    # Short and long steps: every token bucket up to the model's limit.
    batch.append({"steps": ["x" * int(rng.integers(1, 40))], "outcome": 1.0})
    predictor.score(batch)
  assert predictor.compiled_programs() == compiled


@TEXT_MODEL
def test_bad_text_input_is_one_line(text_run):
  from hindsight.model.predictor import Predictor

  predictor = Predictor.load(text_run["workdir"])
  limit = predictor.spec.encoder.max_step_tokens
  cases = [
    ({"steps": ["Fine. ", "   "], "outcome": 1}, "step 1 is empty"),
    ({"steps": ["word " * (4 * limit)], "outcome": 1}, f"longer than the {limit}"),
    ({"steps": ["A step. "] * 60, "outcome": 1}, "longer than the"),
    ({"steps": ["A step. "]}, "missing field 'outcome'"),
    ({"steps": ["A step. "], "outcome": 2.0}, "'outcome' must be a number in"),
    ({"steps": [3], "outcome": 1}, "must be a string"),
    ({"steps": ["ok \udc80"], "outcome": 1}, "not valid UTF-8"),
    ({"prompt": "no steps"}, "missing field 'steps'"),
  ]
  for trace, message in cases:
    with pytest.raises(HindsightError, match=message) as e:
      predictor.score([trace])
    assert "\n" not in str(e.value)


@TEXT_MODEL
def test_score_and_serve_take_text_traces(text_run, tmp_path):
  from starlette.testclient import TestClient

  from hindsight.model.predictor import Predictor
  from hindsight.serving.app import create_app
  from hindsight.serving.config import ServeConfig

  traces = [t for t in world.sample_traces(11, 8) if len(t.steps) <= 12][:3]
  path = tmp_path / "traces.jsonl"
  path.write_text("".join(
    json.dumps({"steps": [{"text": s.text} for s in t.steps], "reference": t.reference}) + "\n"
    for t in traces
  ))  # fmt: skip
  out = tmp_path / "scored.jsonl"
  got = run_cli("score", "--run", text_run["workdir"], "--input", path, "--out", out)
  assert got.returncode == 0, got.stderr
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [len(r["predicted_credit"]) for r in rows] == [len(t.steps) for t in traces]
  predictor = Predictor.load(text_run["workdir"])
  app = create_app(ServeConfig(checkpoint=text_run["workdir"], max_steps=12), predictor=predictor)
  with TestClient(app) as client:
    for _ in range(1200):  # the warm-up compiles every (rows, steps, tokens) bucket first
      if client.get("/readyz").status_code == 200:
        break
      time.sleep(0.1)
    body = {"trajectories": [{"steps": [s.text for s in t.steps], "reference": t.reference}
                             for t in traces]}  # fmt: skip
    got = client.post("/v1/credit", json=body)
    assert got.status_code == 200
    np.testing.assert_allclose(got.json()["credit"][0], rows[0]["predicted_credit"], atol=1e-6)
    bad = client.post("/v1/credit", json={"trajectories": [{"steps": ["", "x"], "outcome": 1}]})
    assert bad.status_code == 400 and "step 0 is empty" in bad.json()["error"]
    raw = b'{"trajectories": [{"steps": ["caf\xe9 "], "outcome": 1}]}'  # not UTF-8
    bad = client.post("/v1/credit", content=raw, headers={"content-type": "application/json"})
    assert bad.status_code == 400


@TEXT_MODEL
def test_the_text_eval_against_the_exact_credit(text_run):
  from hindsight.drift import DriftConfig, run_drift
  from hindsight.model.predictor import training_run
  from hindsight.text.exact import exact_labels

  # One drift report for every run: the harness, with the text plug-in's reference.
  report = run_drift(DriftConfig(checkpoint=text_run["workdir"], bootstrap=50, progress=False))
  assert report["reference"]["kind"] == "exact DP" and report["cost_unit"] == "completions"
  # The report's label row, recomputed here from the dataset and the world's DP.
  labels = open_labels(training_run(text_run["workdir"])["labels"])
  ids = training_run(text_run["workdir"])["test"]
  truth = np.concatenate([exact_labels(labels[i], "policy")["credit"] for i in ids])
  label = np.concatenate([np.asarray(labels[i]["credit"], float) for i in ids])
  rho = stats.spearmanr(label, truth).statistic
  m = report["headline"]
  assert m["training labels (MC, K=8)"]["spearman"]["value"] == pytest.approx(rho)
  # A Bayes observer of the text (the competence hidden) is closer to the truth than K = 8
  # labels, and the model trained on those labels beats them (it averages their noise).
  assert m["Bayes observer of the text"]["spearman"]["value"] > 0.9
  assert m["model (point)"]["mae"]["value"] < m["training labels (MC, K=8)"]["mae"]["value"]
  assert report["k_star"]["model (point)"]["value"] > 8
  assert report["equivalent_rollouts"]["k"] == report["k_star"]["model (point)"]
  # The learned PRM reads the text too (trained on outcomes only): a signal on every step.
  assert np.isfinite(m["learned PRM"]["spearman"]["value"])
  assert report["top_recall"]["model (point)"] > 0
  with open(os.path.join(report["out"], "report.md")) as f:
    page = f.read()
  assert "completions per step" in page and "Bayes observer of the text" in page


def test_the_observer_is_the_truth_when_the_competence_is_known():
  # At a point-mass prior the observer's credit is the exact credit of that competence.
  problem = world.problems(2, 1)[0]
  trace = world.sample_traces(2, 1)[0]
  actions = [world.parse_action(problem, s.text) for s in trace.steps]
  exact = world.exact_credit(problem, actions)["credit"]
  observer = world.observer_credit(problem, actions, grid=256)
  assert np.all(np.isfinite(observer)) and observer.shape == exact.shape
  own = world.exact_credit(problem, actions, competence=problem.competence)["credit"]
  np.testing.assert_array_equal(own, exact)


# -- the small language model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
  from hindsight.lm.config import LMTrainConfig
  from hindsight.lm.train import train_lm

  workdir = str(tmp_path_factory.mktemp("lm") / "lm")
  cfg = LMTrainConfig(traces=64, steps=30, eval_every=15, width=32, depth=1, num_heads=2,
                      batch_size=8, progress=False)  # fmt: skip
  first = train_lm(cfg, workdir)
  again = train_lm(cfg, workdir)  # finished: resumes at the end, trains nothing
  assert again["val_loss"] == pytest.approx(first["val_loss"])
  return workdir


@SMALL_LM
def test_cached_sampling_matches_the_full_forward(tiny_lm):
  import jax.numpy as jnp
  from flax import nnx

  from hindsight.lm.sample import generate, pad_prompts
  from hindsight.lm.train import load_lm

  graphdef, state, tok, _ = load_lm(tiny_lm)
  prompts = [tok.encode(p.prompt()) for p in world.problems(4, 3)]
  ids, lengths = pad_prompts(prompts, 384)
  R = ids.shape[0]
  keys = jax.random.split(jax.random.key(0), R)
  args = (ids, lengths, np.full(R, 12, np.int32), np.zeros(R, np.float32), np.ones(R, np.float32))
  out, count, _ = generate(graphdef, state, *args, keys)
  # Greedy by the uncached forward over the whole prefix (padded to one shape: causal).
  full = jax.jit(lambda x: nnx.merge(graphdef, state)(x)[0])
  for r in range(len(prompts)):
    seq = list(prompts[r])
    for i in range(int(count[r])):
      padded = np.zeros((1, 384), np.int32)
      padded[0, : len(seq)] = seq
      assert int(out[r, i]) == int(jnp.argmax(full(padded)[0, len(seq) - 1]))
      seq.append(int(out[r, i]))
  # A nucleus that keeps one token is greedy too.
  args_p = (*args[:4], np.full(R, 1e-6, np.float32))
  greedy_p, _, _ = generate(graphdef, state, *args_p[:3], np.ones(R, np.float32), args_p[4], keys)
  np.testing.assert_array_equal(np.asarray(greedy_p), np.asarray(out))


@SMALL_LM
def test_the_endpoint_honours_seeds_n_stop_and_refuses_bad_requests(tiny_lm):
  from hindsight.lm.server import running_lm

  prompt = world.problems(5, 1)[0].prompt()
  with running_lm(tiny_lm) as (url, name):
    post = lambda body: httpx.post(url + "/completions", json=body, timeout=120)  # noqa: E731
    a = post({"model": name, "prompt": prompt, "n": 4, "seed": 3, "max_tokens": 20}).json()
    b = post({"model": name, "prompt": [prompt, prompt], "n": 2, "seed": 3,
              "max_tokens": 20}).json()  # fmt: skip
    texts = [c["text"] for c in a["choices"]]
    assert len(set(texts)) > 1  # the choices draw with their own keys
    assert [c["text"] for c in b["choices"]][:2] == texts[:2]  # seed + index fix a choice
    assert all(c["finish_reason"] in ("stop", "length") for c in a["choices"])
    assert a["usage"]["completion_tokens"] <= 4 * 20
    cut = post({"model": name, "prompt": prompt, "n": 4, "seed": 3, "max_tokens": 20,
                "stop": [" "]}).json()  # fmt: skip
    for c, full in zip(cut["choices"], texts, strict=True):
      assert " " not in c["text"] and full.startswith(c["text"])
    assert post({"model": "other", "prompt": prompt}).status_code == 404
    assert post({"model": name, "prompt": prompt, "n": 0}).status_code == 400
    assert post({"model": name, "prompt": "word " * 1000}).status_code == 400
    assert post({"model": name, "prompt": ""}).status_code == 400
    assert httpx.post(url + "/completions", content=b"{").status_code == 400


@SMALL_LM
@pytest.mark.slow
def test_text_demo_smoke_runs_the_whole_path(tiny_lm, tmp_path):
  """Label the small LM's traces through its endpoint, train, and the resampled reference."""
  import shutil

  from train.text_demo import main

  work = tmp_path / "demo"
  shutil.copytree(tiny_lm, work / "lm")  # the LM stage finds its model trained
  code = main(["--workdir", str(work), "--traces", "24", "--rollouts", "4",
               "--reference-traces", "4", "--reference-rollouts", "8", "--credit-steps", "20",
               "--lm-steps", "30", "--lm-traces", "64", "--lm-width", "32", "--lm-depth", "1",
               "--max-tokens", "40", "--smoke"])  # fmt: skip
  assert code == 0
  report = json.loads((work / "model" / "drift" / "report.json").read_text())
  assert report["reference"]["kind"] == "MC relabel" and report["reference"]["completions"] > 0
  assert report["reference"]["rollouts"] == 8 and report["cost_unit"] == "completions"
  assert np.isfinite(report["headline"]["model (point)"]["mae"]["value"])


class _Offset:
  """A predictor whose credit is the wrapped one's plus a constant (a drifted model)."""

  def __init__(self, predictor, offset: float):
    self.predictor, self.offset, self.spec = predictor, offset, predictor.spec

  def score(self, episodes, **kw):
    out = self.predictor.score(episodes, **kw)
    for s in out:
      for k in ("credit", "mean", "mu"):
        s[k] = s[k] + self.offset
    return out

  def describe(self):
    return self.predictor.describe()


@TEXT_MODEL
@pytest.mark.slow
def test_the_text_audit_resamples_through_the_endpoint_in_completions(text_run, tmp_path):
  from hindsight.audit.config import AuditConfig
  from hindsight.audit.runner import audit_pool, tolerance_of
  from hindsight.model.predictor import Predictor
  from hindsight.text.audit import prepare_text_audit

  traces = [t for t in world.sample_traces(21, 40) if len(t.steps) <= 14][:16]
  path = tmp_path / "traces.jsonl"
  write_traces(str(path), traces)
  predictor = Predictor.load(text_run["workdir"])
  meta = open_labels(text_run["labels"]).metadata
  with running_world() as url:
    out = tmp_path / "audit"
    got = run_cli("audit", "--run", text_run["workdir"], "--trajectories", path,
                  "--endpoint", url, "--budget", 600, "--rollouts", 8, "--out", out,
                  "--no-progress")  # fmt: skip
    assert got.returncode == 0, got.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["budget_unit"] == "completions" and report["labels"] is None
    assert 0 < report["spent_env_steps"] <= 600 and report["draws"] > 0
    # A model whose credit is off by +0.3 everywhere is caught by the same audit.
    cfg = AuditConfig(checkpoint=text_run["workdir"], budget=1500, out=str(tmp_path / "b"),
                      trajectories=str(path), endpoint=url, rollouts=8, progress=False)  # fmt: skip
    _, _, labeler, pool = prepare_text_audit(cfg, predictor, meta, cfg.out)
    drifted = _Offset(predictor, 0.3)
    res = audit_pool(cfg, drifted, labeler, pool, tolerance_of(cfg, predictor))
    assert res.trace.first is not None
  with pytest.raises(HindsightError, match="--endpoint"):
    bare = AuditConfig(checkpoint=text_run["workdir"], budget=10, out=str(tmp_path),
                       trajectories=str(path))  # fmt: skip
    prepare_text_audit(bare, predictor, meta, str(tmp_path))
