"""The drift harness end to end: the Predictor, the reference, and `hindsight eval` on :smoke runs.

One tabular and one reasoning :smoke run are trained per module (seconds each); every test
reads them, none writes into them (reports go to tmp_path).
"""

import dataclasses
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, run_cli, trained_run

from hindsight.credit import tabular_values
from hindsight.data import episode_to_json, open_labels
from hindsight.drift import DriftConfig, held_out_split, reference_credit, run_drift
from hindsight.drift import reference as ref_lib
from hindsight.drift.render import headline_text
from hindsight.envs import make
from hindsight.errors import HindsightError
from hindsight.files import json_safe
from hindsight.labeling import trajectories as tr
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.engine import Labeler, episode_key, to_numpy
from hindsight.model.batching import EpisodeReader, make_batch
from hindsight.model.predictor import MODEL_FILE, Predictor, load_predictor

pytestmark = pytest.mark.xdist_group("drift")


@pytest.fixture(scope="module")
def reasoning_run(tmp_path_factory):
  return trained_run(tmp_path_factory, "reasoning_run", "configs/reasoning.py:smoke")


def _test_episodes(workdir, n=8):
  with open(os.path.join(workdir, "splits.json")) as f:
    run = json.load(f)
  labels = open_labels(run["labels"])
  return labels, np.asarray(run["test"][:n])


def test_credit_fn_inside_a_users_jit_equals_score(tabular_run):
  predictor = Predictor.load(tabular_run)
  labels, ids = _test_episodes(tabular_run)
  episodes = [episode_to_json(labels[int(i)]) for i in ids]  # plain JSON types, as served
  scores = predictor.score(episodes)
  batch = predictor.batch(episodes)
  fn = predictor.credit_fn()

  @jax.jit
  def users_program(state, batch):  # e.g. inside an RL update
    out = fn(state, batch)
    return out["credit"] * 2.0, out

  doubled, out = users_program(predictor.state, batch)
  for row, sc in enumerate(scores):
    n = len(episodes[row]["actions"])
    np.testing.assert_allclose(out["credit"][row, :n], sc["credit"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["std"][row, :n], sc["std"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(doubled[row, :n], 2 * sc["credit"], rtol=1e-5, atol=1e-6)
    assert sc["klass"].dtype.kind == "i" and np.all((sc["p_zero"] >= 0) & (sc["p_zero"] <= 1))
  # A whole label dataset scores as it is, in order.
  everything = predictor.score(labels)
  assert len(everything) == len(labels)
  np.testing.assert_allclose(everything[int(ids[0])]["credit"], scores[0]["credit"], atol=1e-6)


def test_in_memory_batch_equals_the_dataset_batch(tabular_run):
  predictor = Predictor.load(tabular_run)
  labels, ids = _test_episodes(tabular_run)
  from_disk = make_batch(EpisodeReader(labels), ids, 24, predictor.spec)
  in_memory = predictor.batch([episode_to_json(labels[int(i)]) for i in ids], pad=24)
  for name in ("observations", "actions", "rewards", "mask", "success"):
    np.testing.assert_array_equal(in_memory[name], from_disk[name], err_msg=name)
  # Label fields of scored-only episodes stay out of the loss mask.
  bare = [{k: e[k] for k in ("observations", "actions", "rewards")} for e in
          map(episode_to_json, (labels[int(i)] for i in ids))]  # fmt: skip
  bare_batch = predictor.batch(bare, pad=24)
  assert bare_batch["mask"].any() and not bare_batch["label_mask"].any()
  np.testing.assert_array_equal(bare_batch["success"], from_disk["success"])


def test_bfloat16_compute_scores_like_float32(tabular_run):
  """The same parameters with the blocks computing in bfloat16 (ModelConfig.compute_dtype):
  within 5% of the credit scale at every step, the ranking all but unchanged. (The demo
  model, scored so by hand once: max 1.9% of the scale, Spearman 0.99998.)"""
  from scipy import stats

  from hindsight.model.programs import model_graph

  predictor = Predictor.load(tabular_run)
  cfg = dataclasses.replace(predictor.model_config, compute_dtype="bfloat16")
  graphdef, _ = model_graph(cfg, predictor.spec)
  bf16 = Predictor(graphdef, predictor.state, predictor.spec, cfg, predictor.step)
  labels, ids = _test_episodes(tabular_run, 32)
  episodes = [episode_to_json(labels[int(i)]) for i in ids]
  a = np.concatenate([s["mean"] for s in predictor.score(episodes)])
  b = np.concatenate([s["mean"] for s in bf16.score(episodes)])
  assert np.max(np.abs(a - b)) <= 0.05 * predictor.spec.value_scale
  assert stats.spearmanr(a, b)[0] > 0.99
  assert not np.array_equal(a, b)  # it did compute in another precision


def test_predictor_applies_the_steps_fitted_sigma_scale(tabular_run, tmp_path):
  calibrated, raw = Predictor.load(tabular_run), Predictor.load(tabular_run, calibrated=False)
  step_dir = os.path.join(tabular_run, "checkpoints", str(calibrated.step))
  with open(os.path.join(step_dir, "calibration.json")) as f:
    fitted = json.load(f)
  assert fitted["step"] == calibrated.step and raw.sigma_scale == 1.0
  # The calibration travels with its step: a step copied into another run keeps it, and
  # the step's manifest covers it.
  copy = tmp_path / "copy" / "checkpoints"
  shutil.copytree(os.path.join(tabular_run, "checkpoints"), copy)
  assert Predictor.load(str(tmp_path / "copy"), calibrated.step).sigma_scale == pytest.approx(
    fitted["sigma_scale"]
  )
  with open(os.path.join(step_dir, "hindsight_manifest.json")) as f:
    assert "calibration.json" in json.load(f)["sha256"]
  assert calibrated.sigma_scale == pytest.approx(fitted["sigma_scale"]) != 1.0
  labels, ids = _test_episodes(tabular_run, 8)
  episodes = [episode_to_json(labels[int(i)]) for i in ids]
  a, b = calibrated.score(episodes)[0], raw.score(episodes)[0]
  np.testing.assert_allclose(a["sigma"], b["sigma"] * fitted["sigma_scale"], rtol=1e-5)
  np.testing.assert_array_equal(a["credit"], b["credit"])  # the point prediction is untouched
  assert calibrated.describe()["sigma_scale"] == calibrated.sigma_scale


def test_ensemble_is_the_mixture_of_its_members(tabular_run):
  """An ensemble of a model with itself scores like the model; with another member (the same
  parameters x 0.9) it is the equal-weight mixture of the two members' mixtures."""
  single = Predictor.load(tabular_run)
  labels, ids = _test_episodes(tabular_run, 6)
  episodes = [episode_to_json(labels[int(i)]) for i in ids]
  twice = load_predictor(f"{tabular_run},{tabular_run}")
  assert twice.members == 2 and twice.describe()["members"] == 2
  a, b = single.score(episodes), twice.score(episodes)
  for x, y in zip(a, b, strict=True):
    for k in ("credit", "mean", "std", "p_zero", "mu", "sigma", "klass", "klass_head"):
      np.testing.assert_allclose(y[k], x[k], rtol=1e-5, atol=1e-6, err_msg=k)
  other = Predictor(
    single.graphdef, jax.tree.map(lambda p: p * 0.9, single.state), single.spec,
    single.model_config, single.step, single.sigma_scale,
  )  # fmt: skip
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), single.state, other.state)
  pair = Predictor(single.graphdef, stacked, single.spec, single.model_config, [0, 0],
                   [single.sigma_scale] * 2)  # fmt: skip
  got = pair.score(episodes)
  for s1, s2, e in zip(a, other.score(episodes), got, strict=True):
    p0 = (s1["p_zero"] + s2["p_zero"]) / 2
    mean = (s1["mean"] + s2["mean"]) / 2
    second = sum((1 - s["p_zero"]) * (s["sigma"] ** 2 + s["mu"] ** 2) for s in (s1, s2)) / 2
    np.testing.assert_allclose(e["p_zero"], p0, rtol=1e-5)
    np.testing.assert_allclose(e["mean"], mean, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(e["std"], np.sqrt(second - mean**2), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(e["credit"], np.where(p0 > 0.5, 0, mean / (1 - p0)), rtol=1e-4,
                               atol=1e-6)  # fmt: skip


def test_predictor_bad_input_is_one_line(tabular_run, tmp_path):
  predictor = Predictor.load(tabular_run)
  labels, ids = _test_episodes(tabular_run, 1)
  ep = episode_to_json(labels[int(ids[0])])
  for bad, fragment in (
    ({k: v for k, v in ep.items() if k != "rewards"}, "missing field 'rewards'"),
    (dict(ep, actions=[99] * len(ep["actions"])), "outside [0,"),
    (dict(ep, rewards=ep["rewards"][:-1]), "'rewards' must be"),
  ):
    with pytest.raises(HindsightError, match=r"episode 0: ") as e:
      predictor.score([bad])
    assert fragment in str(e.value) and "\n" not in str(e.value)
  # A checkpoint without its model file (saved before it existed) is refused: retrain.
  import shutil

  old = tmp_path / "old"
  shutil.copytree(os.path.join(tabular_run, "checkpoints"), old / "checkpoints")
  for step in os.listdir(old / "checkpoints"):
    if step.isdigit():
      os.remove(old / "checkpoints" / step / MODEL_FILE)
  with pytest.raises(HindsightError, match=r"older hindsight.*retrain"):
    Predictor.load(str(old))
  with pytest.raises(HindsightError, match="not a kept checkpoint"):
    Predictor.load(tabular_run, step=7)


def test_reference_keys_are_independent_and_trajectories_regenerate(tabular_run):
  labels, ids = _test_episodes(tabular_run, 16)
  meta = labels.metadata
  env, policy = make(meta.env)
  base = LabelConfig.from_metadata(meta)
  labeler = Labeler(env, policy, base)
  eps = [labels[int(i)] for i in ids]
  traj = tr.regenerate(
    labeler, meta.seed, ids, [e["actions"] for e in eps], [e["rewards"] for e in eps]
  )
  # With the labels' own keys the relabel reproduces the stored labels bit for bit ...
  same = tr.label_trajectories(
    labeler, traj, jax.vmap(episode_key, (None, 0))(meta.seed, ids), progress=False
  )
  # ... with the reference's keys it is an independent estimate of the same quantity.
  other = tr.label_trajectories(
    labeler, traj, ref_lib.reference_keys(meta.seed, ids), progress=False
  )
  for row, e in enumerate(eps):
    n = len(e["actions"])
    np.testing.assert_array_equal(same["credit"][row, :n], e["credit"])
  stored = np.concatenate([e["credit"] for e in eps])
  fresh = np.concatenate([other["credit"][r, : len(e["actions"])] for r, e in enumerate(eps)])
  assert not np.array_equal(stored, fresh)
  # A dataset whose episodes do not regenerate is refused in one line.
  with pytest.raises(HindsightError, match="does not regenerate"):
    tr.regenerate(labeler, meta.seed + 1, ids, [e["actions"] for e in eps],
                       [e["rewards"] for e in eps])  # fmt: skip


def test_mc_reference_is_honest_against_the_dp_on_a_tabular_mdp():
  """The MC relabel's stderrs against the exact DP: z RMS about 1 (the check the harness
  runs on tabular environments)."""
  env, policy = make("tabular:data/key_corridor.npz")
  cfg = ref_lib.reference_config(_base(), 64)
  mc = Labeler(env, policy, cfg)
  exact = Labeler(env, policy, ref_lib.reference_config(_base(), 2, exact=True))
  ids = np.arange(96)
  traj = to_numpy(mc.sample(jax.vmap(episode_key, (None, 0))(5, ids)))
  keys = ref_lib.reference_keys(5, ids)
  a = tr.label_trajectories(mc, traj, keys, progress=False)
  b = tr.label_trajectories(exact, traj, keys, progress=False)
  check = ref_lib.check_against_exact(a, b, np.asarray(traj.mask))
  assert check["steps"] > 300 and 0.85 <= check["z_rms"] <= 1.15, check
  second = tr.label_trajectories(mc, traj, ref_lib.reference_keys(5, ids, 1), progress=False)
  passes = ref_lib.check_passes(a, second, np.asarray(traj.mask))
  assert 0.75 <= passes["variance_ratio"] <= 1.3, passes


def test_noise_ceiling_is_what_the_true_credit_scores_against_one_pass():
  """Continuous credits c and two passes c + noise: sqrt(Spearman(a, b)) is the Spearman of
  c itself against one pass (what `check_passes` reports as the reference's ceiling)."""
  from scipy import stats

  rng = np.random.default_rng(0)
  c = rng.standard_t(4, size=(400, 20)) * 0.05
  se = np.full(c.shape, 0.03)
  passes = [{"credit": c + rng.normal(size=c.shape) * se, "credit_stderr": se,
             "credit_bounded": np.zeros(c.shape, bool)} for _ in range(2)]  # fmt: skip
  check = ref_lib.check_passes(*passes, np.ones(c.shape, bool))
  truth = stats.spearmanr(c.ravel(), passes[0]["credit"].ravel())[0]
  assert 0.6 < truth < 0.95  # noisy enough for the ceiling to matter
  assert check["spearman_ceiling"] == pytest.approx(truth, abs=0.01), (check, truth)
  assert 0.8 <= check["variance_ratio"] <= 1.2


def _base():
  from hindsight.labeling.config import LabelConfig

  return LabelConfig(num_rollouts=8)


def test_choose_rollouts_scales_with_the_labels_noise():
  rng = np.random.default_rng(0)
  n = 100_000
  # Labels whose noise (stderr 0.5) is half the signal's spread (1): K = K_L (0.5 / 0.1)^2.
  credit = rng.normal(size=n) + 0.5 * rng.normal(size=n)
  k = ref_lib.choose_rollouts(credit, np.full(n, 0.5), 32, 0.1)
  assert k == 1024  # 800 rounded up to a power of two
  assert ref_lib.choose_rollouts(credit, np.full(n, 0.01), 32, 0.1) == 128  # >= 4 K_L
  # Tie bounds are conservative intervals, not noise: they do not raise K.
  stderr = np.where(np.arange(n) % 2 == 0, 5.0, 0.5)
  assert ref_lib.choose_rollouts(credit, stderr, 32, 0.1, bounded=np.arange(n) % 2 == 0) == 1024


@pytest.mark.slow
def test_eval_program_smoke_on_a_tabular_run(tabular_run, tmp_path):
  out = tmp_path / "drift"
  proc = run_cli(
    "eval", "--checkpoint", tabular_run, "--episodes", 6, "--check-episodes", 8,
    "--shift", "none", "--baseline-steps", 20, "--gradient-episodes", 1024, "--bootstrap", 20,
    "--out", out, "--no-progress", timeout=600,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  assert "Spearman vs reference" in proc.stdout and "report.md" in proc.stdout
  report = json.loads((out / "report.json").read_text())
  assert report["reference"]["kind"] == "exact DP"
  # The check pass (MC at K_ref) against the DP: stderrs honest within sampling noise.
  assert 0.7 < report["reference"]["check"]["z_rms"] < 1.35, report["reference"]["check"]
  signals = report["headline"]
  for name in ("model (point)", "training labels (MC, K=32)", "outcome R", "learned PRM",
               "TD advantage", "RUDDER (return decomposition)", "MC progress (soft)"):  # fmt: skip
    assert name in signals, name
    assert set(signals[name]["spearman"]) == {"value", "lo", "hi"}
  # On the exact reference, labels with K = 32 are noisy but unbiased: positive Spearman.
  assert signals["training labels (MC, K=32)"]["spearman"]["value"] > 0.3
  assert report["equivalent_rollouts"]["model_flops_per_step"] > 0
  rows = report["gradient"]["rows"]
  # Credit under policy_other is A / (1 - pi): a biased gradient, far above its noise floor;
  # under policy it is the advantage: unbiased, near its floor.
  other, plain = rows["exact policy_other"], rows["exact policy"]
  assert other["bias_db"] > other["bias_floor_db"] + 10, other
  assert plain["bias_db"] < plain["bias_floor_db"] + 6, plain
  md = (out / "report.md").read_text()
  assert "## Headline" in md and "## Policy gradient" in md and "## Drift slices" in md
  for png in ("scatter.png", "reliability.png", "tags.png", "slices.png", "gradient.png"):
    assert os.path.getsize(out / png) > 1000, png
  # The reference is cached, and a notebook finds it: `reference_credit` loads the same
  # arrays (no file added), and they are the DP credit of the test episodes, recomputed
  # here from the Q table.
  cached = sorted(os.listdir(out / "cache"))
  assert any(f.startswith("reference-") for f in cached)
  labels, ids = held_out_split(tabular_run)
  got = reference_credit(tabular_run, episodes=6, cache=str(out / "cache"), progress=False)
  assert sorted(os.listdir(out / "cache")) == cached
  assert [len(e) for e in got.episodes] == [len(labels[int(i)]["actions"]) for i in ids[:6]]
  env, _ = make(labels.metadata.env)
  q_table, _ = tabular_values(env.mdp)
  for row, i in enumerate(ids[:6]):
    ex = labels[int(i)]
    s_t, a_t = np.asarray(ex["states"]), np.asarray(ex["actions"])
    q = q_table[np.arange(len(a_t)), s_t]  # [T, A]; the policy replacement: q(a') = pi
    want = q[np.arange(len(a_t)), a_t] - (env.mdp.pi[s_t] * q).sum(-1)
    np.testing.assert_allclose(got.reference["credit"][row, : len(a_t)], want, atol=1e-5)


@pytest.mark.slow
def test_eval_mc_reference_shifts_and_baselines_on_a_reasoning_run(reasoning_run, tmp_path):
  cfg = DriftConfig(
    checkpoint=reasoning_run,
    episodes=6,
    reference_rollouts=32,
    check_episodes=6,
    shift_episodes=8,
    baseline_steps=10,
    gradient_env="",
    bootstrap=20,
    out=str(tmp_path / "drift"),
    progress=False,
  )
  report = run_drift(cfg)
  assert report["reference"]["kind"] == "MC relabel" and report["reference"]["rollouts"] == 32
  check = report["reference"]["check"]
  assert check["steps"] > 10 and np.isfinite(check["variance_ratio"])
  names = [s["slice"] for s in report["slices"]]
  assert "shift: reasoning:horizon=30" in names and "outcome: success" in names
  assert "verify" in report["per_tag"]["tags"] or "fact" in report["per_tag"]["tags"]
  # Rerun: the finished report is read back (nothing recomputed); the cache holds the
  # reference, the check pass, two shifted sets and the three learned baselines.
  again = run_drift(cfg)

  def same(a, b):
    return json.dumps(json_safe(a), sort_keys=True) == json.dumps(json_safe(b), sort_keys=True)

  assert same(again["headline"], report["headline"])
  assert again["seconds"] == report["seconds"]
  # The console headline lists the signals in the order the report's tables do, rerun too.
  assert headline_text(again) == headline_text(report)
  assert headline_text(report).splitlines()[1].lstrip().startswith("model (point)")
  cached = os.listdir(tmp_path / "drift" / "cache")
  assert len(cached) == 7, cached
  _readme_section_is_rendered_from(reasoning_run, tmp_path / "drift" / "report.json", tmp_path)
  # Without the report, the same inputs recompute it from the cache: the same numbers.
  os.remove(tmp_path / "drift" / "report.inputs")
  assert same(run_drift(cfg)["headline"], again["headline"])
  assert sorted(os.listdir(tmp_path / "drift" / "cache")) == sorted(cached)
  # Per tag in credit units, recomputed here from the run's own arrays: the cached reference
  # (through `reference_credit`) and the dataset's labels and tags.
  ref_set = reference_credit(
    reasoning_run, episodes=6, reference_rollouts=32, cache=str(tmp_path / "drift" / "cache"),
    progress=False,
  )  # fmt: skip
  labels, ids = held_out_split(reasoning_run)
  pairs = {}
  for row, i in enumerate(ids[:6]):
    ex = labels[int(i)]
    n = len(ex["actions"])
    ref = ref_set.reference["credit"][row, :n]
    for t, r, lab in zip(ex["tags"], ref, ex["credit"][:n], strict=True):
      if np.isfinite(r) and np.isfinite(lab):
        pairs.setdefault(t.decode() if isinstance(t, bytes) else str(t), []).append((r, lab))
  assert set(report["tag_means"]) == set(pairs)
  for tag, row in report["tag_means"].items():
    ref, lab = np.asarray(pairs[tag]).T
    assert row["steps"] == ref.size, tag
    assert row["reference"]["value"] == pytest.approx(ref.mean(), abs=1e-6), tag
    got = row["training labels (MC, K=8)"]
    assert got["mean"]["value"] == pytest.approx(lab.mean(), abs=1e-6), tag
    assert got["gap"]["value"] == pytest.approx((lab - ref).mean(), abs=1e-6), tag
    relative = abs(got["gap"]["value"]) / abs(ref.mean()) if ref.mean() else None
    assert got["relative"] == pytest.approx(relative, rel=1e-5)
  # An ensemble of the run with itself, scored from the same cache: the model's numbers.
  ensemble = run_drift(
    dataclasses.replace(
      cfg, checkpoint=f"{reasoning_run},{reasoning_run}", shifts=(), baseline_steps=0,
      out=str(tmp_path / "ensemble"), cache=str(tmp_path / "drift" / "cache"),
    )
  )  # fmt: skip
  assert ensemble["model"]["members"] == 2
  for m in ("spearman", "mae"):
    got, want = ensemble["headline"]["model (point)"][m], report["headline"]["model (point)"][m]
    assert got["value"] == pytest.approx(want["value"], abs=1e-5), m
  assert sorted(os.listdir(tmp_path / "drift" / "cache")) == sorted(cached)
  # --env: fresh episodes of another spec, no training labels to score beside the model.
  fresh = run_drift(
    dataclasses.replace(cfg, env="reasoning:decorative_rate=0", shifts=(), baseline_steps=0)
  )
  assert fresh["env"] == "reasoning:decorative_rate=0" and fresh["episodes"] == 6
  assert "model (point)" in fresh["headline"]
  assert not any(name.startswith("training labels") for name in fresh["headline"])


def _readme_section_is_rendered_from(run, drift_report, tmp_path):
  """eval/readme_results.py on a :smoke demo (the run's report and its drift report where
  `make demo` leaves them): the README's results section has the rendered section's lines,
  figures apart; a README holding the rendered section passes the check, and one figure
  changed fails it, naming the line."""
  from eval import readme_results

  demo = tmp_path / "demo"
  (demo / "drift").mkdir(parents=True)
  shutil.copy(os.path.join(run, "report.json"), demo / "report.json")
  shutil.copy(drift_report, demo / "drift" / "report.json")
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  named, start, end = readme_results.section(readme)
  assert named == "runs/demo"
  rendered = readme_results.render(str(demo), named)

  def shape(text):  # the words, every figure masked (a figure's width may move a line break)
    numbers = re.sub(r"[+-]?\d(?:[\d,.]*\d)?|n/a", "#", text)
    return " ".join(re.sub(r"# \[#, #\]", "#", numbers).split())  # an interval is a figure

  assert shape(readme[start:end].rstrip("\n")) == shape(rendered)
  # The figures are the reports' own, each in its place (an interval's bound may be
  # undefined on a run this small: n/a).
  with open(drift_report) as f:
    drift = json.load(f)
  flat, check = " ".join(rendered.split()), drift["reference"]["check"]

  def figure(e, digits, bold=False):
    text = lambda x: "n/a" if x is None else f"{x:.{digits}f}"  # noqa: E731
    value = f"**{text(e['value'])}**" if bold else text(e["value"])
    return f"{value} [{text(e['lo'])}, {text(e['hi'])}]"

  model, k_star = drift["headline"]["model (point)"], drift["equivalent_rollouts"]["k"]
  assert (f"| **credit model** (one forward pass) | {figure(model['spearman'], 3, True)} | "
          f"{figure(model['mae'], 4, True)} |") in rendered  # fmt: skip
  assert f"Spearman **{check['spearman_ceiling']:.3f}**" in flat
  assert f"agree at {check['spearman_between_passes']:.3f})" in flat
  assert f"**K = {figure(k_star, 1)}**" in flat
  assert f"{k_star['value'] / drift['label_rollouts']:.1f} times its labels'" in flat
  contrast = {k: v["value"] for k, v in drift["per_tag"]["contrast"].items()}
  assert (f"the reference {contrast['reference']:+.2f}, the model "
          f"{contrast['model (point)']:+.2f}, the learned process reward model "
          f"{contrast['learned PRM']:+.2f}.") in flat  # fmt: skip
  assert "(cosine decay to the last step, the model scored)" in flat
  page = tmp_path / "README.md"
  page.write_text(readme[:start] + rendered + "\n" + readme[end:])
  assert readme_results.main(["--run", str(demo), "--readme", str(page)]) == 0
  row = next(line for line in rendered.splitlines() if line.startswith("| its training labels"))
  changed = re.sub(r"\d(?=\.\d{3} \[)", lambda m: str((int(m[0]) + 1) % 10), row, count=1)
  assert changed != row
  page.write_text(page.read_text().replace(row, changed))
  assert readme_results.main(["--run", str(demo), "--readme", str(page)]) == 1
  assert readme_results.main(["--run", str(demo), "--readme", str(page), "--write"]) == 0
  assert readme_results.main(["--run", str(demo), "--readme", str(page)]) == 0
  assert page.read_text() == readme[:start] + rendered + "\n" + readme[end:]
  page.write_text(readme[:start] + rendered + "\nA line the reports do not give.\n" + readme[end:])
  assert readme_results.main(["--run", str(demo), "--readme", str(page)]) == 1
  # A run that scored another step than its last says which.
  report = json.loads((demo / "report.json").read_text())
  report.update(evaluated_checkpoint=10, evaluated_by="best")
  (demo / "report.json").write_text(json.dumps(report))
  assert "(scored: step 10, by best)" in " ".join(readme_results.render(str(demo)).split())


def test_eval_bad_input_is_one_line(tmp_path):
  assert_one_line_error(run_cli("eval", "--checkpoint", tmp_path / "nope"), "no checkpoints")
  assert_one_line_error(run_cli("eval", "--checkpoint", tmp_path, "--bootstrap", 3), "--bootstrap")


def test_the_evaluation_pages_predictor_example_runs(tabular_run):
  """docs/evaluation.md's Predictor example as written, on a tabular run: the test split's
  episodes scored by `score` and by `credit_fn` inside a jit agree."""
  with open(os.path.join(ROOT, "docs", "evaluation.md")) as f:
    text = f.read()
  start = text.index("```python", text.index("<!-- predictor-example"))
  code = text[start + len("```python") : text.index("```", start + 3)]
  namespace: dict = {}
  exec(code.replace('"runs/demo"', repr(tabular_run)), namespace)
  scores, out, episodes = namespace["scores"], namespace["out"], namespace["episodes"]
  assert len(scores) == len(episodes) == min(8, len(namespace["test_ids"])) > 0
  for i, (sc, ep) in enumerate(zip(scores, episodes, strict=True)):
    np.testing.assert_allclose(np.asarray(out["credit"])[i, : len(ep)], sc["credit"], atol=1e-6)


def test_eval_defaults_scale_with_the_run():
  """A 7-episode test split of a 64-episode reasoning run trained three 1000-step baselines
  (600 passes over its 51 training episodes), labeled 128 episodes per shifted set and drew a
  key_corridor gradient table that had nothing to do with reasoning. The defaults now follow
  the run; `make demo`'s sizes keep what they had."""
  from hindsight.drift.baselines import scaled_steps
  from hindsight.drift.config import DriftConfig, gradient_env_for, shift_episodes_for

  cfg = DriftConfig(checkpoint="runs/x")
  assert scaled_steps(51) == 100 and scaled_steps(13_107) == 1000 and scaled_steps(400) == 250
  assert shift_episodes_for(cfg, 7) == 32 and shift_episodes_for(cfg, 512) == 128
  assert shift_episodes_for(dataclasses.replace(cfg, shift_episodes=9), 512) == 9
  assert gradient_env_for(cfg, "reasoning", tabular=False) == ""
  assert gradient_env_for(cfg, "key_corridor", tabular=True) == "key_corridor"
  assert gradient_env_for(dataclasses.replace(cfg, gradient_env=""), "key_corridor", True) == ""
  with pytest.raises(HindsightError, match="baseline_steps"):
    dataclasses.replace(cfg, baseline_steps=-2).check()
