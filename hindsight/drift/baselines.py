"""Credit signals the drift harness holds beside the credit model, on the same steps.

Free ones, from the episode and its labels:
  outcome        R at every step (the outcome reward, spread over the trajectory)
  progress       the labels' MC progress r_t + Phi(s_{t+1}) - Phi(s_t) (Math-Shepherd soft)
  phi_hard       the labels' Math-Shepherd hard estimate (1 if any continuation succeeds)
Learned ones: the credit model's transformer, made *causal* (step t attends to steps <= t;
no outcome, return-to-go or length in its tokens), trained on the training split's outcomes
the standard way, never on credit labels:
  prm            process reward model: p_t = P(success | h_<=t) by binary cross-entropy;
                 credit_t = p_t - p_{t-1}, p_{-1} = the training success rate
  td_advantage   value baseline: V(h_t) = E[G_t | o_<=t, a_<t] by regression on the return
                 to go (the token of step t carries the *previous* action and reward);
                 credit_t = r_t + V(h_{t+1}) - V(h_t), V = 0 after the end
  rudder         return decomposition (RUDDER style): g_t = E[R | h_<=t] by regression on
                 the return; credit_t = g_t - g_{t-1}, g_{-1} = the training mean return
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hindsight.model.credit_model import Block, ModelConfig
from hindsight.model.spec import DataSpec
from hindsight.progress import CompileAwareBar

LEARNED = ("prm", "td_advantage", "rudder")


class HistoryModel(nnx.Module):
  """Causal transformer over o_t, a_t (or a_{t-1}), r_t (or r_{t-1}) and t: one scalar per
  step, [B, T]. `shift`: step t sees the previous action and reward (a state value). o_t is
  read by the data's step encoder (`model.encoders`), as the credit model reads it but
  with a single linear map for vector features."""

  def __init__(self, cfg: ModelConfig, spec: DataSpec, shift: bool, *, rngs: nnx.Rngs):
    w = cfg.width
    self.spec, self.shift = spec, shift
    self.obs_encoder = spec.encoder.module(w, rngs=rngs)
    # One extra action id: "no previous action" at t = 0 of a shifted model.
    self.action_embed = nnx.Embed(spec.num_actions + 1, w, rngs=rngs)
    self.position_embed = nnx.Embed(spec.max_length, w, rngs=rngs)
    self.scalars = nnx.Linear(2, w, rngs=rngs)
    self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.depth)])
    self.norm = nnx.LayerNorm(w, rngs=rngs)
    self.head = nnx.Linear(w, 1, kernel_init=nnx.initializers.zeros_init(), rngs=rngs)

  def __call__(self, batch: dict) -> jax.Array:
    mask = batch["mask"]
    B, T = mask.shape
    actions, rewards = batch["actions"], batch["rewards"] / self.spec.value_scale
    if self.shift:
      actions = jnp.concatenate([jnp.full((B, 1), self.spec.num_actions), actions[:, :-1]], 1)
      rewards = jnp.concatenate([jnp.zeros((B, 1)), rewards[:, :-1]], 1)
    x = self.obs_encoder(batch)
    t = jnp.arange(T)
    time = jnp.broadcast_to(t / self.spec.max_length, (B, T))
    x = (
      x
      + self.action_embed(actions)
      + self.position_embed(jnp.minimum(t, self.spec.max_length - 1))[None]
      + self.scalars(jnp.stack([rewards, time], -1))
    )
    causal = (t[None, :] <= t[:, None])[None, None] & mask[:, None, None, :]
    for block in self.blocks:
      x = block(x, causal, rngs=None)
    return self.head(self.norm(x))[..., 0]


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
  steps: int = 1000  # optimizer steps per learned baseline
  batch_size: int = 32
  learning_rate: float = 1e-3
  seed: int = 0


# A learned baseline's steps when scaled to its data: this many passes over the training
# split, within [MIN_STEPS, BaselineConfig.steps].
SCALED_EPOCHS, MIN_STEPS = 20, 100


def scaled_steps(train_episodes: int, batch_size: int = BaselineConfig.batch_size) -> int:
  """Optimizer steps of a learned baseline on `train_episodes` episodes (`--baseline-steps
  -1`): SCALED_EPOCHS passes, at least MIN_STEPS, at most the default 1000. A 13,000-episode
  split trains the full 1000 steps; a 50-episode one 100 (1000 would be 600 passes)."""
  steps = -(-SCALED_EPOCHS * train_episodes // batch_size)
  return int(min(max(steps, MIN_STEPS), BaselineConfig.steps))


@dataclasses.dataclass
class TrainingSplit:
  """What a learned baseline trains on: the training split's batches (length-bucketed, in
  the order of seed `seed`), the bases p_{-1} / g_{-1} and the return scale."""

  batches: object  # step -> a padded batch (episodes_batch layout)
  bases: dict[str, float]
  return_scale: float

  @classmethod
  def of(cls, reader, train_ids: np.ndarray, spec: DataSpec, batch_size: int, seed: int):
    from hindsight.model.batching import BatchPlan, bucket_lengths, make_batch

    train = [reader[int(i)] for i in train_ids]  # one read of each episode
    lengths = np.array([len(e) for e in train])
    returns = np.array([e.episode_return for e in train])
    success = np.array([e.success for e in train])
    plan = BatchPlan(train_ids, lengths, batch_size, bucket_lengths(lengths, 2), seed, True)

    def batches(step):
      pad, ids = plan.at(step)
      return make_batch(reader, ids, pad, spec)

    bases = {"prm": float(success.mean()), "rudder": float(returns.mean()), "td_advantage": 0.0}
    return cls(batches, bases, float(max(returns.std(), 1e-6)))


def _targets(kind: str, batch: dict, scale: float) -> jax.Array:
  """Per-step regression / classification targets [B, T]."""
  r = batch["rewards"] * batch["mask"]
  if kind == "prm":
    return jnp.broadcast_to(batch["success"][:, None], r.shape)
  if kind == "rudder":
    return jnp.broadcast_to(r.sum(-1, keepdims=True), r.shape) / scale
  return jnp.flip(jnp.cumsum(jnp.flip(r, -1), -1), -1) / scale  # td_advantage: G_t


def train_history_model(
  kind: str,
  batches,
  spec: DataSpec,
  model_cfg: ModelConfig,
  cfg: BaselineConfig,
  return_scale: float,
  progress: bool = True,
) -> tuple[nnx.GraphDef, nnx.State]:
  """Fits one learned baseline. batches(step) -> a padded batch (episodes_batch layout)."""
  tx = optax.adamw(
    optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, cfg.steps // 10, cfg.steps),
    weight_decay=1e-4,
  )
  key = jax.random.fold_in(jax.random.key(cfg.seed), LEARNED.index(kind))
  model = HistoryModel(model_cfg, spec, shift=kind == "td_advantage", rngs=nnx.Rngs(params=key))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state, batch):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
      out = model(batch)
      y = _targets(kind, batch, return_scale)
      m = batch["mask"].astype(jnp.float32)
      bce = kind == "prm"
      per = optax.sigmoid_binary_cross_entropy(out, y) if bce else jnp.square(out - y)
      return jnp.sum(per * m) / jnp.maximum(m.sum(), 1.0)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss

  bar = CompileAwareBar(total=cfg.steps, desc=f"baseline {kind}", unit="step", disable=not progress)
  with bar:
    for i in range(cfg.steps):
      state, loss = step(state, batches(i))
      bar.update(1)
      if (i + 1) % 100 == 0:
        bar.set_postfix(loss=f"{float(loss):.4f}")
  model, _ = nnx.merge(graphdef, state)
  return nnx.split(model)


def state_arrays(state: nnx.State) -> dict[str, np.ndarray]:
  """A trained history model's parameters as named arrays (for the harness's npz cache)."""
  return {f"leaf_{i:04d}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(state))}


def history_model_from_arrays(
  kind: str, spec: DataSpec, model_cfg: ModelConfig, arrays: dict[str, np.ndarray]
) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, state) of a history model whose parameters are `state_arrays`' output."""
  model = HistoryModel(model_cfg, spec, shift=kind == "td_advantage", rngs=nnx.Rngs(params=0))
  graphdef, template = nnx.split(model)
  leaves, treedef = jax.tree.flatten(template)
  if len(arrays) != len(leaves):
    raise ValueError(f"{len(arrays)} cached arrays for a model of {len(leaves)}")
  restored = [jnp.asarray(arrays[f"leaf_{i:04d}"], leaf.dtype) for i, leaf in enumerate(leaves)]
  return graphdef, jax.tree.unflatten(treedef, restored)


def history_credit(
  kind: str, graphdef, state, batch: dict, base: float, return_scale: float
) -> np.ndarray:
  """The baseline's per-step credit [B, T] (module docstring); `base` = p_{-1} or g_{-1}."""
  out = np.asarray(_score(graphdef, state, batch))
  mask = np.asarray(batch["mask"])
  if kind == "prm":
    return np.asarray(prm_increments(out, mask, base))
  value = out * return_scale
  if kind == "rudder":
    prev = np.concatenate([np.full((value.shape[0], 1), base), value[:, :-1]], 1)
    return np.where(mask, value - prev, 0.0)
  v = np.where(mask, value, 0.0)
  v_next = np.concatenate([v[:, 1:], np.zeros((v.shape[0], 1))], 1)
  return np.where(mask, np.asarray(batch["rewards"]) + v_next - v, 0.0)


def prm_increments(logits: jax.Array, mask: jax.Array, base) -> jax.Array:
  """A process reward model's per-step credit [B, T]: p_t - p_{t-1}, p_t = sigmoid(logits)
  = P(success | h_<=t), p_{-1} = `base` (the training success rate); 0 on padding.
  Traceable (an RL update shapes its rewards with it inside its jit)."""
  p = jax.nn.sigmoid(logits)
  prev = jnp.concatenate([jnp.full((p.shape[0], 1), base, p.dtype), p[:, :-1]], 1)
  return jnp.where(mask, p - prev, 0.0)


@dataclasses.dataclass
class LearnedBaseline:
  """A trained history model and what turns its outputs into credit."""

  kind: str
  graphdef: nnx.GraphDef
  state: nnx.State
  base: float  # p_{-1} (prm) or g_{-1} (rudder)
  return_scale: float

  def credit(self, batch_fn, episodes: list, rows: int = 64) -> list[np.ndarray]:
    """Per-episode credit [T_i]; batch_fn(episodes) pads them (Predictor.batch)."""
    out = []
    for start in range(0, len(episodes), rows):
      chunk = episodes[start : start + rows]
      batch = batch_fn(chunk)
      c = history_credit(self.kind, self.graphdef, self.state, batch, self.base, self.return_scale)
      out += [c[i, : len(e)] for i, e in enumerate(chunk)]
    return out


@functools.partial(jax.jit, static_argnums=0)
def _score(graphdef, state, batch):
  return nnx.merge(graphdef, state)(batch)
