"""GRPO of a language model on per-step credit (`hindsight rl --config rl_text`): the
per-token advantage, one update's direction, the experiment's files, resuming, and the trained
policy reloaded and sampled by a loop of this file's own."""

from __future__ import annotations

import collections
import json
import os
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from hindsight.config_io import load_config
from hindsight.model.encoders.tokenizer import bytes_tokenizer, train_bpe
from hindsight.text.trace import chunk_text
from hindsight.worlds import world
from tests.conftest import assert_one_line_error, page_module, run_cli

# One worker holds the small policy LM and the experiment trained from it.
pytestmark = pytest.mark.xdist_group("rl_text")
SOURCES = ("outcome", "mc_credit", "pp_credit", "prm", "shaped")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
  """The smoke config's policy LM (`rl_text:smoke`'s lm_train), trained once."""
  from hindsight.lm.rl.trainer import policy_lm

  out = str(tmp_path_factory.mktemp("rl_text_lm"))
  return policy_lm(load_config("rl_text:smoke"), out)


@pytest.fixture(scope="module")
def experiment(policy, tmp_path_factory):
  """Every source on the smoke config, through the CLI (in process), measured at updates 0
  and 2."""
  out = tmp_path_factory.mktemp("rl_text") / "exp"
  proc = run_cli("rl", "--config", "rl_text:smoke", "--sources", ",".join(SOURCES),
                 "--workdir", out, f"--config.lm={policy}", "--config.eval.every=2")  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  return str(out)


@pytest.fixture(scope="module")
def often_right(policy, tmp_path_factory):
  """`outcome` on the smoke config with an outcome the smoke LM reaches about 70% of the
  time (`tests.text_verifiers:four_steps`), measured on 128 prompts: a run whose success is
  far from 0 and 1."""
  out = tmp_path_factory.mktemp("rl_text_often") / "run"
  proc = run_cli("rl", "--config", "rl_text:smoke", "--workdir", out, f"--config.lm={policy}",
                 "--config.verifier=tests.text_verifiers:four_steps", "--config.eval.every=2",
                 "--config.eval.prompts=128")  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  return str(out)


# -- the per-token advantage -----------------------------------------------------------------


def test_each_steps_signal_lands_on_exactly_its_tokens():
  from hindsight.lm.rl.grpo import token_advantages
  from hindsight.lm.rl.rollout import split_steps

  steps = ["Reading the first label, box one holds 2. ", "Let me double-check. ",
           "So the answer is \\boxed{6}."]  # fmt: skip
  text = "".join(steps)
  # Bytes: one token per character, so the split is read off the characters by hand.
  tok = bytes_tokenizer()
  ids = np.concatenate([tok.encode(text), [1]])  # EOS
  got_text, got_steps, token_step = split_steps(tok, ids, (1,))
  assert got_text == text and got_steps == steps
  by_hand = np.concatenate([np.full(len(s), i) for i, s in enumerate(steps)] + [[2]])
  np.testing.assert_array_equal(token_step, by_hand)
  signal = np.array([0.5, -1.0, 2.0], np.float32)
  np.testing.assert_array_equal(token_advantages(signal, token_step), signal[by_hand])
  # BPE: a word's leading space is one token with the word (" Let", " So"), so by hand the
  # tokens of step s are those of its text with the space moved from its end to the next
  # step's start.
  bpe = train_bpe([t.completion() for t in world.sample_traces(0, 200)] + [text], 512)
  assert len(bpe.encode(" Let")) == len(bpe.encode(" So")) == 1
  ids = np.concatenate([bpe.encode(text), [1]])
  pieces = [steps[0].rstrip(), " " + steps[1].strip(), " " + steps[2].strip()]
  by_hand = [bpe.encode(p) for p in pieces]
  np.testing.assert_array_equal(ids[:-1], np.concatenate(by_hand))
  _, got_steps, token_step = split_steps(bpe, ids, (1,))
  assert got_steps == steps
  expected = np.concatenate([np.full(len(x), i) for i, x in enumerate(by_hand)] + [[2]])
  np.testing.assert_array_equal(token_step, expected)
  np.testing.assert_array_equal(token_advantages(signal, token_step), signal[expected])


def test_a_character_cut_across_tokens_belongs_to_its_step():
  """Multi-byte characters ("×", "≥", CJK) at and near step boundaries, under one token per
  byte and under a Hugging Face byte-level BPE (whose tokens can hold part of a character):
  every token belongs to the step holding the character its last byte is part of, read by
  hand off byte positions and the tokenizer's own character offsets."""
  from hindsight.lm.rl.rollout import split_steps
  from hindsight.model.encoders.tokenizer import Tokenizer

  steps = ["Box one holds 2×3 apples. ", "≥ 5 boxes hold 答案. ", "So 答 is \\boxed{6}."]
  text = "".join(steps)
  step_of_char = np.concatenate([np.full(len(s), i) for i, s in enumerate(steps)])
  tok = bytes_tokenizer()
  ids = np.concatenate([tok.encode(text), [1]])
  got_text, got_steps, token_step = split_steps(tok, ids, (1,))
  assert got_text == text and got_steps == steps
  char_of_byte = np.concatenate([np.full(len(c.encode()), i) for i, c in enumerate(text)])
  np.testing.assert_array_equal(token_step, [*step_of_char[char_of_byte], 2])
  bpe = train_bpe([t.completion() for t in world.sample_traces(0, 200)], 512)
  hf = Tokenizer("hf", bpe.bpe_json)  # as `hf.read_tokenizer` reads a tokenizer.json
  encoding = hf._bpe.encode(text, add_special_tokens=False)
  assert len(encoding.ids) > len(text.encode()) // 4  # some characters are several tokens
  ids = np.asarray([*encoding.ids, 1], np.int32)
  got_text, got_steps, token_step = split_steps(hf, ids, (1,))
  assert got_text == text and got_steps == steps
  by_hand = [step_of_char[end - 1] for _, end in encoding.offsets]
  np.testing.assert_array_equal(token_step, [*by_hand, 2])


# -- one update ------------------------------------------------------------------------------

KL_BETA, KL_UPDATES = 1.0, 6  # a weight that shows within a few updates of one batch


class _Stub:
  """A source whose signal is +1 on step `k` of every trace, 0 elsewhere (or 0 everywhere)."""

  name, learned, standardised = "stub", False, False

  def __init__(self, k):
    self.k = k

  def signal(self, state, rollouts, key):
    from hindsight.lm.rl.credit import Spend
    from hindsight.lm.rl.sources import Signal

    steps = [np.zeros(c.num_steps, np.float32) for c in rollouts.completions]
    if self.k is not None:
      for s in steps:
        s[min(self.k, len(s) - 1)] = 1.0
    return Signal(steps, Spend())


def _token_logps(lm, state, batch) -> np.ndarray:
  """log pi(token) of every completion token of a Tunix batch under `state` [B, C]."""
  from tunix.rl import common

  return np.asarray(common.compute_per_token_logps(
    lm.graphdef, state, jnp.asarray(batch["prompt_ids"]), jnp.asarray(batch["completion_ids"]),
    pad_id=lm.cfg.pad_id, eos_id=lm.cfg.eos_ids[0],
  ))  # fmt: skip


def _step_logps(ctx, state, ro, batch, k) -> float:
  """Sum over the batch of the log-probability of step k's tokens under `state`."""
  logps = _token_logps(ctx.lm, state, batch)
  total = 0.0
  for i, c in enumerate(ro.completions):
    total += logps[i, : len(c.ids)][c.token_step == min(k, c.num_steps - 1)].sum()
  return total


def _fixed_learner(lm, grpo, batch):
  """Tunix's GRPO learner on a cluster of `lm` (`rl.tunix_learner`) whose every update takes
  `batch` (a Tunix layout of `update_batch`)."""
  from hindsight.lm.rl.tunix_learner import Batch, CreditGRPOLearner, algo_config, make_cluster

  return CreditGRPOLearner(make_cluster(lm, grpo), algo_config(grpo),
                           lambda *_: Batch(batch))  # fmt: skip


def _params(learner):
  return learner.parts()["model"]


def test_a_stub_source_raises_its_steps_log_probability_and_a_zero_source_moves_nothing(
  policy, tmp_path
):
  from hindsight.lm.rl.context import Context
  from hindsight.lm.rl.trainer import update_batch
  from hindsight.lm.train import load_lm

  config = load_config("rl_text:smoke", [f"lm={policy}", "grpo.prompts=4", "grpo.group=4"])
  lm = load_lm(policy)
  ctx = Context(config, lm, str(tmp_path))
  key = jax.random.key(3)
  ro, _, batch = update_batch(ctx, _Stub(1), lm.state, key, 0, 0)
  assert sum(len(c.ids) for c in ro.completions) == batch["completion_mask"].sum()
  learner = _fixed_learner(lm, config.grpo, batch)
  before = _step_logps(ctx, lm.state, ro, batch, 1)
  got, aux = learner.train_step({"update": 0})
  assert got.arrays is batch and set(aux) >= {"loss", "kl", "pg_loss", "entropy"}
  after = _step_logps(ctx, _params(learner), ro, batch, 1)
  assert after > before + 1e-3, (before, after)
  # The rollout worker samples the updated policy (it shares the actor's module).
  for a, b in zip(jax.tree.leaves(nnx.to_pure_dict(learner.rollout.state)),
                  jax.tree.leaves(nnx.to_pure_dict(_params(learner))), strict=True):  # fmt: skip
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The same batch, signal 0 everywhere, the KL term off (its k3 estimator's gradient at the
  # starting policy is 0 only up to the rounding of two forwards, which Adam scales up; the
  # loss has no entropy term): not one weight moves.
  _, _, zero = update_batch(ctx, _Stub(None), lm.state, key, 0, 0)
  assert not np.any(zero["advantages"])
  config.grpo.beta = 0.0
  plain = _fixed_learner(lm, config.grpo, zero)
  plain.train_step({"update": 0})
  for a, b in zip(jax.tree.leaves(nnx.to_pure_dict(_params(plain))),
                  jax.tree.leaves(nnx.to_pure_dict(lm.state)), strict=True):  # fmt: skip
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_clusters_rollout_worker_answers_tunixs_text_api(policy):
  """`RLCluster.generate` (Tunix's text API) through the slot-engine worker: each prompt
  string encoded with its BOS, completed as the token-level `complete` completes it with
  the same keys (split(seed)), decoded without the EOS; unseeded calls draw afresh."""
  import dataclasses

  from hindsight.lm.rl.tunix_learner import make_cluster
  from hindsight.lm.train import load_lm

  config = load_config("rl_text:smoke", [f"lm={policy}"])
  lm = load_lm(policy)
  cluster = make_cluster(lm, config.grpo)
  worker = cluster.rollout
  texts = [p.prompt() for p in world.problems(3, 3, tuple(lm.record["counts"]))]
  seeded = dataclasses.replace(cluster.cluster_config.rollout_config, seed=jax.random.key(5))
  out = worker.generate(texts, seeded)
  ids = [lm.tokenizer.encode(t, start=True) for t in texts]
  want = worker.complete(worker.state, ids, [int(config.grpo.max_tokens)] * 3,
                         jax.random.split(jax.random.key(5), 3))  # fmt: skip
  for got, w, text in zip(out.tokens, want, out.text, strict=True):
    np.testing.assert_array_equal(got, w)
    assert text == lm.tokenizer.decode([t for t in w if t not in lm.cfg.eos_ids])
  width = out.left_padded_prompt_tokens.shape[1]
  for row, p in zip(out.left_padded_prompt_tokens, ids, strict=True):
    np.testing.assert_array_equal(row[width - len(p) :], p)
  first, second = (cluster.generate(texts).tokens for _ in range(2))
  assert any(not np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def test_the_kl_term_holds_the_policy_near_the_starting_one(policy, tmp_path):
  """Tunix's k3 KL to the starting policy (the cluster's reference role), weighted by
  grpo.beta: its gradient is 0 at the start, so the test runs several updates of one batch.
  With beta > 0 the policy ends nearer the start (mean |log pi - log pi_0| over the batch's
  tokens) than with beta = 0 on the same advantages, and the KL the loss reports grows from 0;
  a reference that moved with the policy (or beta forced to 0) would leave the two runs
  equal."""
  from hindsight.lm.rl.context import Context
  from hindsight.lm.rl.trainer import update_batch
  from hindsight.lm.train import load_lm

  config = load_config("rl_text:smoke", [f"lm={policy}", "grpo.prompts=4", "grpo.group=4"])
  lm = load_lm(policy)
  ctx = Context(config, lm, str(tmp_path))
  _, _, batch = update_batch(ctx, _Stub(1), lm.state, jax.random.key(3), 0, 0)
  mask = batch["completion_mask"] > 0
  start = _token_logps(lm, lm.state, batch)[mask]
  moved, kls = {}, {}
  for beta in (0.0, KL_BETA):
    config.grpo.beta = beta
    learner, kls[beta] = _fixed_learner(lm, config.grpo, batch), []
    for u in range(KL_UPDATES):
      kls[beta].append(learner.train_step({"update": u})[1]["kl"])
    moved[beta] = float(np.mean(np.abs(_token_logps(lm, _params(learner), batch)[mask] - start)))
  assert moved[0.0] > 0.01, moved  # the signal moves the policy
  assert moved[KL_BETA] < 0.8 * moved[0.0], moved
  assert kls[KL_BETA][0] == pytest.approx(0.0, abs=1e-5) and kls[KL_BETA][-1] > 1e-4, kls


def test_the_fitted_models_are_refit_for_another_lm_in_the_same_directory(policy, tmp_path):
  """The setup's models cache is keyed by the LM's weights, not its name: the same LM reads
  its fit back, another LM of the same name (its weights moved) in the same directory is fit
  anew, on its own hidden states."""
  import dataclasses

  from hindsight.lm.rl.context import Context
  from hindsight.lm.train import load_lm

  config = load_config("rl_text:smoke", [f"lm={policy}"])
  lm = load_lm(policy)
  first = Context(config, lm, str(tmp_path)).models()
  again = Context(config, lm, str(tmp_path)).models()
  assert again.stats == first.stats  # read back: the same fit, its timing included
  scaled = jax.tree.map(
    lambda x: x * 1.05 if jnp.issubdtype(x.dtype, jnp.floating) else x, lm.state
  )
  moved = dataclasses.replace(lm, state=scaled)
  assert moved.name == lm.name
  other = Context(config, moved, str(tmp_path))
  refit = other.models()
  prm_a, prm_b = (jax.tree.leaves(m.prm.params) for m in (first, refit))
  assert any(not np.array_equal(np.asarray(a), np.asarray(b))
             for a, b in zip(prm_a, prm_b, strict=True))  # fmt: skip
  with open(os.path.join(tmp_path, "models.pkl"), "rb") as f:
    assert pickle.load(f)["fields"] == other.models_key()


# -- the experiment --------------------------------------------------------------------------


def test_the_experiment_writes_its_table_plots_and_every_sources_cost(experiment):
  with open(os.path.join(experiment, "results.json")) as f:
    results = json.load(f)
  with open(os.path.join(experiment, "table.md")) as f:
    table = f.read()
  for name in ("curves.png", "budget.png"):
    assert os.path.getsize(os.path.join(experiment, name)) > 10_000
  runs = results["sources"]
  assert set(runs) == set(SOURCES)
  for name in SOURCES:
    assert f"| {name} |" in table
    curve = runs[name]["curve"]
    assert [p["update"] for p in curve] == [0, 2]
    # Seed i of every source draws the same prompts: the same start at update 0.
    for s, o in zip(curve[0]["seeds"], runs["outcome"]["curve"][0]["seeds"], strict=True):
      assert (s["success"], s["tokens"], s["length"]) == (o["success"], o["tokens"], o["length"])
    for p in curve:
      assert len(p["seeds"]) == 2 and all(0 <= s["success"] <= 1 for s in p["seeds"])
  spent = {n: runs[n]["seeds"][0]["credit_env_steps"] for n in SOURCES}
  setup = runs["prm"]["setup"]["completions"]
  assert spent["outcome"] == 0 and setup == 8
  # prm and shaped: the PRM's traces, and the training alarm's labels (alarm.steps a update,
  # their pools and the next step's, K = 2), charged to the run.
  for name in ("prm", "shaped"):
    alarm = sum(u["alarm_completions"] for u in runs[name]["updates_log"][0])
    assert alarm > 0 and spent[name] == setup + alarm
    checked = [u["checks"] for u in runs[name]["updates_log"][0]]
    assert all(len(c["gap"]) == 4 for c in checked), checked
  # mc_credit draws K = 2 continuations at every step's prefix of its training traces;
  # pp_credit at a share of them, on top of the models' data and labels.
  steps = sum(u["steps"] for u in runs["mc_credit"]["updates_log"][0])
  assert spent["mc_credit"] == 2 * steps > 0
  pp_setup = runs["pp_credit"]["setup"]["completions"]
  assert pp_setup > setup and spent["pp_credit"] - pp_setup < spent["mc_credit"]
  assert "mc_credit minus outcome, paired by seed" in table
  # pp_credit's statistics (the symbolic source's: labelled share, explained variance, lam,
  # the rectifier's and the label noise's shares) per update, averaged per seed then over
  # seeds into the table's own block.
  own = next(b for b in table.split("\n\n") if b.startswith("| source | labelled share"))
  (row,) = [line for line in own.splitlines() if line.startswith("| pp_credit |")]
  per_seed = [np.mean([u["label_share"] for u in log]) for log in runs["pp_credit"]["updates_log"]]
  assert row.split("|")[2].strip().startswith(f"{np.mean(per_seed):.3f} [")
  assert all("rectifier_share" in u for u in runs["pp_credit"]["updates_log"][0])
  # The table's figures are results.json's last point: each source's mean over seeds with
  # its 95% t-interval, recomputed here (the start, update 0, would read other tokens).
  main = next(block for block in table.split("\n\n") if block.startswith("| source | success"))
  cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:5]]
           for line in main.splitlines()[2:]}  # fmt: skip
  for name in SOURCES:
    seeds, first = runs[name]["seeds"], runs[name]["curve"][0]["seeds"]
    assert cells[name][0].startswith(f"{np.mean([s['success'] for s in seeds]):.3f} [")
    for column, measure, fmt in ((1, "tokens", ".1f"), (2, "length", ".2f")):
      x = np.array([s[measure] for s in seeds])
      half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
      want = f"{x.mean():{fmt}} [{max(x.mean() - half, 0):{fmt}}, {x.mean() + half:{fmt}}]"
      assert cells[name][column] == want, (name, measure, cells[name][column], want)
    assert np.mean([s["tokens"] for s in first]) != np.mean([s["tokens"] for s in seeds])
  # The learned sources are held against the reference per sentence class.
  for name in ("pp_credit", "prm", "shaped"):
    drift = runs[name]["seeds"][0]["drift"]
    assert drift["mae"] is not None and drift["tags"]
  assert "Mean gap to the reference" in table


def test_the_trained_policy_sampled_by_this_loop_reproduces_results_json(often_right):
  """Each seed's last-point success (at least four sentences: about 0.7, so a reload that
  loses the policy shows), tokens and steps per trace, against 96 fresh prompts completed by
  the trained policy through a plain loop: the forward on the whole sequence at every token,
  a categorical draw, EOS or the budget ends it."""
  from hindsight.lm import backbone
  from hindsight.lm.train import load_lm
  from hindsight.rl import load_policy  # one loader for both trainers
  from tests.text_verifiers import four_steps

  run = often_right
  with open(os.path.join(run, "results.json")) as f:
    results = json.load(f)
  assert all(0.3 < s["success"] < 0.95 for s in results["seeds"]), results["seeds"]
  start = load_lm(results["config"]["lm"])
  for seed, reported in enumerate(results["seeds"]):
    lm, config = load_policy(run, seed)
    # the trained weights, not the start's
    moved = [not np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(nnx.to_pure_dict(lm.state)), jax.tree.leaves(nnx.to_pure_dict(start.state)),
      strict=True)]  # fmt: skip
    assert any(moved)
    budget, n = int(config.grpo.max_tokens), 96
    problems = world.problems(10_000 + seed, n, tuple(lm.record["counts"]))
    prompts = [lm.tokenizer.encode(p.prompt(), start=True) for p in problems]
    P = max(len(p) for p in prompts)
    seq = np.zeros((n, P + budget), np.int32)
    pos = np.array([len(p) for p in prompts])
    for i, p in enumerate(prompts):
      seq[i, : len(p)] = p

    def last_logits(state, s, at, graphdef=lm.graphdef, cfg=lm.cfg):
      return backbone.forward(nnx.merge(graphdef, state), cfg, s)[0][jnp.arange(len(at)), at]

    logits_at = jax.jit(last_logits, static_argnames=("graphdef", "cfg"))

    done, count = np.zeros(n, bool), np.zeros(n, int)
    key = jax.random.key(seed)
    for j in range(budget):
      logits = logits_at(lm.state, jnp.asarray(seq), jnp.asarray(pos - 1))
      token = np.asarray(jax.random.categorical(jax.random.fold_in(key, j), logits))
      live = ~done
      seq[np.flatnonzero(live), pos[live]] = token[live]
      pos, count = pos + live, count + live
      done |= live & np.isin(token, lm.cfg.eos_ids)
      if done.all():
        break
    success, tokens, steps = [], count, []
    for i in range(n):
      words = [t for t in seq[i, len(prompts[i]) : pos[i]] if t not in lm.cfg.eos_ids]
      text = lm.tokenizer.decode(words)
      success.append(four_steps(text, None))
      steps.append(len(chunk_text(text)) if text.strip() else 1)
    m = int(config.eval.prompts)
    p = (np.sum(success) + reported["success"] * m) / (n + m)
    binomial = np.sqrt(max(p * (1 - p), 1 / (n + m)) * (1 / n + 1 / m))
    assert abs(np.mean(success) - reported["success"]) <= 4 * binomial, seed
    for ours, theirs in ((tokens, reported["tokens"]), (steps, reported["length"])):
      se = np.std(ours, ddof=1) * np.sqrt(1 / n + 1 / m)
      assert abs(np.mean(ours) - theirs) <= 4 * se + 1e-9, (seed, np.mean(ours), theirs)


def test_a_tuned_policy_exports_as_a_hugging_face_folder_of_the_same_model(experiment, tmp_path):
  from hindsight.lm import backbone
  from hindsight.lm.train import load_lm
  from hindsight.rl import load_policy

  run = os.path.join(experiment, "mc_credit")
  got = run_cli("lm", "export", run, "--out", tmp_path / "hf", "--seed", 1)
  assert got.returncode == 0, got.stderr
  tuned, _ = load_policy(run, 1)
  folder = load_lm(str(tmp_path / "hf"))
  assert folder.cfg.eos_ids == tuned.cfg.eos_ids
  prompt = world.problems(3, 1)[0].prompt()
  # The folder's tokenizer.json reads back as the same tokenizer: same ids, same text.
  assert folder.tokenizer.encode(prompt, start=True).tolist() == (
    tuned.tokenizer.encode(prompt, start=True).tolist()
  )
  ids = jnp.asarray([tuned.tokenizer.encode(prompt, start=True)])
  assert folder.tokenizer.decode(ids[0].tolist()) == tuned.tokenizer.decode(ids[0].tolist())
  a = backbone.forward(tuned.model, tuned.cfg, ids)[0]
  b = backbone.forward(folder.model, folder.cfg, ids)[0]
  np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
  # The one-line result says where each measure started and where it ended.
  from hindsight.lm.rl.trainer import results_text

  with open(os.path.join(run, "results.json")) as f:
    results = json.load(f)
  line = results_text(results, run)
  start = np.mean([s["success"] for s in results["curve"][0]["seeds"]])
  assert f"success {start:.3f} -> " in line
  # Two seeds far apart: the t-interval reaches past [0, 1]; the line shows it cut there.
  spread = dict(results, seeds=[dict(results["seeds"][0], success=v) for v in (0.625, 1.0)])
  assert "-> 0.812 [0.000, 1.000]" in results_text(spread, run), results_text(spread, run)
  again = run_cli("lm", "export", run, "--out", tmp_path / "hf")
  assert_one_line_error(again, "exists and is not an empty directory")


def test_a_killed_run_resumes_to_the_same_result(policy, tmp_path, monkeypatch):
  """A run stopped after its first update's checkpoint (the same config with one update),
  then rerun with two, ends where one uninterrupted two-update run ends: the same points and
  bitwise the same parameters (every key is of the seed and the update), pp_credit's online
  head included. Each point measures the policy of its update: the first the starting LM,
  the last the checkpoint's."""
  from hindsight.lm.rl import trainer
  from hindsight.lm.rl.trainer import load_policy, train_and_evaluate
  from hindsight.lm.train import load_lm
  from hindsight.model.programs import state_digest

  measured, point = [], trainer.evaluate_point

  def spy(ctx, source, state, *args):
    measured.append(state_digest(state))
    return point(ctx, source, state, *args)

  monkeypatch.setattr(trainer, "evaluate_point", spy)
  # pp_credit: it draws Monte Carlo pools and keeps a head of its own, refit after every
  # update (a resume that dropped the head or its label buffer would train on another f)
  shared = [f"lm={policy}", "num_seeds=1", "source=pp_credit", "pp.rho=0.5"]
  whole = train_and_evaluate(load_config("rl_text:smoke", shared), str(tmp_path / "whole"))
  final, _ = load_policy(str(tmp_path / "whole"))
  assert len(measured) == 3 and len(set(measured)) == 3
  assert measured[0] == state_digest(load_lm(policy).state)
  assert measured[-1] == state_digest(final.state)
  train_and_evaluate(load_config("rl_text:smoke", [*shared, "grpo.updates=1"]),
                     str(tmp_path / "cut"))  # fmt: skip
  cut = train_and_evaluate(load_config("rl_text:smoke", shared), str(tmp_path / "cut"))
  assert cut["curve"] == whole["curve"] and cut["updates_log"] == whole["updates_log"]
  # the head did learn between the updates: a resume is tested on a head that moved
  (log,) = whole["updates_log"]
  assert all(u["buffer"] > 0 and u["refit_loss"] is not None for u in log), log
  a, _ = load_policy(str(tmp_path / "whole"))
  b, _ = load_policy(str(tmp_path / "cut"))
  for x, y in zip(jax.tree.leaves(nnx.to_pure_dict(a.state)),
                  jax.tree.leaves(nnx.to_pure_dict(b.state)), strict=True):  # fmt: skip
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_bad_rl_text_input_is_one_line(policy, tmp_path):
  proc = run_cli("rl", "--config", "rl_text:smoke", "--workdir", tmp_path / "a",
                 f"--config.lm={policy}", "--config.source=vibes")  # fmt: skip
  assert_one_line_error(proc, "source 'vibes' is unknown", "mc_credit")
  proc = run_cli("rl", "--config", "rl_text:smoke", "--workdir", tmp_path / "a",
                 f"--config.lm={policy}", "--config.grpo.group=1")  # fmt: skip
  assert_one_line_error(proc, "grpo.group must be >= 2")
  proc = run_cli("rl", "--config", "rl_text:smoke", "--workdir", tmp_path / "a",
                 f"--config.lm={tmp_path / 'nothing'}")  # fmt: skip
  assert_one_line_error(proc, "no language model")
  missing = tmp_path / "none.jsonl"
  proc = run_cli("rl", "--config", "rl_text:smoke", "--workdir", tmp_path / "a",
                 f"--config.lm={policy}", f"--config.prompts={missing}")  # fmt: skip
  assert_one_line_error(proc, "none.jsonl: cannot read it")


# -- each source's signal against its definition, on a hand-built batch ----------------------


def _hand_built():
  """Eight traces (two groups of four) of known steps and rewards, and hand-made pools: the
  outcomes of K = 3 continuations of every prefix x_t of trace i, with means (i + t) / 20."""
  from types import SimpleNamespace

  T = [2, 3, 1, 4, 2, 3, 2, 1]
  rewards = np.array([1, 0, 0, 0, 1, 1, 1, 0], np.float64)  # groups of unequal means
  rollouts = SimpleNamespace(completions=[SimpleNamespace(num_steps=t) for t in T],
                             rewards=rewards)  # fmt: skip
  pools = {(i, t): np.array([0.0, 1.0, 2.0], np.float32) / 20 + np.float32((i + t - 1) / 20)
           for i in range(8) for t in range(T[i])}  # fmt: skip
  return T, rewards, rollouts, pools


class _Ctx:
  """What a source reads of the run: the config, its pools (each request recorded) and the
  fitted models (a PRM's p(x_t) and a credit head's (f, s), given)."""

  def __init__(self, pools, prm=None, head=None, alarm_steps=0, **pp):
    from types import SimpleNamespace

    from hindsight.lm.rl.credit import Spend

    self._pools, self.asked, self.spend = pools, [], Spend
    pp = {"rho": 1.0, "p_min": 1.0, "lam": 0.5, **pp}
    self.config = SimpleNamespace(grpo=SimpleNamespace(group=4), pp=SimpleNamespace(**pp),
                                  label=SimpleNamespace(num_rollouts=3),
                                  alarm=SimpleNamespace(steps=alarm_steps))  # fmt: skip
    self._models = SimpleNamespace(prm_values=lambda ro: prm, credit_values=lambda ro: head)

  def pools(self, state, rollouts, wanted, K, key):
    self.asked.append(sorted(wanted))
    return {w: self._pools[w] for w in wanted}, self.spend()

  def models(self):
    return self._models


def test_outcome_is_the_group_z_score_over_consecutive_groups():
  from hindsight.lm.rl.sources import source_class

  T, rewards, rollouts, pools = _hand_built()
  steps = source_class("outcome")(_Ctx(pools)).signal(None, rollouts, None).steps
  for g in range(2):  # groups are consecutive: traces 0-3 and 4-7
    r = rewards[4 * g : 4 * g + 4]
    z = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    for j in range(4):
      np.testing.assert_allclose(steps[4 * g + j], np.full(T[4 * g + j], z[j]), rtol=1e-6)


def test_mc_credit_is_the_next_prefixs_pool_minus_this_ones():
  from hindsight.lm.rl.credit import all_prefixes
  from hindsight.lm.rl.sources import source_class

  T, rewards, rollouts, pools = _hand_built()
  ctx = _Ctx(pools)
  steps = source_class("mc_credit")(ctx).signal(None, rollouts, jax.random.key(0)).steps
  assert ctx.asked == [all_prefixes(rollouts)]
  for i in range(8):
    keep = [*(pools[(i, t + 1)].mean() for t in range(T[i] - 1)), rewards[i]]
    want = np.array(keep) - np.array([pools[(i, t)].mean() for t in range(T[i])])
    np.testing.assert_allclose(steps[i], want, atol=1e-6)


def test_prm_and_shaped_read_the_prms_values_as_defined():
  from hindsight.lm.rl.sources import source_class

  T, rewards, rollouts, pools = _hand_built()
  prm = [np.linspace(0.1, 0.9, t + 1).astype(np.float32) ** (i + 1) for i, t in enumerate(T)]
  ctx = _Ctx(pools, prm=prm)
  increments = source_class("prm")(ctx).signal(None, rollouts, None).steps
  shaped = source_class("shaped")(ctx).signal(None, rollouts, None).steps
  for i in range(8):
    np.testing.assert_allclose(increments[i], prm[i][1:] - prm[i][:-1], atol=1e-7)
    np.testing.assert_allclose(shaped[i], rewards[i] - prm[i][:-1], atol=1e-7)  # p(x_t), t < T


def test_the_prms_alarm_checks_are_its_increments_against_mc_credit_on_drawn_steps():
  """prm and shaped with alarm.steps = 5: five distinct training steps, drawn from the key,
  each checked as (the PRM's increment, the MC credit from the pools of x_t and x_{t+1}, or
  R at a trace's last step), the pools asked for exactly those prefixes; the signal itself
  is unchanged. Labelling the next step (the pools of x_{t+1} and x_{t+2}) fails it."""
  from hindsight.lm.rl.sources import source_class

  T, rewards, rollouts, pools = _hand_built()
  prm = [np.linspace(0.1, 0.9, t + 1).astype(np.float32) ** (i + 1) for i, t in enumerate(T)]
  for cls in (source_class("prm"), source_class("shaped")):
    ctx = _Ctx(pools, prm=prm, alarm_steps=5)
    signal = cls(ctx).signal(None, rollouts, jax.random.key(7))
    plain = cls(_Ctx(pools, prm=prm)).signal(None, rollouts, jax.random.key(7))
    assert signal.checks is not None and plain.checks is None
    for a, b in zip(signal.steps, plain.steps, strict=True):
      np.testing.assert_array_equal(a, b)
    c = signal.checks
    chosen = list(zip(c["trace"], c["step"], strict=True))
    assert len(set(chosen)) == 5 and all(0 <= t < T[i] for i, t in chosen)
    wanted = {(i, t) for i, t in chosen} | {(i, t + 1) for i, t in chosen if t + 1 < T[i]}
    assert ctx.asked == [sorted(wanted)]
    for (i, t), pred, ref in zip(chosen, c["pred"], c["ref"], strict=True):
      keep = rewards[i] if t == T[i] - 1 else pools[(i, t + 1)].mean()
      assert ref == pytest.approx(keep - pools[(i, t)].mean(), abs=1e-6)
      assert pred == pytest.approx(prm[i][t + 1] - prm[i][t], abs=1e-7)
  other = source_class("prm")(_Ctx(pools, prm=prm, alarm_steps=5)).signal(None, rollouts,
                                                                    jax.random.key(8))  # fmt: skip
  assert other.checks["step"] != c["step"] or other.checks["trace"] != c["trace"]


def test_pp_credits_alarm_checks_are_exactly_the_steps_it_labels():
  """pp_credit's checks are its labelled steps (z_t = 1) with the head's f_t and the MC
  credit D_t it bought: no extra label. Every step labelled (p = 1): every step checked."""
  from hindsight.lm.rl.sources import source_class

  T, rewards, rollouts, pools = _hand_built()
  head = [(np.full(t, 0.3 + 0.1 * i, np.float32), np.full(t, 0.2, np.float32))
          for i, t in enumerate(T)]  # fmt: skip
  ctx = _Ctx(pools, head=head)
  c = source_class("pp_credit")(ctx).signal(None, rollouts, jax.random.key(1)).checks
  assert list(zip(c["trace"], c["step"], strict=True)) == [
    (i, t) for i in range(8) for t in range(T[i])
  ]
  for i, t, pred, ref in zip(c["trace"], c["step"], c["pred"], c["ref"], strict=True):
    keep = rewards[i] if t == T[i] - 1 else pools[(i, t + 1)].mean()
    assert ref == pytest.approx(keep - pools[(i, t)].mean(), abs=1e-6)
    assert pred == pytest.approx(0.3 + 0.1 * i)
  # Labelling favours the steps the head is least sure of (p_t from 0.1 up); the checks are
  # the labelled steps thinned to a uniform sample: over 300 keys every step is checked about
  # p_min = 0.1 of the time, however often it was labelled (without the thinning, p_t).
  unsure = [(f, np.linspace(0.05, 2.0, len(f)).astype(np.float32) * (1 + i))
            for i, (f, _) in enumerate(head)]  # fmt: skip
  source = source_class("pp_credit")(_Ctx(pools, head=unsure, rho=0.4, p_min=0.1))
  labelled, checked = collections.Counter(), collections.Counter()
  for k in range(300):
    signal = source.signal(None, rollouts, jax.random.key(100 + k))
    for i, t in zip(signal.checks["trace"], signal.checks["step"], strict=True):
      checked[(i, t)] += 1
      # a checked step is a labelled one: its signal carries its own rectifier
      assert signal.steps[i][t] != pytest.approx(0.5 * unsure[i][0][t])
    labelled.update((i, t) for i in range(8) for t in range(T[i])
                    if signal.steps[i][t] != pytest.approx(0.5 * unsure[i][0][t]))  # fmt: skip
  rates = np.array([checked[(i, t)] / 300 for i in range(8) for t in range(T[i])])
  assert np.all(np.abs(rates - 0.1) < 4 * np.sqrt(0.1 * 0.9 / 300)), rates
  spread = np.array([labelled[(i, t)] / 300 for i in range(8) for t in range(T[i])])
  assert spread.max() - spread.min() > 0.3, spread  # the labelling itself is far from uniform


def _simulated_records(rng, updates: int, shift_from: int | None, shift: float, n: int = 16):
  """An update's checks of n steps over the sentence classes: gaps N(0, 0.3) per step,
  the 'restate' steps' gaps moved by `shift` from update `shift_from` on."""
  from hindsight.worlds.world import SENTENCE_TAGS

  records = []
  for u in range(updates):
    tags = [SENTENCE_TAGS[j] for j in rng.integers(0, 4, n)]
    gaps = rng.normal(0.0, 0.3, n)
    if shift_from is not None and u >= shift_from:
      gaps = gaps + shift * np.array([t == "restate" for t in tags])
    records.append({"gap": gaps.tolist(), "tag": tags})
  return records


def _first_alarm(records, baseline=5, window=5):
  from hindsight.lm.rl.alarm import alarm_test
  from hindsight.worlds.world import SENTENCE_TAGS

  for u in range(len(records)):
    test = alarm_test(records[: u + 1], SENTENCE_TAGS, baseline, window, 0.05, 0.05)
    if test is not None and test["fired"]:
      return test
  return None


def test_the_training_alarm_holds_alpha_over_a_run_and_finds_a_moved_class():
  """`rl.alarm.alarm_test` on simulated checks (16 steps an update over four classes, gap
  noise 0.3, baseline 5 updates, window 5): with no class moving, at most alpha (0.05) of
  200 runs of 30 updates ever fire; a 'restate' gap moved by 1.0 from update 10 is found,
  on that class, in every one of 20 runs, within 10 updates. With one-update windows (about
  4 gaps a class) no class is tested: testing classes of 2 gaps fires in most runs of no
  drift (a sample sd of a few gaps can be near 0). Pooling every update since the baseline
  instead of the window fails the delay. (Testing every window at alpha / 2, unspent,
  passes here: a sequence read at one time is conservative; the spending is what the union
  bound over a run's tests needs.)"""
  from hindsight.lm.rl.alarm import alarm_message, check_record

  rng = np.random.default_rng(0)
  false = sum(_first_alarm(_simulated_records(rng, 30, None, 0.0)) is not None for _ in range(200))
  assert false <= 0.05 * 200, false
  thin = [_first_alarm(_simulated_records(rng, 30, None, 0.0), 1, 1) for _ in range(50)]
  assert thin == [None] * 50, [t for t in thin if t]
  for _ in range(20):
    test = _first_alarm(_simulated_records(rng, 30, 10, 1.0))
    assert test is not None and test["slice"] == "restate", test
    assert 10 <= test["update"] < 20 and test["gap"] - test["before"] > 0.2, test
    assert f"at update {test['update']}" in alarm_message(test, 0.05, 0.05)
  # check_record: each check's class from its trace and step; a step with no finite reference
  # is left out; a source with no checks has no record.
  checks = {"trace": [0, 1, 1], "step": [1, 0, 2], "pred": [0.5, 0.1, 0.2],
            "ref": [0.25, float("nan"), 0.4]}  # fmt: skip
  tags = [["fact", "restate"], ["verify", "write", "answer"]]
  assert check_record(checks, tags) == {"gap": [0.25, pytest.approx(-0.2)],
                                        "tag": ["restate", "answer"]}  # fmt: skip
  assert check_record(None, tags) is None


def test_the_training_alarm_is_kept_in_the_log_and_warned_at_the_next_point():
  """SeedRun's wiring of the alarm: each update of a learned source tested from update
  B + W - 1 on, the first firing kept as log["alarm"] (at `alarm_test`'s update on the same
  records) and no test after it; the next point carries `alarm_update` and the
  `training_alarm` warning. A source with no model is never tested."""
  from types import SimpleNamespace

  from hindsight.lm.rl.alarm import alarm_message
  from hindsight.lm.rl.trainer import SeedRun

  config = SimpleNamespace(alarm=SimpleNamespace(baseline=5, window=5),
                           eval=SimpleNamespace(tolerance=0.05, alpha=0.05))  # fmt: skip
  records = _simulated_records(np.random.default_rng(1), 30, 10, 1.0)
  want = _first_alarm(records)
  assert want is not None
  for learned in (True, False):
    run = SimpleNamespace(ctx=SimpleNamespace(config=config),
                          source=SimpleNamespace(learned=learned))  # fmt: skip
    log = {"updates": [], "points": [], "policy": {}, "credit": {}}
    for u, r in enumerate(records):
      log["updates"].append({"update": u, "checks": r})
      SeedRun._alarm(run, log)
    tested = [x["update"] for x in log["updates"] if "alarm" in x]
    if not learned:
      assert tested == [] and "alarm" not in log
      continue
    assert tested == list(range(9, want["update"] + 1))
    assert log["alarm"]["update"] == want["update"] and log["alarm"]["slice"] == "restate"
    assert log["alarm"]["message"] == alarm_message(want, 0.05, 0.05)
    run.point = lambda *_: {"success": 0.5, "warnings": {"other": "kept"}}
    run.learner = SimpleNamespace(rollout=SimpleNamespace(state=None))
    point = SeedRun._point(run, 30, log)
    assert point["alarm_update"] == want["update"]
    assert point["warnings"] == {"other": "kept", "training_alarm": log["alarm"]["message"]}
    quiet = SeedRun._point(run, 30, {**log, "alarm": None})
    assert quiet["alarm_update"] is None and "training_alarm" not in quiet["warnings"]


def test_pp_credits_cross_fitted_weight_never_reads_the_labels_it_weights():
  """pp.lam < 0: the even traces are weighted by the lam fitted on the odd traces' labels and
  the reverse (`tuned_weight` on the other half), so no trace's weight reads its own MC
  credit (fitted in-sample it would correlate with the rectifier it scales, a bias of order
  one over the dozen labels an LM batch has per half). Read off the unlabelled steps (A_t =
  lam f_t there): new MC labels on the even traces move the odd traces' weight and leave
  the even ones'. Fitting each half on itself fails it."""
  from hindsight.lm.rl.sources import source_class

  T, rewards, rollouts, pools = _hand_built()
  rng = np.random.default_rng(0)
  credit = [
    np.array([*(0.05 for _ in range(t - 1)), rewards[i] - (i + t - 1) / 20 - 0.05])
    for i, t in enumerate(T)
  ]  # the MC credit these pools give (mean of a pool + 0.05)
  head = [((2 * c + rng.normal(0, 0.02, len(c))).astype(np.float32),
           np.full(len(c), 0.05, np.float32)) for c in credit]  # fmt: skip
  steeper = {(i, t): v * (1.5 if i % 2 == 0 else 1.0) for (i, t), v in pools.items()}

  def signal(pools):
    ctx = _Ctx(pools, head=head, rho=0.5, p_min=0.3, lam=-1.0)
    return source_class("pp_credit")(ctx).signal(None, rollouts, jax.random.key(5))

  before, after = signal(pools), signal(steeper)
  assert 0 < before.record["lam"] < 1 and before.record["label_share"] < 1

  def weight(signal, half):
    """The ratio A_t / f_t most steps of a half share: lam f_t / f_t on its unlabelled steps
    (a labelled one adds its own rectifier; one labelled with p = 1 carries D_t alone)."""
    ratios = [round(float(signal.steps[i][t] / head[i][0][t]), 5)
              for i in range(half, 8, 2) for t in range(T[i])]  # fmt: skip
    (value, count), *_ = collections.Counter(ratios).most_common(1)
    assert count >= 2, ratios
    return value

  assert 0 < weight(before, 0) < 1 and 0 < weight(before, 1) < 1
  assert weight(after, 0) == weight(before, 0)  # even: set by the odd labels alone
  assert weight(after, 1) != weight(before, 1)  # odd: set by the even labels, which moved


def test_a_steps_mc_stderr_is_its_two_pools_sample_stderr():
  """`credit.step_stderr`: sqrt(s_keep^2 / K + s_replace^2 / K) (ddof 1), the keep pool of
  x_{t+1}, none at the last step (R is known); pools here of K = 3 spread 0, 0.05, 0.1."""
  from hindsight.lm.rl.credit import step_stderr

  T, _, _, pools = _hand_built()
  s2 = np.var([0.0, 0.05, 0.1], ddof=1) / 3
  assert step_stderr(pools, 1, 0, T[1]) == pytest.approx(np.sqrt(2 * s2))
  assert step_stderr(pools, 1, T[1] - 1, T[1]) == pytest.approx(np.sqrt(s2))


def test_pp_credit_is_the_head_rectified_by_the_labels_it_buys():
  """Every step labelled (p = 1): A_t = D_t, the MC credit, whatever f says. Few labelled
  (rho = p_min = 0.01): the unlabelled steps carry lam f_t exactly."""
  from hindsight.lm.rl.sources import source_class

  T, rewards, rollouts, pools = _hand_built()
  head = [(np.full(t, 0.3 + 0.1 * i, np.float32), np.full(t, 0.2, np.float32))
          for i, t in enumerate(T)]  # fmt: skip
  everything = source_class("pp_credit")(_Ctx(pools, head=head))
  steps = everything.signal(None, rollouts, jax.random.key(1)).steps
  for i in range(8):
    keep = [*(pools[(i, t + 1)].mean() for t in range(T[i] - 1)), rewards[i]]
    want = np.array(keep) - np.array([pools[(i, t)].mean() for t in range(T[i])])
    np.testing.assert_allclose(steps[i], want, atol=1e-6)
  few = source_class("pp_credit")(_Ctx(pools, head=head, rho=0.01, p_min=0.01))
  signal = few.signal(None, rollouts, jax.random.key(2))
  unlabelled = [np.isclose(s, 0.5 * f) for s, (f, _) in zip(signal.steps, head, strict=True)]
  assert signal.record["label_share"] < 0.5
  assert np.concatenate(unlabelled).mean() >= 1 - signal.record["label_share"] - 1e-9


def test_the_docs_source_written_once_trains_a_language_model_too(tmp_path, monkeypatch):
  """docs/rl.md's own source (`last_step`, which tests/test_rl.py trains PPO on) through the
  language model's binding, on the hand-built batch: R_i - mean R on each trace's last step,
  0 before it. A source written for PPO alone is refused by the LM trainer in one line."""
  import sys

  from hindsight.errors import HindsightError
  from hindsight.lm.rl.sources import source_class, text_sources
  from hindsight.rl.sources import base

  monkeypatch.setattr(base, "_SOURCES", dict(base._SOURCES))  # last_step registers here only
  page_module(tmp_path, monkeypatch, "docs/rl.md", "my_sources.py")
  T, rewards, rollouts, pools = _hand_built()
  steps = source_class("my_sources:last_step")(_Ctx(pools)).signal(None, rollouts, None).steps
  for i in range(8):
    want = np.zeros(T[i], np.float32)
    want[-1] = rewards[i] - rewards.mean()
    np.testing.assert_allclose(steps[i], want, atol=1e-7)
  sys.modules.pop("my_sources", None)
  assert {"outcome", "mc_credit", "pp_credit", "prm", "shaped"} <= set(text_sources())
  assert "gae" not in text_sources()
  with pytest.raises(HindsightError, match=r"'gae' does not train a language model.*mc_credit"):
    source_class("gae")

  class Unwritten(base.CreditSource):  # says it trains an LM, has no step_signal
    name, trainers = "test_unwritten", ("symbolic", "text")

  base.register_source(Unwritten)
  with pytest.raises(HindsightError, match=r"'test_unwritten' lists 'text'.*no step_signal"):
    source_class("test_unwritten")


def test_pp_credits_head_learns_online_from_exactly_the_labels_it_bought():
  """After an update, the labelled steps (z) and their MC credit join the seed's buffer, each
  as the head's input for its step (`credit_inputs`), and the refit head fits them better
  than the head that scored the batch; a seed restarted from `seed_state` has that head. The
  buffer is a ring: past its capacity the oldest labels go."""
  from types import SimpleNamespace

  from hindsight.lm.rl.models import CreditHead, OnlineHead, credit_inputs
  from hindsight.lm.rl.sources import source_class
  from hindsight.rl.sources.prediction_powered import allocate

  T, rewards, rollouts, pools = _hand_built()
  rng = np.random.default_rng(3)
  features = [rng.normal(size=(t + 1, 4)).astype(np.float32) for t in T]
  head = CreditHead.fit(jax.random.key(0), features, rewards, [np.zeros(t) for t in T], 20, 8)
  ctx = _Ctx(pools, rho=0.6, p_min=0.2, lam=-1.0, refit_steps=300, buffer=64)
  ctx._models = SimpleNamespace(head=head, features=lambda ro: features)
  source = source_class("pp_credit")(ctx)
  source.start_seed()
  signal = source.signal(None, rollouts, jax.random.key(4))
  z, d = signal.labels["z"], signal.labels["d"]
  labelled = np.argwhere(z)
  assert 3 <= len(labelled) < sum(T)
  # the batch was scored by the head as fitted (the refit comes after the batch)
  fitted = [v[0] for v in head(features, rewards)]
  for i, t in np.argwhere(signal.labels["p"] > 0):
    assert signal.labels["f"][i, t] == pytest.approx(fitted[i][t], abs=1e-6)

  def mse(h):
    f = [v[0] for v in h(features, rewards)]
    return np.mean([(f[i][t] - d[i, t]) ** 2 for i, t in labelled])

  before = mse(source.online.head)
  log = source.between_updates(rollouts, signal)
  state = source.seed_state()
  assert log["buffer"] == len(labelled) == int(state["count"])
  want = np.stack([credit_inputs(features[i], rewards[i])[t] for i, t in labelled])
  np.testing.assert_allclose(np.asarray(state["x"][: len(labelled)]), want, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(state["y"][: len(labelled)]), d[z], rtol=1e-6)
  assert not np.asarray(state["y"][len(labelled) :]).any()
  assert mse(source.online.head) < 0.5 * before
  assert float(state["lam"]) == pytest.approx(signal.record["lam"])
  # the next batch is scored by the refit head and allocated with the weight stored:
  # p_t = allocate(sqrt(s_t^2 + (1 - lam)^2 f_t^2))
  steps = source.steps(None, rollouts)
  f, s, lam = steps.credit_model()
  assert float(lam) == pytest.approx(signal.record["lam"]) and 0 < float(lam) < 1
  nxt = source.signal(None, rollouts, jax.random.key(5))
  np.testing.assert_array_equal(nxt.labels["f"], f)
  score = np.sqrt(np.square(s) + np.square((1 - float(lam)) * f))
  np.testing.assert_allclose(nxt.labels["p"], np.asarray(allocate(score, steps.mask, 0.6, 0.2)),
                             rtol=1e-5)  # fmt: skip
  # a seed restarted from its state has its head, buffer and weight
  again = source_class("pp_credit")(ctx)
  again.start_seed(state)
  for x, y in zip(jax.tree.leaves(again.seed_state()), jax.tree.leaves(state), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  np.testing.assert_array_equal(again.steps(None, rollouts).credit_model()[0], f)
  # A refit reads the buffer's filled rows only, and starts from the head's parameters (one
  # Adam step moves no parameter by more than its step size, 3e-3).
  n = len(labelled)
  small = OnlineHead(head, n)
  small.add(want, d[z])
  small.refit(300)
  for x, y in zip(jax.tree.leaves(small.state["params"]),
                  jax.tree.leaves(source.online.state["params"]), strict=True):  # fmt: skip
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)
  one = OnlineHead(head, n)
  one.add(want, d[z])
  one.refit(1)
  moved = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
              for x, y in zip(jax.tree.leaves(one.state["params"]), jax.tree.leaves(head.params),
                              strict=True))  # fmt: skip
  assert 0 < moved <= 3e-3 + 1e-6
  ring = OnlineHead(head, 4)
  ring.add(np.ones((3, want.shape[1])), np.array([1.0, 2.0, 3.0]))
  ring.add(np.ones((3, want.shape[1])), np.array([4.0, 5.0, 6.0]))
  assert int(ring.state["count"]) == 6
  np.testing.assert_array_equal(np.asarray(ring.state["y"]), [5.0, 6.0, 3.0, 4.0])
