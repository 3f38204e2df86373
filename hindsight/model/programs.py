"""The credit model's compiled programs: init, train step and eval step over a sharded state.

The training state is the pytree `{"model": nnx.State, "optimizer": nnx.State}`: checkpoints
save it whole, and `Predictor` restores the `"model"` half alone (no optimizer to rebuild).
Shared by `hindsight.training`, `eval/bench_model.py` and the evaluators.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable

import jax
import numpy as np
import optax
from flax import nnx
from ml_collections import ConfigDict

from hindsight.model.credit_model import CreditModel, ModelConfig
from hindsight.model.loss import LossConfig, credit_loss
from hindsight.model.sharding import replicated, state_shardings
from hindsight.model.spec import DataSpec

# The label fields an eval step hands back beside the model's outputs.
EVAL_LABELS = (
  "credit",
  "credit_stderr",
  "credit_noise",
  "progress",
  "klass",
  "label_mask",
  "agent_shapley",
  "agent_mask",
)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW with linear warmup, cosine decay and global-norm clipping (config.optim)."""

  learning_rate: float = 1e-3  # peak
  warmup_steps: int = 100  # linear warmup from 0
  final_lr_ratio: float = 0.01  # cosine decay ends at this share of the peak
  weight_decay: float = 1e-4  # decoupled
  clip_norm: float = 1.0  # global gradient norm
  b1: float = 0.9
  b2: float = 0.99


@dataclasses.dataclass(frozen=True)
class ProgramsConfig:
  """What the training programs depend on, typed where the config enters the library."""

  model: ModelConfig
  optim: OptimConfig
  loss: LossConfig
  steps: int  # optimizer steps (the learning-rate schedule's length)
  min_fsdp_size: int = 2**14  # arrays smaller than this stay replicated

  @classmethod
  def from_config(cls, config: ConfigDict) -> ProgramsConfig:
    """From an experiment's ConfigDict (hindsight/default_config.py): model, optim, loss,
    train.steps and mesh.min_fsdp_size; unknown fields are an error, missing ones take the
    defaults."""
    return cls(
      model=ModelConfig(**config.model.to_dict()),
      optim=OptimConfig(**config.optim.to_dict()),
      loss=LossConfig(**config.loss.to_dict()),
      steps=int(config.train.steps),
      min_fsdp_size=int(config.mesh.min_fsdp_size),
    )


def make_optimizer(o: OptimConfig, steps: int) -> optax.GradientTransformation:
  """AdamW with linear warmup over `o.warmup_steps`, cosine decay over `steps` and
  global-norm clipping."""
  warmup = min(o.warmup_steps, steps)
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=o.learning_rate,
    warmup_steps=warmup,
    # optax decays over decay_steps - warmup_steps, which must be positive (a run as short
    # as its warmup ends at the peak).
    decay_steps=max(steps, warmup + 1),
    end_value=o.learning_rate * o.final_lr_ratio,
  )
  return optax.chain(
    optax.clip_by_global_norm(o.clip_norm),
    optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
  )


def state_digest(state) -> str:
  """SHA-256 of every array of a state, in tree order: equal digests = bitwise equal.
  (With several processes each array is gathered whole first.)"""
  h = hashlib.sha256()
  for leaf in jax.tree.leaves(state):
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      leaf = multihost_utils.process_allgather(leaf, tiled=True)
    h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return h.hexdigest()


# Dense bf16 peak TFLOP/s of one accelerator, by `device_kind` (vendors' data sheets, without
# sparsity; TPU v5p reports "TPU v5", v5e "TPU v5 lite", v6e "TPU v6 lite"). A kind matches
# exactly or by its longest known prefix. MFU = achieved FLOP/s / (devices x this).
PEAK_BF16_TFLOPS = {
  "NVIDIA H100 80GB HBM3": 989.0,  # SXM
  "NVIDIA H100 PCIe": 756.0,
  "NVIDIA H100 NVL": 835.0,
  "NVIDIA H200": 989.0,
  "NVIDIA A100": 312.0,
  "TPU v4": 275.0,
  "TPU v5": 459.0,
  "TPU v5 lite": 197.0,
  "TPU v6 lite": 918.0,
}


def peak_bf16_tflops(device=None) -> float | None:
  """One device's dense bf16 peak (TFLOP/s) from its `device_kind`, matched exactly or by the
  longest known prefix; None for a CPU or an unknown kind (no MFU is reported then)."""
  kind = str((device or jax.devices()[0]).device_kind)
  if kind in PEAK_BF16_TFLOPS:
    return PEAK_BF16_TFLOPS[kind]
  known = [k for k in PEAK_BF16_TFLOPS if kind.startswith(k)]
  return PEAK_BF16_TFLOPS[max(known, key=len)] if known else None


def program_flops(fn, *args) -> float | None:
  """XLA's FLOP count of one call of the jitted `fn` on `args` (compiled, not run), or None
  on a backend that does not count them. Under SPMD it is one device's program."""
  try:
    cost = fn.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float(cost["flops"])
  except (KeyError, TypeError, IndexError):
    return None


def model_graph(model_cfg: ModelConfig, spec: DataSpec) -> tuple[nnx.GraphDef, nnx.State]:
  """The model's static half and the ShapeDtypeStructs of its state (no arrays allocated)."""
  return nnx.split(
    nnx.eval_shape(lambda: CreditModel(model_cfg, spec, rngs=nnx.Rngs(params=jax.random.key(0))))
  )


@dataclasses.dataclass
class TrainPrograms:
  """The train state's static half and the jitted programs over its (sharded) state.

  state = {"model": ..., "optimizer": ...}; train_step(state, batch, key) -> (state, metrics);
  eval_step(state, batch) -> (model outputs, the batch's EVAL_LABELS, loss metrics).
  """

  graphdef: nnx.GraphDef
  abstract_state: dict  # ShapeDtypeStructs carrying their shardings
  init: Callable
  train_step: Callable
  eval_step: Callable
  # What the loss took as a label's noise (the calibration takes the same out).
  loss: LossConfig = dataclasses.field(default_factory=LossConfig)


def train_programs(config: ProgramsConfig | ConfigDict, spec: DataSpec, mesh) -> TrainPrograms:
  """The programs of `config` (a ProgramsConfig, or an experiment's ConfigDict) for data
  described by `spec`, sharded over `mesh`."""
  if isinstance(config, ConfigDict):
    config = ProgramsConfig.from_config(config)
  model_cfg = config.model
  tx = make_optimizer(config.optim, config.steps)
  loss = functools.partial(credit_loss, **config.loss.loss_kwargs())

  def build(key):
    model = CreditModel(model_cfg, spec, rngs=nnx.Rngs(params=key))
    return {"model": model, "optimizer": nnx.Optimizer(model, tx, wrt=nnx.Param)}

  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build(jax.random.key(0))))
  # Arrays that name their own axes (a language-model step encoder's) keep them.
  specs = nnx.get_partition_spec(abstract)
  shardings = state_shardings(abstract, mesh, config.min_fsdp_size, specs)
  abstract = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )
  metrics_sharding = replicated(mesh)

  @functools.partial(jax.jit, out_shardings=shardings)
  def init(key):
    return nnx.state(build(key))

  @functools.partial(jax.jit, donate_argnums=0, out_shardings=(shardings, metrics_sharding))
  def train_step(state, batch, key):
    parts = nnx.merge(graphdef, state)
    model, optimizer = parts["model"], parts["optimizer"]

    def loss_fn(model):
      out = model(batch, dropout_key=key if model_cfg.dropout > 0 else None)
      return loss(out, batch, model.value_scale[...])

    (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    metrics["grad_norm"] = optax.tree.norm(grads)
    optimizer.update(model, grads)
    return nnx.state(parts), metrics

  @functools.partial(jax.jit, out_shardings=metrics_sharding)
  def eval_step(state, batch):
    model = nnx.merge(graphdef, state)["model"]
    out = model(batch)
    _, metrics = loss(out, batch, model.value_scale[...])
    return out, {k: batch[k] for k in EVAL_LABELS if k in batch}, metrics

  return TrainPrograms(graphdef, abstract, init, train_step, eval_step, config.loss)
