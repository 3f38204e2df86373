"""gymnax environments inside the jitted labeler (`--env gymnax:ID`, `--policy MODULE:FN`)."""

import os

import jax
import numpy as np
import pytest

pytest.importorskip("gymnax")

from conftest import HINDSIGHT as HINDSIGHT_CLI
from conftest import assert_one_line_error, run_cli

from hindsight.envs.gymnax_env import make_gymnax
from hindsight.errors import HindsightError
from hindsight.labeling import LabelConfig, Labeler, to_numpy


def _label(spec, episodes, rollouts, policy=None, horizon=None, return_range=None):
  env, pi = make_gymnax(spec, policy, horizon, return_range)
  labeler = Labeler(env, pi, LabelConfig(num_rollouts=rollouts, replacement="uniform"))
  return env, pi, *to_numpy(labeler.sample_and_label(0, jax.numpy.arange(episodes)))


def test_umbrella_chain_credit_is_the_first_action_only():
  """bsuite's UmbrellaChain: the first action decides the final +-1, every later reward is
  noise shared by the arms (common random numbers). So credit is +-1 at t = 0 (whether a_0
  matches the need; scale 1 - q(a_0) = 1/2 of a paired difference of 2) and exactly 0 after."""
  env, _, traj, lab = _label("gymnax:UmbrellaChain-bsuite", 32, 4, horizon=10,
                             return_range=(-10.0, 10.0))  # fmt: skip
  need = np.asarray(traj.states.env_state.need_umbrella)[:, 0]
  a0 = traj.actions[:, 0]
  np.testing.assert_array_equal(lab["credit"][:, 0], np.where(a0 == need, 1.0, -1.0))
  assert np.all(lab["credit"][:, 1:] == 0.0)
  # Ties everywhere: the stderr is the tie bound of the declared range, never 0.
  assert np.all(lab["credit_bounded"]) and np.all(lab["credit_stderr"] > 0)
  assert env.horizon == 10 and np.all(traj.mask)


def test_memory_chain_credit_is_at_the_last_step():
  """MemoryChain: the context shown at t = 0 must be repeated by the last action."""
  _, _, traj, lab = _label("gymnax:MemoryChain-bsuite", 16, 4, horizon=8)
  T = int(traj.mask[0].sum())
  assert T == 6 and np.all(traj.mask.sum(1) == T)  # memory_length 5: six steps
  # Under `uniform` on two actions credit is the last step's reward: +1 where the answer
  # a_{T-1} is the queried context bit, -1 where it is not (computed here from the state).
  es = traj.states.env_state
  context, query = np.asarray(es.context)[:, 0], np.asarray(es.query)[:, 0]
  answer = np.take_along_axis(context, query[:, None], 1)[:, 0] if context.ndim > 1 else context
  want = np.where(traj.actions[:, T - 1] == answer, 1.0, -1.0)
  assert 0 < (want > 0).sum() < want.size  # both outcomes occur among the episodes
  np.testing.assert_array_equal(lab["credit"][:, T - 1], want)
  assert np.all(lab["credit"][:, : T - 1] == 0.0)


@pytest.mark.parametrize(("name", "p_take"), [("umbrella_logits", 0.8808), ("umbrella_probs", 0.9)])
def test_jax_policies_give_probabilities_or_logits(name, p_take):
  env, pi, _, _ = _label("gymnax:UmbrellaChain-bsuite", 1, 2, policy=f"adapter_policies:{name}",
                         horizon=10)  # fmt: skip
  state = env.reset(jax.random.key(0), env.default_params())
  probs = np.asarray(pi.probs(pi.default_params(), state, env.default_params()))
  np.testing.assert_allclose(probs, [1 - p_take, p_take], atol=1e-4)


def test_bad_gymnax_specs_are_one_line_errors(tmp_path):
  out = str(tmp_path / "x")
  proc = run_cli("label", "--env", "gymnax:NoSuchEnv-v0", "--episodes", "2", "--out", out)
  assert_one_line_error(proc, "gymnax:NoSuchEnv-v0")
  proc = run_cli("label", "--env", "gymnax:CartPole-v1", "--episodes", "2", "--out", out,
                 "--policy", "adapter_policies:no_such_fn")  # fmt: skip
  assert_one_line_error(proc, "--policy")


def test_without_the_adapters_extra_the_error_names_it(tmp_path, monkeypatch):
  """An installed package without gymnax: the one line says which extra brings it (it said
  `pip install -e .[adapters]`, advice for a checkout only)."""
  import sys

  monkeypatch.setitem(sys.modules, "gymnax", None)  # `import gymnax` raises ImportError
  proc = run_cli("label", "--env", "gymnax:Catch-bsuite", "--episodes", "2",
                 "--out", tmp_path / "x")  # fmt: skip
  assert_one_line_error(proc, "pip install 'hindsight[adapters]'")


def test_a_job_with_a_return_range_describes_itself_as_its_json_reads_back():
  """The job description a rerun compares with the dataset's metadata survives its JSON
  round trip (a tuple range once read back as a list refused every rerun)."""
  import json

  from hindsight.labeling import LabelJob

  job = LabelJob("gymnax:MemoryChain-bsuite", 4, LabelConfig(), return_range=(-1.0, 1.0))
  assert job.describe() == json.loads(json.dumps(job.describe()))


def test_discounting_chain_credit_is_the_choice_of_chain_only():
  """DiscountingChain: a_0 picks a chain whose reward comes at its own step; nothing later
  matters. Credit is exactly 0 after t = 0, and at t = 0 it is R(a_0) - mean_a R(a) (R(a):
  chain a's reward if it arrives within the horizon), within the labels' stderr."""
  H = 12
  _, _, traj, lab = _label("gymnax:DiscountingChain-bsuite", 32, 32, horizon=H,
                           return_range=(-1.0, 2.0))  # fmt: skip
  assert np.all(lab["credit"][:, 1:][traj.mask[:, 1:]] == 0.0)
  es = traj.states.env_state
  rewards = np.asarray(es.rewards)[:, 0]  # [E, 5], drawn at reset
  reward_steps = np.array([1, 3, 10, 30, 100])
  R = np.where(reward_steps[None] < H, rewards, 0.0)  # [E, 5]
  a0 = traj.actions[:, 0]
  exact = R[np.arange(a0.size), a0] - R.mean(1)
  z = (lab["credit"][:, 0] - exact) / np.maximum(lab["credit_stderr"][:, 0], 1e-9)
  assert np.sqrt(np.mean(z**2)) < 2.0 and np.mean(np.abs(exact) > 1e-3) > 0.5, (z, exact)


def _credit(labels):
  return np.stack([np.asarray(labels[i]["credit"]) for i in range(len(labels))])


@pytest.mark.slow
def test_memory_chain_through_label_train_eval_score_serve_and_audit(tmp_path):
  """A gymnax environment nobody here wrote, the way a new user takes it: label (without a
  return range, and with one: killed, then rerun), `hindsight train`, eval, score, serve
  with default flags, audit. The horizon comes from the episodes (6 steps, not gymnax's
  declared 1000), every verdict is finite, and the credit has the known structure: +-1 at the
  last step (the answer against the context), exactly 0 before."""
  import json
  import signal
  import subprocess
  import time

  from conftest import CLI_FLAGS, ROOT, wait_until_ready

  from hindsight.data import open_labels
  from hindsight.model.predictor import Predictor
  from hindsight.serving import Client

  env = "gymnax:MemoryChain-bsuite"
  base = ["label", "--env", env, "--episodes", 64, "--rollouts", 8, "--replacement", "uniform",
          "--no-progress"]  # fmt: skip
  plain = run_cli(*base, "--out", tmp_path / "plain")
  assert plain.returncode == 0, plain.stderr
  assert "horizon 6, the longest of the job's 64 episodes" in plain.stderr
  assert "declares 1000" in plain.stderr and "no --return-range" in plain.stderr
  plain_labels = open_labels(str(tmp_path / "plain"))
  credit = _credit(plain_labels)
  assert credit.shape == (64, 6) and plain_labels.metadata.horizon == 6
  assert np.all(credit[:, :5] == 0.0) and np.all(np.abs(credit[:, 5]) == 1.0)
  assert 10 < (credit[:, 5] > 0).sum() < 54  # both outcomes occur

  # With a return range, in chunks of 16; killed after its first chunk, then rerun.
  labels_dir = tmp_path / "labels"
  argv = [*HINDSIGHT_CLI, *map(str, base), "--return-range=-1:1", "--chunk-size", "16",
          "--out", str(labels_dir)]  # fmt: skip
  environ = dict(os.environ, XLA_FLAGS=CLI_FLAGS)
  proc = subprocess.Popen(argv, cwd=ROOT, env=environ, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 240
  chunks = labels_dir / "_chunks"
  while not (chunks.is_dir() and any(f.endswith(".npz") for f in os.listdir(chunks))):
    assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  # The rerun as the killed job ran: in a process at its device count (the chunk size is
  # rounded to the devices' micro-batches).
  resume = [*base, "--return-range=-1:1", "--chunk-size", 16, "--out", labels_dir]
  rerun = run_cli(*resume, process=True)
  assert rerun.returncode == 0, rerun.stderr
  files = sorted(os.listdir(labels_dir))
  again = run_cli(*resume, process=True)
  assert again.returncode == 0, again.stderr  # finished: recognised, nothing rewritten
  assert sorted(os.listdir(labels_dir)) == files
  labels = open_labels(str(labels_dir))
  np.testing.assert_array_equal(_credit(labels), credit)  # the range changes stderrs only
  se = np.stack([np.asarray(labels[i]["credit_stderr"]) for i in range(64)])
  assert (
    np.isfinite(se).all()
    and np.isinf(np.stack([np.asarray(plain_labels[i]["credit_stderr"]) for i in range(64)])).any()
  )
  assert labels.metadata.job_description["return_range"] == [-1.0, 1.0]
  # Standard JSON out: no Infinity or NaN tokens even where stderrs are unbounded.
  exported = run_cli("export", tmp_path / "plain")
  assert exported.returncode == 0 and "Infinity" not in exported.stdout
  rows = [json.loads(line) for line in exported.stdout.splitlines()]
  assert rows[0]["credit_stderr"][0] is None

  # Train from the installed command (the generic config by default), small.
  run = tmp_path / "run"
  trained = run_cli("train", "--labels", labels_dir, "--workdir", run,
                    "--config.train.steps=200", "--config.train.eval_every=100",
                    "--config.model.width=16", "--config.model.depth=1",
                    "--config.model.num_heads=2", "--config.optim.warmup_steps=10",
                    "--config.data.batch_size=8", "--config.train.progress=False")  # fmt: skip
  assert trained.returncode == 0, trained.stderr
  assert "Spearman undefined (tied labels)" in trained.stdout and "zero_ties" in trained.stdout
  predictor = Predictor.load(str(run))
  assert predictor.spec.max_length == 6

  # eval: the reference relabels with the labels' return range; verdicts are finite or say
  # why they are undefined.
  ev = run_cli("eval", "--checkpoint", run, "--check-episodes", 8, "--shift", "none",
               "--baseline-steps", 0, "--gradient-env", "none", "--bootstrap", 20,
               "--no-progress")  # fmt: skip
  assert ev.returncode == 0, ev.stderr
  report = json.loads((run / "drift" / "report.json").read_text())
  assert report["reference"]["exact_zero_share"] > 0.8
  assert "K undefined" in ev.stdout and "exactly 0 on" in ev.stdout
  coverage = report["calibration"]["coverage"]["95%"]["value"]
  assert np.isfinite(coverage) and report["headline"]["model (point)"]["mae"]["value"] < 0.2

  # score: the model learned the structure (the last step's sign, ~0 before).
  episodes = [json.loads(line) for line in exported.stdout.splitlines()]
  src = tmp_path / "eps.jsonl"
  src.write_text("".join(json.dumps(e) + "\n" for e in episodes))
  scored = run_cli("score", "--checkpoint", run, "--input", src, "--out", tmp_path / "s.jsonl",
                   "--no-progress")  # fmt: skip
  assert scored.returncode == 0, scored.stderr
  lines = (tmp_path / "s.jsonl").read_text().splitlines()
  pred = np.array([json.loads(x)["predicted_credit"] for x in lines])
  assert np.mean(np.sign(pred[:, 5]) == np.sign(credit[:, 5])) > 0.9
  assert np.abs(pred[:, :5]).max() < 0.2
  first = episodes[0]
  longer = {"observations": [first["observations"][0]] * 7, "actions": [0] * 7,
            "rewards": [0.0] * 7, "success": False}  # fmt: skip
  with pytest.raises(HindsightError, match="longer than the 6"):
    predictor.score([longer])

  # serve with default flags: ready (buckets of the trained length), answers equal score.
  port = 19000 + os.getpid() % 1000
  server = subprocess.Popen([*HINDSIGHT_CLI, "serve", "--checkpoint", str(run), "--port",
                             str(port)], cwd=ROOT, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
  try:
    client = Client(f"http://127.0.0.1:{port}")
    wait_until_ready(client, server)
    out = client.credit([{k: e[k] for k in ("observations", "actions", "rewards", "success")}
                         for e in episodes[:4]])  # fmt: skip
    np.testing.assert_allclose(np.asarray(out["credit"]), pred[:4], atol=1e-5)
  finally:
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)

  # audit: the labels' return range reaches the confidence sequence (finite); the labels
  # made without one are refused in one line, never a NaN read as "no alarm".
  audit = run_cli("audit", "--checkpoint", run, "--env", env, "--budget", 20000, "--out",
                  tmp_path / "audit", "--no-progress")  # fmt: skip
  assert audit.returncode == 0, audit.stderr
  result = json.loads((tmp_path / "audit" / "report.json").read_text())
  assert np.isfinite(result["gap"]["confidence_sequence"]).all(), result["gap"]
  assert np.isfinite(result["alarm"]["gap_range"]).all() and not result["verdict"]["alarm"]
  refused = run_cli("audit", "--checkpoint", run, "--trajectories", tmp_path / "plain",
                    "--budget", 20000, "--out", tmp_path / "audit2", "--no-progress")  # fmt: skip
  assert_one_line_error(refused, "declares no range for its returns")
