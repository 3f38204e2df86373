"""pp_credit's pieces against what they must be (its unbiasedness against the exact policy
gradient is in test_rl_credit.py): the allocation spends the budget where the model is
unsure, the tuned weight follows the model's worth, and the rectifier's alarm fires on a
planted bias, in a run as a user sees it, and stays quiet on an honest model."""

from __future__ import annotations

import glob
import json
import os
import re
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.rl.config import base_config, smoke
from hindsight.rl.sources import prepare
from hindsight.rl.sources.prediction_powered import (
  PredictionPowered,
  allocate,
  pp_signal,
  tuned_weight,
)
from hindsight.rl.task import make_task
from hindsight.rl.trainer import train_and_evaluate


def test_the_allocation_spends_the_budget_in_proportion_to_the_scores():
  """sum p = rho x the valid steps; p proportional to the score between the floor and 1;
  0 on padding; equal scores give rho everywhere."""
  mask = np.ones((4, 10), bool)
  mask[:, 8:] = False
  score = np.tile(np.array([0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 50.0, 9.0, 9.0]), (4, 1))
  p = np.asarray(allocate(jnp.asarray(score), jnp.asarray(mask), 0.3, 0.02))
  assert p[~mask].max() == 0
  assert p[mask].sum() == pytest.approx(0.3 * mask.sum(), rel=1e-4)
  row = p[0, :8]
  assert row[0] == pytest.approx(0.02) and row[7] == pytest.approx(1.0)  # floor, cap
  inner = row[2:7]  # neither floored nor capped: proportional to the score
  np.testing.assert_allclose(inner / inner[0], score[0, 2:7] / score[0, 2], rtol=1e-4)
  flat = allocate(jnp.ones((4, 10)), jnp.asarray(mask), 0.3, 0.02)
  np.testing.assert_allclose(np.asarray(flat)[mask], 0.3, rtol=1e-4)


def test_the_tuned_weight_follows_what_the_model_explains():
  """lam is about 1 for a model that is the labels' mean, about 0 for one unrelated to them,
  0 for one that points the wrong way (clipped), and 0 with no label."""
  key = jax.random.split(jax.random.key(0), 3)
  mu = jax.random.normal(key[0], (64, 16))
  d = mu + 0.3 * jax.random.normal(key[1], mu.shape)
  p = jnp.full(mu.shape, 0.2)
  z = jax.random.bernoulli(key[2], p)
  rows = jnp.ones(mu.shape, bool)
  assert float(tuned_weight(mu, d, z, p, rows)) == pytest.approx(1.0, abs=0.1)
  other = jax.random.normal(jax.random.key(9), mu.shape)
  assert float(tuned_weight(other, d, z, p, rows)) < 0.15
  assert float(tuned_weight(-mu, d, z, p, rows)) == 0.0
  assert float(tuned_weight(mu, d, jnp.zeros_like(z), p, rows)) == 0.0
  # the signal: f alone where no label was drawn, rectified where one was
  f = jnp.full(mu.shape, 0.5)
  a = pp_signal(f, d, z, p, 1.0, rows)
  drawn = np.asarray(z)
  np.testing.assert_allclose(np.asarray(a)[~drawn], 0.5)
  np.testing.assert_allclose(np.asarray(a)[drawn], np.asarray(0.5 + (d - 0.5) / 0.2)[drawn],
                             rtol=1e-5)  # fmt: skip


def _pp_config(**pp):
  c = smoke(base_config())
  c.env, c.source = "reasoning", "pp_credit"
  c.pp.refit_steps = 0
  for k, v in pp.items():
    c.pp[k] = v
  return c


@pytest.fixture(scope="module")
def pp_source():
  c = _pp_config()
  return prepare(make_task(c), c)


def _records(rng, bias: float, n_chunk: int = 1, E: int = 64, H: int = 12):
  """Synthetic chunk records: every valid step's true credit mu ~ N(0, 0.2^2), labels
  D = mu + N(0, 0.1^2) on the steps z ~ Bernoulli(p), and a model f = mu + `bias` on the
  steps of tag 1 (exact elsewhere)."""
  shape = (n_chunk, E, H)
  tags = rng.integers(0, 3, shape)
  mu = rng.normal(0, 0.2, shape)
  f = mu + bias * (tags == 1)
  p = rng.uniform(0.05, 0.5, shape)
  z = rng.uniform(size=shape) < p
  d = np.where(z, mu + rng.normal(0, 0.1, shape), 0.0)
  return {"mask": np.ones(shape, bool), "tags": tags, "f": f, "p": p, "z": z, "d": d,
          "d_stderr": np.where(z, 0.1, 0.0), "d_noise": np.where(z, 0.1, 0.0),
          "lam": np.ones(shape)}  # fmt: skip


def test_the_rectifiers_alarm_fires_on_a_planted_bias_and_not_on_an_honest_model(pp_source):
  """Over 200 runs of 6 chunks each (the run's repeated tests spending alpha = 0.1 between
  them): an honest model's alarm fires in at most alpha of the runs (+ 3 sd), one biased
  by 0.1 on one tag fires in nearly every run, on that tag."""
  source = pp_source
  source.config.eval.alpha, source.config.eval.tolerance = 0.1, 0.02
  rng = np.random.default_rng(0)
  aux = source.aux
  names = source.task.env.tag_names
  fired = {0.0: 0, 0.1: 0}
  for bias in fired:
    for _ in range(200):
      for chunk in range(1, 7):
        _, out = source.between_chunks(aux, None, None, 2 * chunk, 0, _records(rng, bias))
        if out["fired"]:
          fired[bias] += 1
          if bias:
            assert out["slice"] == names[1], out
            assert "credit_drift" in out["warnings"]
          break
  assert fired[0.0] / 200 <= 0.1 + 3 * np.sqrt(0.1 * 0.9 / 200), fired
  assert fired[0.1] / 200 >= 0.95, fired


class _Planted(PredictionPowered):
  """pp_credit whose model over-credits every `fact` step by 1.0."""

  name = "test_pp_planted"

  def model_outputs(self, aux, traj, batch):
    f, s = super().model_outputs(aux, traj, batch)
    fact = self.task.env.tag_names.index("fact")
    return f + 1.0 * (self.task.step_tags(traj) == fact), s


def _tensorboard_texts(workdir: str) -> dict[str, str]:
  """tag -> text of the run's TensorBoard text summaries (TFRecord frames of Event protos)."""
  from tensorboardX.proto import event_pb2

  out = {}
  for path in glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents*")):
    with open(path, "rb") as f:
      data = f.read()
    i = 0
    while i < len(data):
      (length,) = struct.unpack("<Q", data[i : i + 8])
      event = event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
      i += 12 + length + 4
      for value in event.summary.value:
        if value.tensor.string_val:
          out[value.tag] = value.tensor.string_val[0].decode()
  return out


def test_a_planted_bias_warns_on_stderr_the_bar_tensorboard_and_results(
  monkeypatch, tmp_path, capsys
):
  """In a run: the rectifier's alarm on the planted tag reaches the console (a line, and
  the bar's postfix), TensorBoard and results.json; and the bar shows each point's figures
  at that point's count."""
  from hindsight.rl.sources import base

  monkeypatch.setattr(base, "_SOURCES", dict(base._SOURCES))
  base.register_source(_Planted)
  c = _pp_config(rho=0.5, p_min=0.05)
  c.source, c.progress = "test_pp_planted", True
  workdir = str(tmp_path / "run")
  results = train_and_evaluate(c, workdir)
  err = capsys.readouterr().err
  assert "the rectifier puts the credit model's bias on 'fact' steps" in err, err[-3000:]
  assert "warning=credit_drift" in err
  assert "rectifier" in results["warnings"]["credit_drift"]
  with open(os.path.join(workdir, "results.json")) as f:
    assert "credit_drift" in json.load(f)["warnings"]
  texts = _tensorboard_texts(workdir)
  assert any("rectifier" in v for k, v in texts.items() if "credit_drift" in k), texts
  # every bar refresh at count k (k > 0) shows point k's success
  success = {p["update"]: np.mean([s["success"] for s in p["seeds"]]) for p in results["curve"]}
  shown = re.findall(r"(\d+)/4 \[[^\]]*?success=([0-9.]+)", err)
  assert shown, err[-2000:]
  for count, value in shown:
    assert f"{success[int(count)]:.3f}" == value, (count, value, success)


def test_labels_without_a_finite_stderr_leave_the_model_as_it_was():
  """On an environment without return bounds (gymnax without return_range) a tied label
  has an infinite stderr, which the model's loss cannot read: such labels are not fitted
  (the model, and so the signal, stays as it was and finite), and finite ones are."""
  from hindsight.labeling.trajectories import trajectory_batch

  c = _pp_config(refit_steps=3)
  source = prepare(make_task(c), c)
  task = source.task
  traj = source.labeler.sample_under(
    task.policy.default_params(), jax.random.split(jax.random.key(0), 8)
  )
  batch = jax.device_get(trajectory_batch(task.env, traj))
  mask = np.asarray(traj.mask)
  z = mask & (np.arange(mask.shape[1]) % 3 == 0)
  record = {name: np.asarray(batch[name])[None] for name in
            ("observations", "actions", "rewards", "mask", "success")}  # fmt: skip
  record.update(f=np.zeros((1, *mask.shape)), p=np.full((1, *mask.shape), 0.3), z=z[None],
                d=np.where(z, 0.1, 0.0)[None], lam=np.zeros((1, *mask.shape)),
                d_noise=np.where(z, 0.05, 0.0)[None],
                tags=np.zeros((1, *mask.shape), int))  # fmt: skip
  unknown = dict(record, d_stderr=np.where(z, np.nan, 0.0)[None])
  new, out = source.between_chunks(source.aux, None, None, 2, 0, unknown)
  assert not out["fine_tuned"]
  same = jax.tree.leaves(jax.tree.map(lambda a, b: bool((a == b).all()), new["model"],
                                      source.aux["model"]))  # fmt: skip
  assert all(same)
  known = dict(record, d_stderr=np.where(z, 0.05, 0.0)[None])
  new, out = source.between_chunks(source.aux, None, None, 2, 0, known)
  assert out["fine_tuned"] and out["noise_share"] is not None
  leaves = jax.tree.leaves(new["model"])
  assert all(np.isfinite(np.asarray(x)).all() for x in leaves)
  assert any(not np.array_equal(a, b) for a, b in
             zip(leaves, jax.tree.leaves(source.aux["model"]), strict=True))  # fmt: skip


def test_the_variance_split_says_whether_labels_or_model_limit():
  """chunk_statistics on labels D = mu + N(0, 0.1^2) with their stderr 0.1: a model that is
  mu explains what the noise leaves (explained variance about 0.8) and leaves the label
  noise alone in the rectifier (noise share about 1); a model off by N(0, 0.3^2) explains
  less and leaves a noise share near 0.1 / (0.1 + 0.9)."""
  from hindsight.rl.sources.prediction_powered import chunk_statistics

  rng = np.random.default_rng(3)
  r = _records(rng, 0.0, n_chunk=4)
  mu = r["f"]
  r["d"] = np.where(r["z"], mu + rng.normal(0, 0.1, mu.shape), 0.0)
  good = chunk_statistics(r)
  assert good["noise_share"] == pytest.approx(1.0, abs=0.1), good
  assert good["explained_variance"] == pytest.approx(0.8, abs=0.05), good
  r["f"] = mu + rng.normal(0, 0.3, mu.shape)
  bad = chunk_statistics(r)
  assert bad["noise_share"] == pytest.approx(0.1, abs=0.03), bad
  assert bad["explained_variance"] < 0, bad
  tied = dict(r, d_noise=np.zeros(mu.shape))  # every pair tied: no noise, whatever the bound
  assert chunk_statistics(tied)["noise_share"] == 0.0
  # Labels that barely vary (a constant move cost, up to 1e-6) under a model that predicts 0:
  # explained variance is undefined (n/a in the table), not about -1e8.
  flat = dict(r, d=np.where(r["z"], -0.01 + rng.normal(0, 1e-6, mu.shape), 0.0),
              f=np.zeros(mu.shape), d_noise=np.zeros(mu.shape))  # fmt: skip
  assert chunk_statistics(flat)["explained_variance"] is None
  within_noise = dict(r, d=np.where(r["z"], rng.normal(0, 0.05, mu.shape), 0.0),
                      d_noise=np.full(mu.shape, 0.1))  # fmt: skip
  assert chunk_statistics(within_noise)["explained_variance"] is None
