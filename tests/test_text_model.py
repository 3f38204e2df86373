"""The credit model on text, the small language model and its endpoint, held against the
text world's exact credit where it exists."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time

import httpx
import jax
import numpy as np
import pytest
from scipy import stats

from hindsight.data import open_labels
from hindsight.data.episode import Episode
from hindsight.errors import HindsightError
from hindsight.model.encoders import TextEncoder
from hindsight.model.encoders.tokenizer import Tokenizer, bytes_tokenizer, train_bpe
from hindsight.text.trace import write_traces
from hindsight.worlds import world
from hindsight.worlds.server import running_world
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


def _refused_in_one_line(predictor, cases) -> None:
  """Each (trace, message) of `cases`: scoring it raises one line matching the message."""
  for trace, message in cases:
    with pytest.raises(HindsightError, match=message) as e:
      predictor.score([trace])
    assert "\n" not in str(e.value)


@TEXT_MODEL
def test_bad_text_input_is_one_line(text_run):
  from hindsight.model.predictor import Predictor

  predictor = Predictor.load(text_run["workdir"])
  limit = predictor.spec.encoder.max_step_tokens
  cases = [
    ({"steps": ["Fine. ", "   "], "outcome": 1}, "step 1 is empty"),
    # A trace is named by its id, not by its place in a split.
    ({"id": "q7", "steps": ["Fine. ", "\n\n"], "outcome": 1}, r"\(trace q7\): step 1 is empty"),
    ({"steps": ["word " * (4 * limit)], "outcome": 1}, f"longer than the {limit}"),
    ({"steps": ["A step. "] * 60, "outcome": 1}, "longer than the"),
    ({"steps": ["A step. "]}, "missing field 'outcome'"),
    ({"steps": ["A step. "], "outcome": 2.0}, "'outcome' must be a number in"),
    ({"steps": [3], "outcome": 1}, "must be a string"),
    ({"steps": ["ok \udc80"], "outcome": 1}, "not valid UTF-8"),
    ({"prompt": "no steps"}, "missing field 'steps'"),
  ]
  _refused_in_one_line(predictor, cases)


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
    assert bad.status_code == 400 and "step 0 is empty" in bad.json()["error"]["message"]
    raw = b'{"trajectories": [{"steps": ["caf\xe9 "], "outcome": 1}]}'  # not UTF-8
    bad = client.post("/v1/credit", content=raw, headers={"content-type": "application/json"})
    assert bad.status_code == 400


@TEXT_MODEL
def test_the_text_eval_against_the_exact_credit(text_run):
  from hindsight.drift import DriftConfig, run_drift
  from hindsight.model.predictor import training_run
  from hindsight.worlds.exact import exact_labels

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
  # Its spread is its error against the truth, fitted with the labels' sample noise taken out
  # (`loss.sample_noise`): 0.69 / 0.91 / 0.95 of the exact credits inside its 50 / 80 / 95%
  # intervals here. With the tie bound as the labels' noise they covered 0.90 / 0.95 / 0.99.
  coverage = {k: v["value"] for k, v in report["calibration"]["coverage"].items()}
  assert coverage["50%"] < 0.8 and coverage["95%"] > 0.85, coverage
  with open(os.path.join(report["out"], "report.md")) as f:
    page = f.read()
  assert "completions per step" in page and "Bayes observer of the text" in page


@pytest.fixture(scope="module")
def lm_run(text_run, tmp_path_factory):
  """A credit model on a language model's backbone (configs/text_lm.py), trained on the
  text run's labels from a tiny random Qwen2 written as a Hugging Face folder (its tokenizer
  a BPE of the labels' text): the pretrained start, as from a policy."""
  from hindsight.lm import backbone, hf
  from hindsight.lm.config import BackboneConfig

  root = tmp_path_factory.mktemp("lm_credit")
  labels = open_labels(text_run["labels"])
  texts = [t.decode() if isinstance(t, bytes) else t for i in range(len(labels))
           for t in [labels[i]["prompt"], *labels[i]["step_text"]]]  # fmt: skip
  tok = train_bpe(texts, 512)
  # A context well past twice the longest training trace's bucket (about 300 tokens here).
  cfg = BackboneConfig("qwen2", tok.vocab_size, 32, 1, 4, 2, 8, 64, max_len=2048)
  policy = hf.write_hf(backbone.build(cfg, jax.random.key(5)), cfg, tok, str(root / "policy"))
  workdir = str(root / "model")
  got = run_cli("train", "--config", "text_lm:smoke", "--labels", text_run["labels"],
                "--workdir", workdir, f"--config.data.lm={policy}", "--config.train.steps=60",
                "--config.train.eval_every=30")  # fmt: skip
  assert got.returncode == 0, got.stderr
  return {"workdir": workdir, "policy": policy, "tokenizer": tok, "stderr": got.stderr}


@TEXT_MODEL
def test_the_lm_backbone_model_restores_scores_traces_and_refuses_bad_ones(lm_run, text_run):
  from safetensors.numpy import load_file

  from hindsight.lm.credit_encoder import BackboneEncoder
  from hindsight.model.predictor import Predictor

  predictor = Predictor.load(lm_run["workdir"])
  encoder = predictor.spec.encoder
  # The checkpoint alone restores the tokenizer and the backbone's config.
  assert isinstance(encoder, BackboneEncoder) and encoder.init == "pretrained"
  assert Tokenizer.from_json(encoder.tokenizer).encode("Box 3 holds 7.").tolist() == (
    lm_run["tokenizer"].encode("Box 3 holds 7.").tolist()
  )
  assert encoder.cfg.arch == "qwen2" and encoder.cfg.width == 32
  # A pretrained backbone reads as far as its own context, not a fixed bucket, and training
  # says so.
  assert encoder.max_tokens == 2048 > 2 * encoder.sequence_tokens
  assert "reads traces of up to 2048 tokens" in lm_run["stderr"]
  # It started from the policy's weights: after 60 small steps its embedding is still the
  # policy's, not a fresh draw (which would sit at a relative distance near sqrt(2)).
  start = load_file(os.path.join(lm_run["policy"], "model.safetensors"))[
    "model.embed_tokens.weight"
  ]
  now = np.asarray(predictor.state["obs_encoder"]["backbone"]["embedder"]
                   ["input_embedding"])  # fmt: skip
  assert np.linalg.norm(now - start) / np.linalg.norm(start) < 0.5
  # The trace format, prompt included: the prompt changes what the backbone reads.
  labels = open_labels(text_run["labels"])
  ex = labels[0]
  texts = [s.decode() if isinstance(s, bytes) else s for s in ex["step_text"]]
  prompt = ex["prompt"].decode() if isinstance(ex["prompt"], bytes) else ex["prompt"]
  outcome = float(ex["return"])
  a = predictor.score([Episode.from_example(ex)])[0]["credit"]
  b = predictor.score([{"prompt": prompt, "steps": texts, "outcome": outcome}])[0]["credit"]
  np.testing.assert_allclose(a, b, atol=1e-6)
  assert a.shape == (len(texts),) and np.all(np.isfinite(a))
  other = predictor.score([{"prompt": "Something else.", "steps": texts, "outcome": outcome}])
  assert not np.allclose(other[0]["mu"], predictor.score([Episode.from_example(ex)])[0]["mu"])
  limit = encoder.max_tokens
  per_word = encoder.tokens.encode("word " * 100).size / 100
  half = "word " * int(0.6 * limit / per_word + 1)  # about 0.6 of the limit
  assert 0.5 * limit < encoder.tokens.encode(half).size < limit
  # Past twice the training bucket, inside the context: scored.
  assert encoder.tokens.encode(half).size > 2 * encoder.sequence_tokens
  far = predictor.score([{"prompt": half, "steps": texts, "outcome": outcome}])[0]["credit"]
  assert far.shape == (len(texts),) and np.all(np.isfinite(far))
  cases = [
    ({"steps": ["word " * (2 * limit)], "outcome": 1}, f"step 0 is .* longer than the {limit}"),
    ({"prompt": half, "steps": [half], "outcome": 1},
     f"the trace is .* tokens \\(prompt and steps\\), longer than the {limit}"),
    ({"steps": ["ok \udc80"], "outcome": 1}, "not valid UTF-8"),
  ]  # fmt: skip
  _refused_in_one_line(predictor, cases)


@TEXT_MODEL
def test_the_lm_backbone_scores_a_batch_alike_at_any_token_padding(lm_run, text_run):
  """Training pads each batch to its own traces' token bucket (`batching.batch_shape`), not
  the longest training trace's: the scores of a batch are the same at either width (the
  decoder is causal; a step reads nothing after its last token), and a batch of short traces
  is padded to fewer tokens."""
  from hindsight.model.batching import EpisodeReader, batch_shape, make_batch
  from hindsight.model.predictor import Predictor

  predictor = Predictor.load(lm_run["workdir"])
  spec = predictor.spec
  reader = EpisodeReader(open_labels(text_run["labels"]))
  episodes = [reader[i] for i in range(len(reader))]
  lengths = spec.encoder.trace_lengths([e.prompt for e in episodes],
                                       [list(e.step_text) for e in episodes])  # fmt: skip
  short = np.argsort(lengths)[:4]
  own = batch_shape(reader, np.append(short, -1), spec)
  assert own == spec.encoder.shape([reader[int(i)] for i in short]) < spec.encoder.sequence_tokens
  pad = max(len(reader[int(i)]) for i in short)
  narrow = make_batch(reader, short, pad, spec, own)
  wide = make_batch(reader, short, pad, spec)  # the training shape
  assert narrow["sequence"].shape[1] == own < wide["sequence"].shape[1]
  a, b = (jax.device_get(predictor._score(predictor.state, x)) for x in (narrow, wide))
  mask = narrow["mask"]
  np.testing.assert_allclose(a["mu"][mask], b["mu"][mask], rtol=1e-5, atol=1e-6)
  # model.compute_dtype reaches the backbone through the credit model (its Tunix layers
  # compute in it); the float32 default leaves it float32.
  from flax import nnx

  from hindsight.model.credit_model import CreditModel, ModelConfig

  for name, dtype in (("bfloat16", jax.numpy.bfloat16), ("", jax.numpy.float32)):
    cfg = ModelConfig(width=16, depth=1, num_heads=2, compute_dtype=name)
    model = nnx.eval_shape(lambda cfg=cfg: CreditModel(cfg, spec, rngs=nnx.Rngs(0)))
    assert model.obs_encoder.backbone.embedder.dtype == dtype


def test_a_bf16_backbone_computes_in_bf16_from_float32_weights():
  """`StepStates` at dtype bfloat16: weights stay float32 (what the optimizer updates), the
  states are within bfloat16's rounding of float32's and not equal to them (it computed in
  bfloat16), and the forward's q/k/v biases do not promote it back to float32."""
  import jax.numpy as jnp
  from flax import nnx

  from hindsight.lm.backbone import StepStates
  from hindsight.lm.config import BackboneConfig

  cfg = BackboneConfig("qwen2", 97, 32, 2, 4, 2, 8, 64, max_len=64)
  f32 = StepStates(cfg, 16, rngs=nnx.Rngs(0))
  bf16 = StepStates(cfg, 16, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
  assert {x.dtype for x in jax.tree.leaves(nnx.state(bf16, nnx.Param))} == {jnp.dtype("float32")}
  nnx.update(bf16, nnx.state(f32, nnx.Param))
  tokens = jax.random.randint(jax.random.key(1), (3, 40), 0, 97)
  batch = {"sequence": tokens, "step_end": jnp.array([[5, 20, 39]] * 3)}
  a, b = np.asarray(f32(batch)), np.asarray(bf16(batch))
  assert b.dtype == np.float32
  error = np.abs(a - b).max() / np.abs(a).max()
  assert 1e-4 < error < 5e-2, error
  jaxpr = str(jax.make_jaxpr(lambda x: bf16(x))(batch))
  # Tunix's Llama 3 has no compute dtype: refused in one line, not computed in float32.
  llama = dataclasses.replace(cfg, arch="llama3")
  with pytest.raises(HindsightError, match="Llama 3 computes in float32 only"):
    StepStates(llama, 16, rngs=nnx.Rngs(0), dtype=jnp.bfloat16)
  # q k^T in bfloat16: q and k stay so after their float32 biases.
  assert re.search(r"bf16\[3,2,40,40,2\] = dot_general", jaxpr)


@TEXT_MODEL
def test_the_eval_sets_the_lm_backbone_beside_the_step_encoder(lm_run, text_run):
  from hindsight.drift import DriftConfig, run_drift
  from hindsight.model.predictor import Predictor, training_run
  from hindsight.worlds.exact import exact_labels

  report = run_drift(DriftConfig(checkpoint=lm_run["workdir"], versus=text_run["workdir"],
                                 bootstrap=50, baseline_steps=0, progress=False))  # fmt: skip
  assert report["versus"]["run"] == os.path.abspath(text_run["workdir"])
  # The other model's row is the step encoder's scores on the same test split, against the
  # same exact reference: recomputed here from its own predictor.
  labels = open_labels(training_run(lm_run["workdir"])["labels"])
  ids = training_run(lm_run["workdir"])["test"]
  assert list(ids) == list(training_run(text_run["workdir"])["test"])  # one split, one seed
  truth = np.concatenate([exact_labels(labels[i], "policy")["credit"] for i in ids])
  other = Predictor.load(text_run["workdir"])
  scores = np.concatenate(
    [s["credit"] for s in other.score([Episode.from_example(labels[i]) for i in ids])]
  )
  rho = stats.spearmanr(scores, truth).statistic
  assert report["headline"]["other model (point)"]["spearman"]["value"] == pytest.approx(rho)
  assert "other model (point)" in report["k_star"] and "model (point)" in report["k_star"]


@TEXT_MODEL
@pytest.mark.slow
def test_the_lm_backbone_trains_sharded_over_fsdp_and_tp_and_in_bf16_as_on_one_device(
  lm_run, text_run, tmp_path, monkeypatch
):
  """8 fake devices as data 2 x fsdp 2 x tp 2 (the backbone's heads and MLP split over tp as
  Tunix annotates them, the batch over data x fsdp) against 1 device: the same loss curve
  within float32 reordering (see test_train's sharded test); the backbone computing in
  bfloat16 (`model.compute_dtype`): within bfloat16's. Each batch is padded to its own token
  bucket."""
  from jax.sharding import PartitionSpec as P

  from hindsight import training
  from hindsight.config_io import load_config
  from hindsight.model.predictor import Predictor
  from hindsight.model.programs import train_programs
  from hindsight.model.sharding import make_mesh
  from hindsight.training import read_metrics, train_and_evaluate

  widths = []  # (the shape training asked for, the batch's width, its traces' own bucket)

  def recorded(reader, ids, pad, spec, shape=None):
    batch = make_batch(reader, ids, pad, spec, shape)
    own = spec.encoder.shape([reader[int(i)] for i in ids if i >= 0])
    widths.append((shape, batch["sequence"].shape[1], own))
    return batch

  make_batch = training.make_batch
  monkeypatch.setattr(training, "make_batch", recorded)
  curves = {}
  runs = {"one": ["mesh.devices=1"], "sharded": ["mesh.data=2", "mesh.fsdp=2", "mesh.tp=2"],
          "bf16": ["mesh.devices=1", "model.compute_dtype=bfloat16"]}  # fmt: skip
  for name, extra in runs.items():
    config = load_config("text_lm:smoke", [
      f"data.labels_dir={text_run['labels']}", f"data.lm={lm_run['policy']}", "train.steps=6",
      "train.log_every=1", "train.eval_every=6", "data.num_buckets=1", "optim.warmup_steps=1",
      *extra,
    ])  # fmt: skip
    train_and_evaluate(config, str(tmp_path / name))
    curves[name] = np.array([r["loss"] for r in read_metrics(str(tmp_path / name))])
  assert curves["one"].size == 6
  np.testing.assert_allclose(curves["sharded"], curves["one"], rtol=1e-5)
  # The backbone in bfloat16: the same curve within bfloat16's rounding; its scores differ
  # from float32's by about that rounding (it did compute in bfloat16).
  np.testing.assert_allclose(curves["bf16"], curves["one"], rtol=2e-2)
  episodes = [Episode.from_example(ex) for ex in open_labels(text_run["labels"])][:8]
  mu = {name: np.concatenate([x["mu"] for x in Predictor.load(str(tmp_path / name))
                              .score(episodes)]) for name in ("one", "bf16")}  # fmt: skip
  error = np.abs(mu["bf16"] - mu["one"]).max() / np.abs(mu["one"]).max()
  assert 1e-4 < error < 5e-2, error
  # Training asks for every batch at its own traces' token bucket (None would pad it to the
  # longest training trace's), and gets it.
  assert len(widths) >= 18 and all(shape == width == own for shape, width, own in widths)
  # The backbone's parameters are split as Tunix names them: q over (fsdp, tp), the MLP's
  # hidden over tp.
  spec = Predictor.load(str(tmp_path / "one")).spec
  programs = train_programs(config, spec, make_mesh(2, 2, jax.devices()[:8], tp=2))
  backbone = programs.abstract_state["model"]["obs_encoder"]["backbone"]
  assert backbone["layers"][0]["attn"]["q_proj"]["w"].sharding.spec == P("fsdp", "tp", None)
  assert backbone["layers"][0]["mlp"]["up_proj"]["kernel"].sharding.spec == P("fsdp", "tp")


def test_the_observer_is_the_truth_when_the_competence_is_known():
  # At a point-mass prior the observer's credit is the exact credit of that competence.
  problem = world.problems(2, 1)[0]
  trace = world.sample_traces(2, 1)[0]
  actions = [world.parse_action(problem, s.text) for s in trace.steps]
  exact = world.exact_credit(problem, actions)["credit"]
  own = world.exact_credit(problem, actions, competence=problem.competence)["credit"]
  np.testing.assert_array_equal(own, exact)
  # Reading the text narrows the competence: over 80 traces the observer's squared error to
  # the exact credit is well below a flat prior's (the credit averaged over the competence
  # grid, the text unread): 0.270 against 0.492 at this seed. Uniform posterior weights
  # would be the flat prior itself.
  grid = 32
  cs = (np.arange(grid) + 0.5) / grid
  observer_err, flat_err = 0.0, 0.0
  for p, tr in zip(world.problems(3, 80), world.sample_traces(3, 80), strict=True):
    acts = [world.parse_action(p, s.text) for s in tr.steps]
    exact = world.exact_credit(p, acts)["credit"]
    observer = world.observer_credit(p, acts, grid=grid)
    flat = np.mean([world.exact_credit(p, acts, competence=float(c))["credit"] for c in cs], 0)
    ok = np.isfinite(exact)
    observer_err += float(np.sum((observer - exact)[ok] ** 2))
    flat_err += float(np.sum((flat - exact)[ok] ** 2))
  assert observer_err < 0.7 * flat_err, (observer_err, flat_err)


# -- the small language model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
  from hindsight.lm.config import LMTrainConfig
  from hindsight.lm.train import train_lm

  workdir = str(tmp_path_factory.mktemp("lm") / "lm")
  cfg = LMTrainConfig(traces=64, steps=30, eval_every=15, width=32, depth=1, batch_size=8,
                      progress=False)  # fmt: skip
  first = train_lm(cfg, workdir)
  again = train_lm(cfg, workdir)  # finished: resumes at the end, trains nothing
  assert again["val_loss"] == pytest.approx(first["val_loss"])
  # It learned: the held-out loss is far below the uniform guess's log V.
  assert first["val_loss"] < 0.8 * np.log(512)
  return workdir


def test_the_language_model_is_trained_on_exactly_the_completion_and_its_eos():
  from hindsight.lm.config import LMTrainConfig
  from hindsight.lm.train import training_sequences

  cfg = LMTrainConfig(traces=6, max_len=384)
  tok, ids, mask, held = training_sequences(cfg)
  traces = world.sample_traces(cfg.seed, cfg.traces, cfg.counts)
  for i, t in enumerate(traces):
    prompt = tok.encode(t.prompt)
    # Position j predicts ids[j + 1]: the masked positions' targets are the completion and EOS.
    targets = ids[i, 1:][mask[i, :-1] > 0]
    np.testing.assert_array_equal(targets, [*tok.encode(t.completion()), 1])
    np.testing.assert_array_equal(ids[i, : prompt.size], prompt)
    assert mask[i, prompt.size - 2] == 0 and mask[i, prompt.size - 1] == 1
  assert held.sum() == 1


@SMALL_LM
def test_cached_sampling_matches_the_full_forward(tiny_lm):
  import jax.numpy as jnp

  from hindsight.lm.backbone import forward
  from hindsight.lm.sample import pad_prompts, sampler
  from hindsight.lm.train import load_lm

  lm = load_lm(tiny_lm)
  prompts = [lm.tokenizer.encode(p.prompt()) for p in world.problems(4, 3)]
  ids, lengths = pad_prompts(prompts, 384)
  R = ids.shape[0]
  keys = jax.random.split(jax.random.key(0), R)
  args = (ids, lengths, np.full(R, 12, np.int32), np.zeros(R, np.float32), np.ones(R, np.float32))
  generate = sampler(lm.graphdef, lm.cfg)
  out, count, _ = generate(lm.state, *args, keys)
  # Greedy by the uncached forward over the whole prefix (padded to one shape: causal).
  full = jax.jit(lambda x: forward(lm.model, lm.cfg, x)[0])
  for r in range(len(prompts)):
    seq = list(prompts[r])
    for i in range(int(count[r])):
      padded = np.zeros((1, 384), np.int32)
      padded[0, : len(seq)] = seq
      assert int(out[r, i]) == int(jnp.argmax(full(padded)[0, len(seq) - 1]))
      seq.append(int(out[r, i]))
  # A nucleus that keeps one token is greedy too.
  greedy_p, _, _ = generate(lm.state, *args[:3], np.ones(R, np.float32),
                            np.full(R, 1e-6, np.float32), keys)  # fmt: skip
  np.testing.assert_array_equal(np.asarray(greedy_p), np.asarray(out))


def _sampled(lm, prompt: str, seed: int, n: int, max_tokens: int):
  """What the endpoint must answer for (prompt, seed, n choices): the in-process sampler's
  draws with the server's keys, (text, ended by EOS) each."""
  from hindsight.lm.engine import SlotEngine
  from hindsight.lm.sample import pad_prompts, sampler

  ids, lengths = pad_prompts([lm.tokenizer.encode(prompt)] * n, lm.cfg.max_len)
  R = ids.shape[0]
  key = jax.random.key(seed)
  keys = jax.numpy.stack([jax.random.fold_in(key, min(j, n - 1)) for j in range(R)])
  bias = SlotEngine(lm, slots=1).bias
  out, count, eos = sampler(lm.graphdef, lm.cfg)(
    lm.state, ids, lengths, np.full(R, max_tokens, np.int32), np.ones(R, np.float32),
    np.ones(R, np.float32), keys, bias,
  )  # fmt: skip
  return [(lm.tokenizer.decode(out[j, : int(count[j]) - int(eos[j])]), bool(eos[j]))
          for j in range(n)]  # fmt: skip


@SMALL_LM
def test_the_endpoint_honours_seeds_n_stop_and_refuses_bad_requests(tiny_lm):
  from hindsight.lm.server import running_lm
  from hindsight.lm.train import load_lm

  prompt = world.problems(5, 1)[0].prompt()
  expected = _sampled(load_lm(tiny_lm), prompt, 3, 4, 20)
  with running_lm(tiny_lm) as (url, name):
    post = lambda body: httpx.post(url + "/completions", json=body, timeout=120)  # noqa: E731
    a = post({"model": name, "prompt": prompt, "n": 4, "seed": 3, "max_tokens": 20}).json()
    b = post({"model": name, "prompt": [prompt, prompt], "n": 2, "seed": 3,
              "max_tokens": 20}).json()  # fmt: skip
    texts = [c["text"] for c in a["choices"]]
    assert len(set(texts)) > 1  # the choices draw with their own keys
    assert [c["text"] for c in b["choices"]][:2] == texts[:2]  # seed + index fix a choice
    # Each choice is the in-process sampler's draw with its key, and ends as it did: "stop"
    # at EOS, "length" at the token budget.
    assert texts == [t for t, _ in expected]
    assert [c["finish_reason"] for c in a["choices"]] == [
      "stop" if eos else "length" for _, eos in expected
    ]
    assert a["usage"]["completion_tokens"] <= 4 * 20
    cut = post({"model": name, "prompt": prompt, "n": 4, "seed": 3, "max_tokens": 20,
                "stop": [" "]}).json()  # fmt: skip
    for c, (full, eos) in zip(cut["choices"], expected, strict=True):
      # Cut exactly before the first stop string, and then it is a "stop".
      assert c["text"] == full.split(" ")[0]
      assert c["finish_reason"] == ("stop" if (" " in full or eos) else "length")
    assert any(" " in full for full, _ in expected)  # the stop was met at least once
    assert post({"model": "other", "prompt": prompt}).status_code == 404
    assert post({"model": name, "prompt": prompt, "n": 0}).status_code == 400
    assert post({"model": name, "prompt": "word " * 1000}).status_code == 400
    assert post({"model": name, "prompt": ""}).status_code == 400
    assert httpx.post(url + "/completions", content=b"{").status_code == 400


@SMALL_LM
def test_the_server_batches_continuously_within_its_slots(tiny_lm):
  import concurrent.futures

  from hindsight.lm.server import running_lm
  from hindsight.lm.train import load_lm

  prompts = [p.prompt() for p in world.problems(6, 3)]
  expected = {(i, s): _sampled(load_lm(tiny_lm), prompts[i], s, 3, 24)
              for i in range(3) for s in (1, 2)}  # fmt: skip
  with running_lm(tiny_lm, max_batch=2) as (url, name):

    def ask(key):
      i, seed = key
      body = {"model": name, "prompt": prompts[i], "n": 3, "seed": seed, "max_tokens": 24}
      return key, httpx.post(url + "/completions", json=body, timeout=120).json()

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
      answers = dict(pool.map(ask, expected))
    stats = httpx.get(url.removesuffix("/v1") + "/stats").json()
  # 18 choices went through 2 slots: never more live at once, and each choice is the one
  # its key draws whatever it shared a call with.
  assert stats["max_live"] == 2 and stats["completions"] == 18
  # Rows were admitted as slots freed, not all at once (a prompt a slot holds is forked),
  # and each of the 18 choices started once: its prompt prefilled or reused, never both.
  assert stats["prefills"] + stats["forks"] >= 9
  tok = load_lm(tiny_lm).tokenizer
  started = sum(3 * tok.encode(prompts[i], start=True).size for i, _ in expected)
  assert stats["prefill_tokens"] + stats["reused_tokens"] == started
  assert stats["reused_tokens"] > 0
  for key, answer in answers.items():
    assert [c["text"] for c in answer["choices"]] == [t for t, _ in expected[key]]


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
               "--max-tokens", "40", "--backbone-steps", "20", "--smoke"])  # fmt: skip
  assert code == 0
  report = json.loads((work / "model" / "drift" / "report.json").read_text())
  assert report["reference"]["kind"] == "MC relabel" and report["reference"]["completions"] > 0
  assert report["reference"]["rollouts"] == 8 and report["cost_unit"] == "completions"
  assert np.isfinite(report["headline"]["model (point)"]["mae"]["value"])
  # The LM-backbone model, from the small LM's weights, on the same traces and reference
  # (no completion spent on a second reference), the step encoder's model beside it.
  lm_report = json.loads((work / "lm_model" / "drift" / "report.json").read_text())
  assert lm_report["reference"]["completions"] == report["reference"]["completions"]
  assert lm_report["versus"]["run"] == str(work / "model")
  other = lm_report["headline"]["other model (point)"]["mae"]["value"]
  assert other == pytest.approx(report["headline"]["model (point)"]["mae"]["value"])


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


def test_an_annotated_axis_the_mesh_does_not_divide_falls_back_to_replicated():
  """Qwen2.5-0.5B's 2 KV heads over tp = 4: the key projection's head axis cannot be cut 4
  ways, so that axis is replicated while its other annotated axes keep their cut; an axis
  the mesh divides keeps `tp`; and the arrays are placed on those shardings."""
  import jax.numpy as jnp
  from jax.sharding import PartitionSpec as P

  from hindsight.model.sharding import make_mesh, state_shardings

  mesh = make_mesh(1, 2, tp=4)  # the suite's 8 CPU devices: fsdp 2 x tp 4
  shapes = {
    "k_proj": jax.ShapeDtypeStruct((64, 2, 16), jnp.float32),  # [embed, kv heads, dim]
    "q_proj": jax.ShapeDtypeStruct((64, 8, 16), jnp.float32),  # 8 heads: 4 divides
    "odd": jax.ShapeDtypeStruct((63, 8), jnp.float32),
  }  # fsdp 2 does not divide 63
  specs = {"k_proj": P("fsdp", "tp", None), "q_proj": P("fsdp", "tp", None),
           "odd": P("fsdp", "tp")}  # fmt: skip
  got = state_shardings(shapes, mesh, specs=specs)
  assert got["k_proj"].spec == P("fsdp", None, None)
  assert got["q_proj"].spec == P("fsdp", "tp", None)
  assert got["odd"].spec == P(None, "tp")
  for name, shape in shapes.items():
    placed = jax.device_put(jnp.zeros(shape.shape, shape.dtype), got[name])
    assert placed.sharding == got[name]


@TEXT_MODEL
def test_an_audit_of_labels_whose_trace_file_is_gone_is_refused(text_run, monkeypatch):
  """The audit's traces carry the trace file's references; without the file each would be
  missing and every verified outcome 0, so the audit refuses in one line."""
  from hindsight.errors import HindsightError
  from hindsight.text import audit, evaluate

  traces = audit._traces_from_dataset(text_run["labels"], 4)
  assert len(traces) == 4 and all(t.reference for t in traces)
  monkeypatch.setattr(evaluate, "trace_file", lambda recorded, labels_dir: None)
  with pytest.raises(HindsightError, match=r"trace file .* is not found"):
    audit._traces_from_dataset(text_run["labels"], 4)
