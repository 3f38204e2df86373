"""The audited steps as a label dataset (the labeler's TFDS format), to fine-tune on.

One example per pool episode that was drawn at least once, with every field of a labeling
job's dataset. Only the audited steps carry a label (`labeled` true): their credit, stderr,
tie-bound flag and class from the rollouts (a step drawn several times: the mean of its
labels, stderr sqrt(sum se^2) / n); every other step has NaN credit and stays out of the
training loss (`model.batching`). Progress and the phi fields are never rolled by the audit:
NaN throughout. The dataset is written atomically (TFDS's incomplete-dir + rename, then the
checksums), so a killed audit leaves no dataset that reads as complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import numpy as np

from hindsight.credit.estimators import classify, z_value
from hindsight.credit.fields import STEP_FIELDS
from hindsight.data import labels as label_io
from hindsight.data.metadata import LabelMetadata
from hindsight.labeling.config import LabelConfig


def _combined(draws, steps) -> dict[tuple[int, int], dict]:
  """{(episode, t): label} over the draws, repeated draws of a step averaged."""
  by_step: dict[tuple[int, int], list[int]] = {}
  for j, s in enumerate(draws.step):
    by_step.setdefault((int(steps["episode"][s]), int(steps["t"][s])), []).append(j)
  lab = draws.label
  out = {}
  for key, js in by_step.items():
    c = lab["credit"][js]
    se = lab["credit_stderr"][js]
    out[key] = {
      "credit": float(np.mean(c)),
      "credit_stderr": float(np.sqrt(np.sum(np.square(se))) / len(js)),
      "credit_bounded": bool(np.any(lab["credit_bounded"][js])),
    }
  return out


def write_audit_labels(
  out_dir: str,
  labeler,
  spec: str,
  pool,
  steps: dict,
  draws,
  label_cfg: LabelConfig,
  cfg,
  predictor,
) -> str:
  """Writes OUT_DIR (replacing an older one) and returns its dataset directory. `labeler`:
  the audit's `RolloutSteps` (its env and policy); `cfg`: the AuditConfig, described in the
  metadata's `job` with the audited model's step and digest."""
  env = labeler.env
  combined = _combined(draws, steps)
  episodes = sorted({e for e, _ in combined})
  z = z_value(label_cfg.confidence)
  state_ids = None
  first_state = jax.tree.map(lambda x: x[0, 0], pool.traj.states)
  with_states = env.state_index(first_state) is not None
  if with_states:
    states = jax.tree.map(lambda x: x[:, : env.horizon], pool.traj.states)
    state_ids = np.asarray(jax.vmap(jax.vmap(env.state_index))(states))

  def examples():
    for e in episodes:
      ep = pool.episodes[e]
      T = len(ep)
      nan = np.full(T, np.nan, np.float32)
      fields = {name: nan.copy() for name in STEP_FIELDS + label_io.AUX_STEP_FIELDS}
      labeled = np.zeros(T, bool)
      bounded = np.zeros(T, bool)
      for t in range(T):
        got = combined.get((e, t))
        if got is not None:
          labeled[t] = True
          fields["credit"][t] = got["credit"]
          fields["credit_stderr"][t] = got["credit_stderr"]
          bounded[t] = got["credit_bounded"]
      klass = np.asarray(
        classify(fields["credit"], fields["credit_stderr"], label_cfg.decorative_tolerance, z)
      )
      rewards = ep.rewards
      fields["return_to_go"] = np.cumsum(rewards[::-1])[::-1].astype(np.float32)
      fields.update(
        {
          "episode": e,
          "length": T,
          "return": rewards.sum(),
          "success": ep.success,
          "actions": ep.actions,
          "rewards": rewards,
          "observations": ep.observations,
          "tags": ep.tags,
          "klass": klass,
          "undefined": np.zeros(T, bool),
          "credit_bounded": bounded,
          "labeled": labeled,
        }
      )
      if state_ids is not None:
        fields["states"] = state_ids[e, :T]
      yield label_io.make_example(fields)

  obs = pool.episodes[0].observations
  features = label_io.build_features(obs.shape[1:], obs.dtype, with_states, partial=True)
  job = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out", "progress")}
  job.update(audit="hindsight audit", model_step=predictor.step, model_digest=predictor.digest)
  metadata = LabelMetadata(
    job=json.dumps(job, sort_keys=True, default=list),
    env=spec,
    env_name=env.name,
    policy=labeler.policy.name,
    seed=int(pool.source.get("seed", cfg.seed)),
    **label_cfg.metadata_fields(),
    horizon=env.horizon,
    num_actions=env.num_actions,
    null_action=-1 if env.null_action is None else env.null_action,
    success_threshold=env.success_threshold,
    success_from_return=env.success_from_return,
    tag_names=tuple(env.tag_names),
    partial=True,
    audited_steps=len(combined),
  )
  if os.path.isdir(out_dir):
    shutil.rmtree(out_dir)  # an older audit's: the new one replaces it whole
  os.makedirs(out_dir)
  return label_io.write_dataset(out_dir, features, metadata, examples())
