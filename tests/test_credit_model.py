"""The credit model's pieces: loss against scipy, padding invariance, batching, checkpoints."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import flip_byte_in_largest_file
from flax import nnx
from scipy import stats

from hindsight.data import open_labels
from hindsight.errors import HindsightError
from hindsight.model import Checkpoints, CreditModel, ModelConfig, credit_loss, gaussian_nll
from hindsight.model.batching import (
  BatchPlan,
  EpisodeReader,
  bucket_lengths,
  make_batch,
  process_rows,
  split_episodes,
)
from hindsight.model.loss import VARIANCE_FLOOR


@pytest.fixture(scope="module")
def data(synthetic_labels):
  labels = open_labels(synthetic_labels)
  reader = EpisodeReader(labels)
  splits = split_episodes(len(labels), (0.1, 0.1), seed=0)
  lengths, spec = reader.scan(splits["train"], horizon=16)
  return reader, splits, lengths, spec


def test_gaussian_nll_is_the_normal_log_density():
  rng = np.random.default_rng(0)
  mean, y = rng.normal(size=50), rng.normal(size=50)
  log_var, se, scale = rng.normal(size=50), rng.random(50), 2.5
  ours = np.asarray(gaussian_nll(mean, log_var, y, se, scale))
  sd = np.sqrt(np.exp(log_var) + se**2) / scale
  # In units of `scale`, with the variance floor.
  ref = -stats.norm.logpdf(y / scale, loc=mean / scale, scale=np.sqrt(sd**2 + VARIANCE_FLOOR))
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@nnx.jit
def _score(model, batch):
  return model(batch)


def _model(spec, seed=0):
  return CreditModel(ModelConfig(width=16, depth=2, num_heads=2), spec, rngs=nnx.Rngs(seed))


def test_padding_and_batch_neighbours_do_not_change_a_step_score(data):
  reader, splits, _, spec = data
  model = _model(spec)
  # Non-zero heads, so the test sees the transformer's output, not the zero init.
  model.head.kernel[...] = jax.random.normal(jax.random.key(1), model.head.kernel.shape)
  ids = splits["train"][:4]
  short = make_batch(reader, ids, 16, spec)
  long = make_batch(reader, np.concatenate([ids[::-1], [-1, ids[0]]]), 32, spec)
  # Garbage where the mask says padding must not leak into valid steps.
  long["observations"][~long["mask"]] = 1e3
  long["rewards"][~long["mask"]] = 7.0
  a = _score(model, {k: jnp.asarray(v) for k, v in short.items()})
  b = _score(model, {k: jnp.asarray(v) for k, v in long.items()})
  for row in range(4):
    n = short["mask"][row].sum()
    np.testing.assert_allclose(a["mu"][row, :n], b["mu"][3 - row, :n], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a["logits"][row, :n], b["logits"][3 - row, :n], rtol=1e-5, atol=1e-5)


def test_loss_masks_padding_and_undefined_labels(data):
  reader, splits, _, spec = data
  model = _model(spec)
  batch = make_batch(reader, np.array([splits["train"][0], -1]), 16, spec)
  jb = {k: jnp.asarray(v) for k, v in batch.items()}
  out = _score(model, jb)
  loss, metrics = credit_loss(out, jb, model.value_scale[...], class_weight=0.1)
  poisoned = dict(jb)
  poisoned["credit"] = jnp.where(jb["label_mask"], jb["credit"], 1e6)
  poisoned["klass"] = jnp.where(jb["mask"], jb["klass"], 2)
  loss2, _ = credit_loss(out, poisoned, model.value_scale[...], class_weight=0.1)
  assert float(loss) == float(loss2)
  assert float(metrics["label_steps"]) == batch["mask"][0].sum()
  # An undefined (NaN) credit stays a valid step but leaves the regression loss.
  i = int(splits["train"][0])
  saved = reader[i]
  nan_first = np.where(np.arange(len(saved)) == 0, np.nan, 1.0).astype(np.float32)
  reader._cache[i] = dataclasses.replace(saved, credit=nan_first)
  try:
    nan_batch = make_batch(reader, np.array([i]), 16, spec)
  finally:
    reader._cache[i] = saved
  assert nan_batch["mask"][0, 0] and not nan_batch["label_mask"][0, 0]
  assert nan_batch["credit"][0, 0] == 0.0 and nan_batch["label_mask"][0, 1]


def test_exact_zero_target_counts_tied_labels_unless_told_otherwise():
  """z_t = 1 for a label exactly 0 with stderr 0; with zero_ties also for a step whose
  branches all tied (0 with a tie bound as stderr); a nonzero label never counts. The
  label-noise switch drops e_t^2 from the NLL's variance."""
  credit = jnp.array([[0.0, 0.0, 0.3]])
  stderr = jnp.array([[0.05, 0.0, 0.05]])  # a tie bound, a degenerate step, a noisy label
  mask = jnp.ones((1, 3), bool)
  batch = {"credit": credit, "credit_stderr": stderr, "klass": jnp.zeros((1, 3), jnp.int32),
           "mask": mask, "label_mask": mask}  # fmt: skip
  out = {"mu": jnp.full((1, 3), 0.1), "log_var": jnp.full((1, 3), -4.0),
         "zero_logit": jnp.array([[2.0, 2.0, -2.0]]), "logits": jnp.zeros((1, 3, 4)),
         "credit": jnp.zeros((1, 3))}  # fmt: skip

  def bce(z, x):  # -log sigmoid(x) for z = 1, -log(1 - sigmoid(x)) for z = 0
    return np.log1p(np.exp(-x)) if z else np.log1p(np.exp(x))

  scale = jnp.float32(1.0)
  _, ties = credit_loss(out, batch, scale, class_weight=0.0, zero_ties=True)
  _, exact = credit_loss(out, batch, scale, class_weight=0.0)
  np.testing.assert_allclose(ties["zero_bce"], (bce(1, 2) + bce(1, 2) + bce(0, -2)) / 3, rtol=1e-5)
  np.testing.assert_allclose(exact["zero_bce"], (bce(0, 2) + bce(1, 2) + bce(0, -2)) / 3, rtol=1e-5)
  _, exact_labels = credit_loss(out, batch, scale, class_weight=0.0, label_noise=False)
  want = gaussian_nll(out["mu"], out["log_var"], credit, jnp.zeros_like(stderr), scale).mean()
  np.testing.assert_allclose(exact_labels["nll"], want, rtol=1e-6)
  assert float(exact_labels["nll"]) != float(ties["nll"])


def test_splits_are_disjoint_seeded_and_cover_every_episode(data):
  reader, splits, _, _ = data
  all_ids = np.concatenate([splits[k] for k in ("train", "validation", "test")])
  assert sorted(all_ids.tolist()) == list(range(len(reader)))
  again = split_episodes(len(reader), (0.1, 0.1), seed=0)
  other = split_episodes(len(reader), (0.1, 0.1), seed=1)
  assert all(np.array_equal(splits[k], again[k]) for k in splits)
  assert not np.array_equal(splits["test"], other["test"])
  with pytest.raises(HindsightError, match="too few"):
    split_episodes(2, (0.4, 0.4), seed=0)


def test_batch_plan_uses_every_episode_once_per_epoch(data):
  _, splits, lengths, _ = data
  ids = splits["train"]
  pads = bucket_lengths(lengths, 3)
  plan = BatchPlan(ids, lengths[ids], 8, pads, seed=3, shuffle=True)
  e0, e1 = plan.epoch(0), plan.epoch(1)
  assert len(e0) == plan.steps_per_epoch
  for epoch in (e0, e1):
    used = np.concatenate([row for _, row in epoch])
    assert sorted(used[used >= 0].tolist()) == sorted(ids.tolist())
    for pad, row in epoch:  # every episode fits its bucket, and only just
      lens = lengths[row[row >= 0]]
      assert lens.max() <= pad
  assert [r.tolist() for _, r in e0] != [r.tolist() for _, r in e1]
  assert [r.tolist() for _, r in e0] == [r.tolist() for _, r in plan.epoch(0)]
  # Processes read disjoint rows that together make the global batch.
  parts = [process_rows(8, p, 4) for p in range(4)]
  rows = np.arange(8)
  assert np.concatenate([rows[s] for s in parts]).tolist() == rows.tolist()


def test_damaged_checkpoint_is_refused_or_skipped(tmp_path):
  ckpt = Checkpoints(str(tmp_path / "ckpt"), keep=3)
  tree = {"w": jnp.arange(1000, dtype=jnp.float32), "b": jnp.ones(3)}
  ckpt.save(1, tree, val_loss=2.0)
  ckpt.save(2, jax.tree.map(lambda x: x + 1, tree), val_loss=1.0)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
  step, restored = ckpt.restore(abstract)
  assert step == 2 and float(restored["w"][5]) == 6.0
  # Flip one byte in the largest file of step 2: orbax alone would restore wrong values.
  victim = flip_byte_in_largest_file(ckpt.step_dir(2))
  with pytest.raises(HindsightError) as err:
    ckpt.restore(abstract)
  assert "step 2 is damaged" in str(err.value) and victim in str(err.value)
  assert "\n" not in str(err.value)
  step, restored = ckpt.restore(abstract, fallback=True)
  assert step == 1 and float(restored["w"][5]) == 5.0
  assert ckpt.steps() == [1]
  assert os.path.isdir(str(tmp_path / "ckpt.damaged" / "2"))
  ckpt.close()


def test_mixed_labels_append_the_first_episodes_of_another_dataset(synthetic_labels, monkeypatch):
  """data.mix_labels_dir: the run's labels, then the first N of another dataset, as one;
  datasets of another environment or replacement are refused in one line."""
  from hindsight.data.labels import open_training_labels

  base = open_labels(synthetic_labels)
  mixed = open_training_labels(synthetic_labels, synthetic_labels, 5)
  assert len(mixed) == len(base) + 5 and mixed.metadata == base.metadata
  for i in (0, len(base) - 1):
    np.testing.assert_array_equal(mixed[i]["credit"], base[i]["credit"])
  for j in range(5):
    np.testing.assert_array_equal(mixed[len(base) + j]["actions"], base[j]["actions"])
  with pytest.raises(IndexError):
    mixed[len(base) + 5]
  assert len(open_training_labels(synthetic_labels, synthetic_labels, 0)) == 2 * len(base)
  # Another replacement: refused, naming the field.
  import hindsight.data.labels as label_io

  real_first = label_io.open_labels(synthetic_labels)
  monkeypatch.setattr(
    label_io, "open_labels", lambda path: real_first if path == synthetic_labels else
    dataclasses.replace(real_first, metadata=real_first.metadata.replace(replacement="uniform"))
  )  # fmt: skip
  with pytest.raises(HindsightError, match="replacement 'uniform' differs"):
    open_training_labels(synthetic_labels, "other", 5)


def test_a_step_encoder_of_ones_own_trains_scores_and_reloads(tabular_run, tmp_path, monkeypatch):
  """docs/training.md's example, run as written: a new observation kind is one module and
  its registration. The model trains with it (`data.encoder`), its checkpoint records it, the
  Predictor reads episodes through it, and without it registered the checkpoint is refused in
  one line naming the kind."""
  import sys

  from conftest import page_file

  from hindsight.config_io import load_config
  from hindsight.model import encoders
  from hindsight.model.encoders import base
  from hindsight.model.predictor import Predictor
  from hindsight.plugins import Registry
  from hindsight.training import train_and_evaluate

  monkeypatch.setattr(base, "_ENCODERS", Registry(base._ENCODERS))
  (tmp_path / "my_encoders.py").write_text(page_file("docs/training.md", "my_encoders.py"))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "my_encoders", raising=False)
  import my_encoders

  labels = os.path.join(tabular_run, "labels")
  config = load_config("configs/tabular.py:smoke", [
    f"data.labels_dir={labels}", "data.encoder=transition", "train.steps=20",
    "train.eval_every=10",
  ])  # fmt: skip
  workdir = str(tmp_path / "run")
  train_and_evaluate(config, workdir)
  predictor = Predictor.load(workdir)
  assert isinstance(predictor.spec.encoder, my_encoders.TransitionEncoder)
  episode = {"observations": [0, 1, 2, 1], "actions": [0, 1, 0, 1], "rewards": [0, 0, 0, 1.0]}
  scores = predictor.score([episode])[0]
  assert scores["credit"].shape == (4,) and np.isfinite(scores["mean"]).all()
  # Its module read the previous ids too: the same step after another one scores otherwise.
  other = predictor.score([{**episode, "observations": [3, 1, 2, 1]}])[0]
  assert other["mean"][1] != scores["mean"][1]
  with pytest.raises(HindsightError, match="'observations' must be 4 int ids"):
    predictor.score([{**episode, "observations": [0.5, 1, 2, 1]}])
  del base._ENCODERS["transition"]
  with pytest.raises(HindsightError, match="step encoder 'transition' is unknown") as err:
    Predictor.load(workdir)
  assert "\n" not in str(err.value)
  assert "transition" not in encoders.registered_encoders()
