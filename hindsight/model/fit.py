"""Fits a credit model on labeled trajectories held in memory (no dataset, no workdir).

`hindsight train` learns from a label dataset on disk, with splits, checkpoints and a report.
An RL loop needs less and needs it in process: a model of the current policy's credit from a
batch it just labeled (`labeling.trajectories.trajectory_batch`), trained from scratch or
fine-tuned from the model it has (`init`), with the same programs (`model.programs`), loss
and optimizer. Minibatch rows are drawn from `jax.random.key(seed)`, so equal inputs give
equal parameters.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.model.credit_model import ModelConfig
from hindsight.model.loss import LossConfig
from hindsight.model.predictor import Predictor
from hindsight.model.programs import OptimConfig, ProgramsConfig, train_programs
from hindsight.model.sharding import make_mesh
from hindsight.model.spec import DataSpec


@functools.cache
def _programs(config: ProgramsConfig, spec: DataSpec):
  """One set of compiled programs per (config, spec): a loop that fine-tunes again and
  again (an RL run keeping its credit model current) compiles them once."""
  return train_programs(config, spec, make_mesh(1, 1, jax.devices()[:1]))


@functools.cache
def _fit_loop(config: ProgramsConfig, spec: DataSpec):
  """fn(state, data, rows [steps, B], keys [steps]) -> state: the train steps in one
  compiled scan over the data on the device (no host round trip per step); compiled once
  per (config, spec, data shape)."""
  programs = _programs(config, spec)

  def run(state, data, rows, keys):
    def step(state, xs):
      r, k = xs
      state, _ = programs.train_step(state, jax.tree.map(lambda v: v[r], data), k)
      return state, None

    return jax.lax.scan(step, state, (rows, keys))[0]

  return jax.jit(run, donate_argnums=0)


def fit_credit_model(
  batch: dict,
  spec: DataSpec,
  model_config: ModelConfig,
  steps: int,
  seed: int = 0,
  batch_size: int = 32,
  learning_rate: float = 1e-3,
  init: nnx.State | None = None,
  rows_from: np.ndarray | None = None,
) -> Predictor:
  """A Predictor of the model trained for `steps` AdamW steps on `batch` (trajectory_batch
  with labels, leaves [N, H, ...]); `init`: the model state to start from (fine-tuning; its
  architecture must be `model_config`'s on `spec`), else a fresh initialisation.
  rows_from: the rows minibatches are drawn from (default all N): a caller that fits again
  and again on batches of one shape, some rows unlabelled, compiles once."""
  host = jax.tree.map(np.asarray, jax.device_get(batch))
  pool = np.arange(host["mask"].shape[0]) if rows_from is None else np.asarray(rows_from)
  n = len(pool)
  config = ProgramsConfig(
    model=model_config,
    optim=OptimConfig(learning_rate=learning_rate, warmup_steps=min(100, steps // 10)),
    loss=LossConfig(),
    steps=max(int(steps), 1),
  )
  programs = _programs(config, spec)
  key = jax.random.key(seed)
  state = programs.init(jax.random.fold_in(key, 0))
  if init is not None:
    parts = nnx.merge(programs.graphdef, state)
    nnx.update(parts["model"], init)
    state = nnx.state(parts)
  rows = jax.random.randint(jax.random.fold_in(key, 1), (max(steps, 0), batch_size), 0, n)
  if steps > 0:
    keys = jax.vmap(jax.random.fold_in, (None, 0))(key, 2 + jnp.arange(steps))
    data = {k: jnp.asarray(v) for k, v in host.items()}
    # the rows' indices on the host: a pool of another size would otherwise compile a gather
    picked = jnp.asarray(pool[np.asarray(rows)], jnp.int32)
    state = _fit_loop(config, spec)(state, data, picked, keys)
  model = nnx.merge(programs.graphdef, state)["model"]
  graphdef, model_state = nnx.split(model)
  return Predictor(graphdef, model_state, spec, model_config, step=int(steps))
