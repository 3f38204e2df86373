"""Every program in eval/ runs on a tiny size, so a README command cannot break silently.

(`eval/label_honesty.py` has its smoke test beside the labels it checks.)
"""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import FAST_COMPILE, ROOT


def _run(*args, timeout=300):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count=2 {FAST_COMPILE}")
  proc = subprocess.run(
    [sys.executable, *map(str, args)],
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=ROOT,
    env=env,
  )
  assert proc.returncode == 0, proc.stderr
  return proc.stdout


@pytest.mark.slow
def test_bench_labeler_smoke():
  out = _run("eval/bench_labeler.py", "--episodes", 10, "--rollouts", 4, "--states", 6,
             "--horizon", 6, "--repeats", 1, "--env-episodes", 8, "--startup-repeats", 1,
             "--e2e-episodes", 20)  # fmt: skip
  assert "rounded up to" in out  # 10 is no multiple of the micro-batch: rounded, not a crash
  lines = ("python + import jax + one op :", "hindsight --help", "empty compilation cache",
           "unit program traced", "compiled and stored programs cached", "jax   :", "numpy :",
           "no compaction:", "ratio :", "check :", "end to end, 20 episodes", "reasoning  :",
           "key_to_door:", "S=64 MDP :", "peaked pi:")  # fmt: skip
  for line in lines:
    assert line in out, (line, out)
  seconds = [float(x) for x in re.findall(r": +(\d+\.\d+) s = ", out)]
  assert len(seconds) == 3 and all(s > 0 for s in seconds), out
  # The warm start loaded its stored program: a warm run that traced and exported again
  # would rewrite the file.
  assert re.search(r"warm runs: 0 of [1-9]\d* stored programs rewritten \(loaded\)", out), out


def test_bench_model_smoke():
  out = _run("eval/bench_model.py", "--config", "configs/reasoning.py:smoke", "--steps", 2,
             "--score-batch", 8, "--repeats", 1)  # fmt: skip
  report = json.loads(out[out.index("{") :])
  # The model it timed is the config's: its parameter count, built here independently.
  from flax import nnx

  from hindsight.config_io import load_config
  from hindsight.model.credit_model import CreditModel, ModelConfig
  from hindsight.model.encoders import VectorEncoder
  from hindsight.model.spec import DataSpec

  config = load_config("configs/reasoning.py:smoke")
  spec = DataSpec(VectorEncoder(7, (0.0,) * 7, (1.0,) * 7), 10, 20, 4, 1.0)  # the bench's default
  model = nnx.eval_shape(
    lambda: CreditModel(ModelConfig(**config.model.to_dict()), spec, rngs=nnx.Rngs(0))
  )
  params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert report["model_params"] == params
  assert report["spec"] == {"obs": "vector observations [7]", "actions": 10, "T": 20}
  # Env steps trained per optimizer step: the real (unpadded) steps of one batch of 8
  # episodes of 10 to 20 steps.
  per_step = report["train_env_steps_per_s"] / report["train_steps_per_s"]
  assert 8 * 10 <= round(per_step) <= 8 * 20, per_step
  assert report["train_gflops_per_call"] > 0 and report["score_gflops_per_call"] > 0


def test_label_ceiling_smoke(synthetic_labels):
  out = _run("eval/label_ceiling.py", synthetic_labels)
  row = json.loads(out.strip().splitlines()[-1])
  # Its figures, recomputed here from the dataset.
  from hindsight.data import open_labels

  labels = open_labels(synthetic_labels)
  y = np.concatenate([ex["credit"] for ex in labels])
  e = np.concatenate([ex["credit_stderr"] for ex in labels])
  ok = np.isfinite(y) & np.isfinite(e)
  assert row["steps"] == int(ok.sum()) > 100
  assert row["exact_zero_share"] == round(float(np.mean((y[ok] == 0) & (e[ok] == 0))), 3)
  assert row["reliability"] == round(float(1 - np.mean(e[ok] ** 2) / np.var(y[ok])), 3)
  assert row["continuous"] > row["noisy_copy"]  # label noise lowers the ceiling


def test_ablations_table_prints_a_study(tmp_path):
  """`python -m eval.ablations --table` prints the README's table from a study's JSON (the study
  itself trains real models: minutes, not a test)."""
  est = {"value": 0.5, "lo": 0.4, "hi": 0.6}
  row = {"hypothesis": "h", "spearman": est, "mae": est, "rmse": est, "mean_gap": est,
         "k_star": {"value": 150.0, "lo": 130.0, "hi": 180.0}, "coverage_95": est,
         "worst_tag": {"tag": "fact", "gap": {"value": -0.001}}, "seconds": 40.0}  # fmt: skip
  (tmp_path / "reasoning.json").write_text(json.dumps({"variants": {"beta1": row, "zzz": row}}))
  out = _run("-m", "eval.ablations", "--config", "configs/reasoning.py", "--labels", "unused",
             "--out", tmp_path, "--table")  # fmt: skip
  lines = [line for line in out.splitlines() if line.startswith("| beta1")]
  assert len(lines) == 1 and "150 [130, 180]" in lines[0] and "fact -0.0010" in lines[0]
  assert "zzz" not in out  # rows are the config's variants, in their order


def test_audit_false_alarm_program_counts_and_bounds_its_rate(tabular_run, tmp_path):
  """`eval/audit_false_alarm.py` on a small budget: its count is the number of firings it
  lists, and its interval is the Clopper-Pearson interval of that count."""
  from scipy import stats

  out = tmp_path / "fa"
  _run("eval/audit_false_alarm.py", "--checkpoint", tabular_run, "--env",
       "tabular:data/key_corridor.npz", "--audits", 3, "--budget", 4000, "--check-budget",
       8000, "--episodes", 16, "--rollouts", 8, "--gap-tolerance", 0.05, "--out", out)  # fmt: skip
  result = json.loads((out / "false_alarm.json").read_text())
  k, n = result["fired"], result["audits"]
  assert n == 3 and k == len(result["firings"]) and result["false_alarm_rate"] == k / n
  lo = 0.0 if k == 0 else stats.beta.ppf(0.025, k, n - k + 1)
  hi = 1.0 if k == n else stats.beta.ppf(0.975, k + 1, n - k)
  np.testing.assert_allclose(result["ci95"], [lo, hi], rtol=1e-9)
  assert result["long_audit"]["budget"] == 8000 and result["long_audit"]["draws"] > 0


@pytest.mark.slow
def test_budget_curve_scores_every_point_against_one_shared_reference(tabular_run, tmp_path):
  """`eval/budget_curve.py` with two points that reuse one finished run: each row is its drift
  report's headline, and the second point computes no reference of its own (one cache for
  every point, the same fresh episodes)."""
  out = tmp_path / "budget"
  stdout = _run("-m", "eval.budget_curve", "--config", "configs/tabular.py", "--env",
                "tabular:data/key_corridor.npz", "--points", "64x32,32x64", "--reuse",
                f"64x32={tabular_run}", "--reuse", f"32x64={tabular_run}", "--episodes", 8,
                "--reference-rollouts", 16, "--check-episodes", 8, "--out", out)  # fmt: skip
  result = json.loads((out / "tabular.json").read_text())
  rows = result["points"]
  assert [(r["episodes"], r["rollouts"]) for r in rows] == [(64, 32), (32, 64)]
  assert len(re.findall(r"Spearman -?\d\.\d{4} \[", stdout)) == 2, stdout
  for row in rows:
    point = f"{row['episodes']}x{row['rollouts']}"
    report = json.loads((out / f"tabular_{point}_drift" / "report.json").read_text())
    assert report["reference"]["kind"] == "exact DP"
    head = report["headline"]["model (point)"]
    assert all(row[m] == head[m] for m in ("spearman", "mae", "rmse", "mean_gap")), point
  # The same model on the same episodes against the same reference: the same figures, and
  # the cache holds one fresh set (its DP reference with it) and one check pass.
  assert rows[0]["spearman"] == rows[1]["spearman"] and rows[0]["mae"] == rows[1]["mae"]
  cached = os.listdir(out / "tabular_cache")
  assert sorted(f.split("-")[0] for f in cached) == ["check", "fresh"], cached


def test_bench_rl_smoke():
  out = _run("eval/bench_rl.py", "--config", "configs/rl_reasoning.py:smoke", "--sources",
             "outcome,mc_credit", "--updates", 1)  # fmt: skip
  rows = {line.split()[0]: line.split() for line in out.splitlines()
          if line.split() and line.split()[0] in ("outcome", "mc_credit")}  # fmt: skip
  assert set(rows) == {"outcome", "mc_credit"}, out
  assert float(rows["outcome"][1]) > 0 and float(rows["outcome"][2]) == 1.0
  # Outcome RL branches nothing; MC credit pays credit env steps for every policy step.
  assert float(rows["outcome"][-1]) == 0 and float(rows["mc_credit"][-1]) > 1


@pytest.mark.slow
def test_bench_text_smoke(tmp_path):
  """Every part of `eval/bench_text.py`, the language model's endpoint included (a tiny
  random Qwen2 folder), on its smallest sizes."""
  from hindsight.lm import backbone, hf
  from hindsight.lm.config import BackboneConfig
  from hindsight.model.encoders.tokenizer import train_bpe
  from hindsight.worlds import world

  texts = [t.prompt + t.completion() for t in world.sample_traces(0, 50)]
  cfg = BackboneConfig("qwen2", 300, 32, 1, 4, 2, 8, 48, max_len=1024)
  folder = hf.write_hf(backbone.build(cfg, jax.random.key(0)), cfg, train_bpe(texts, 300),
                       str(tmp_path / "lm"))  # fmt: skip
  out = _run("eval/bench_text.py", "--traces", 2, "--completions", 32, "--lm", folder,
             "--port", 8137, "--no-warmup")  # fmt: skip
  for part in range(1, 8):
    assert f"\n{part}. " in "\n" + out, (part, out)
  assert "100.0% from the cache, 0 requests sent" in out
  # Part 4: a label costs K completions per step, and each prompt's trace one more.
  table = [line.split() for line in out.split("4. labels")[1].splitlines()[2:4]]
  for K, steps, completions in ((int(r[0]), int(r[1]), int(r[2])) for r in table):
    assert completions == K * steps + 2, (K, steps, completions)
  rows = [line.split() for line in out.split("6. the language")[1].splitlines()[2:5]]
  assert [int(r[0]) for r in rows] == [1, 16, 64]
  assert all(float(r[1]) > 0 and 1 <= int(r[3]) <= 64 for r in rows), rows
  # Part 7: one 12-step trace's prefixes, K = 8 each, on the engine and in static batches.
  pools = [line.split() for line in out.split("7. in-process")[1].splitlines()[2:4]]
  assert "12 prefixes (1 traces), 96 completions" in out.split("7. in-process")[1]
  assert [r[0] for r in pools] == ["static,", "engine,"] and all(float(r[-3]) > 0 for r in pools)


def test_every_make_bench_program_has_a_smoke_test():
  """A program `make bench` runs that no test runs breaks silently (a signature change)."""
  with open(os.path.join(ROOT, "Makefile")) as f:
    recipe = f.read().split("\nbench:")[1].split("\n\n")[0]
  programs = set(re.findall(r"eval/(\w+)\.py", recipe))
  assert programs >= {"bench_labeler", "bench_model", "bench_rl", "bench_text", "bench_serve"}
  tested = ""
  for name in os.listdir(os.path.join(ROOT, "tests")):
    if name.startswith("test_") and name.endswith(".py"):
      with open(os.path.join(ROOT, "tests", name)) as f:
        tested += f.read()
  for program in programs:
    assert f'"eval/{program}.py"' in tested, f"no test runs eval/{program}.py"


def test_the_device_check_runs_every_part_and_bench_lm_reports_its_model():
  """`eval/device_check.sh --tiny`: the labeler's env steps/s, the credit model in bf16 and
  the LM backbone's training and sampling rates, each part's figures printed; bench_lm's
  parameter count is the small decoder's, built here independently, and its FLOP/s and
  tokens are consistent with the sizes it was given."""
  with open(os.path.join(ROOT, "eval", "device_check.sh")) as f:
    script = f.read()
  assert "eval/bench_lm.py" in script  # (`make bench` runs it too: its smoke test is this)
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE, PYTHON=sys.executable)
  proc = subprocess.run(["bash", "eval/device_check.sh", "--tiny"], capture_output=True,
                        text=True, timeout=300, cwd=ROOT, env=env)  # fmt: skip
  out = proc.stdout
  assert proc.returncode == 0 and "device_check: done" in out, (out, proc.stderr)
  assert "failed" not in out and "ran past" not in out, out
  rate = r"labeler \(cpu, cpu\): [\d,]+ env steps in [\d.]+ s = [\d.]+ M env steps/s"
  assert re.search(rate, out), out
  reports = [json.loads(m) for m in re.findall(r"^\{.*?^\}", out, re.M | re.S)]
  model, lm = reports
  assert model["compute_dtype"] == "bfloat16" and model["train_steps_per_s"] > 0
  assert "train_mfu" not in model  # no peak is known for a CPU: no MFU
  from hindsight.lm import backbone
  from hindsight.lm.config import BackboneConfig

  small = BackboneConfig(vocab_size=512, width=128, depth=2, num_heads=4, num_kv_heads=2,
                         head_dim=32, hidden=384, max_len=384)  # fmt: skip
  assert lm["params"] == backbone.parameter_count(backbone.abstract(small))
  assert lm["size"] == "small (the CPU's smallest)" and lm["train"]["mfu"] is None
  assert lm["train"]["tokens_per_s"] > 0 and lm["train"]["achieved_tflops"] > 0
  # A training step's FLOPs per token: about 6 per parameter (forward and backward matmuls),
  # a little more for attention, the loss and Adam (rounding of the 4-decimal TFLOP/s).
  per_token = lm["train"]["achieved_tflops"] * 1e12 / lm["train"]["tokens_per_s"]
  assert 5 * lm["params"] <= per_token <= 12 * lm["params"], per_token / lm["params"]
  # Each completion draws at most its 4 new tokens, at least one (the two rates are rounded
  # to 0.1 and 0.01: their ratio to a part in a thousand).
  per_completion = lm["sample"]["new_tokens_per_s"] / lm["sample"]["completions_per_s"]
  assert 1 - 1e-3 <= per_completion <= 4 * (1 + 1e-3), lm["sample"]
