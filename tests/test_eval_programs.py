"""Every program in eval/ runs on a tiny size, so a README command cannot break silently.

(`eval/label_honesty.py` has its smoke test beside the labels it checks.)
"""

import json
import os
import re
import subprocess
import sys

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


def test_bench_labeler_smoke():
  out = _run("eval/bench_labeler.py", "--episodes", 10, "--rollouts", 4, "--states", 6,
             "--horizon", 6, "--repeats", 1, "--env-episodes", 8)  # fmt: skip
  assert "rounded up to" in out  # 10 is no multiple of the micro-batch: rounded, not a crash
  lines = ("cold start:", "warm start:", "jax   :", "numpy :", "no compaction:", "ratio :",
           "check :", "reasoning  :", "key_to_door:", "S=64 MDP :", "peaked pi:")  # fmt: skip
  for line in lines:
    assert line in out, (line, out)
  # The warm start loads the program the cold one compiled from the persistent cache: the
  # cold one writes it there, the warm one writes nothing.
  cold, warm = (int(re.search(rf"{w} start: .* (\d+) programs written", out)[1])
                for w in ("cold", "warm"))  # fmt: skip
  assert cold >= 1 and warm == 0, out


def test_bench_model_smoke():
  out = _run("eval/bench_model.py", "--config", "configs/reasoning.py:smoke", "--steps", 2,
             "--score-batch", 8, "--repeats", 1)  # fmt: skip
  report = json.loads(out[out.index("{") :])
  assert report["train_steps_per_s"] > 0 and report["scored_env_steps_per_s"] > 0


def test_label_ceiling_smoke(synthetic_labels):
  out = _run("eval/label_ceiling.py", synthetic_labels)
  row = json.loads(out.strip().splitlines()[-1])
  assert row["steps"] > 0 and -1 <= row["noisy_copy"] <= 1 and 0 <= row["exact_zero_share"] <= 1


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
