"""A small label dataset written straight to TFDS (no labeler, so no 10 s compile), with a
credit the model can learn: credit_t = o_t[0] if a_t = 1, 0.5 if a_t = 2, else 0, plus noise
the size of its stderr."""

import numpy as np

from hindsight.credit.fields import STEP_FIELDS
from hindsight.credit.names import KLASS_NAMES
from hindsight.data.labels import AUX_STEP_FIELDS, build_features, write_dataset
from hindsight.data.metadata import LabelMetadata

OBS_DIM, NUM_ACTIONS = 4, 3


def synthetic_episode(rng: np.random.Generator, i: int) -> dict:
  n = int(rng.integers(5, 17))
  obs = rng.normal(size=(n, OBS_DIM)).astype(np.float32)
  actions = rng.integers(0, NUM_ACTIONS, n).astype(np.int32)
  true = np.where(actions == 1, obs[:, 0], np.where(actions == 2, 0.5, 0.0))
  stderr = np.full(n, 0.05, np.float32)
  credit = (true + stderr * rng.normal(size=n)).astype(np.float32)
  rewards = (rng.random(n) < 0.2).astype(np.float32)
  klass = np.where(np.abs(true) > 0.1, KLASS_NAMES.index("load_bearing"), 0).astype(np.int64)
  ep = {
    "episode": i,
    "length": n,
    "return": float(rewards.sum()),
    "success": bool(rewards.sum() > 0),
    "actions": actions,
    "rewards": rewards,
    "observations": obs,
    "tags": [f"a{a}" for a in actions],
    "klass": klass,
    "undefined": np.zeros(n, bool),
    "credit_bounded": np.zeros(n, bool),
  }
  for name in STEP_FIELDS + AUX_STEP_FIELDS:
    ep[name] = np.zeros(n, np.float32)
  ep["credit"], ep["credit_stderr"] = credit, stderr
  ep["progress"] = np.clip(0.5 + 0.1 * obs[:, 1], 0, 1).astype(np.float32)
  return ep


def write_synthetic_labels(out_dir: str, episodes: int = 96, seed: int = 0) -> str:
  rng = np.random.default_rng(seed)
  metadata = LabelMetadata(env="synthetic", replacement="policy", num_actions=NUM_ACTIONS,
                           horizon=16)  # fmt: skip
  write_dataset(
    out_dir,
    build_features((OBS_DIM,), np.float32, with_states=False),
    metadata,
    (synthetic_episode(rng, i) for i in range(episodes)),
  )
  return out_dir
