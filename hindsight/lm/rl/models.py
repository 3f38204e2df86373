"""The learned models of the text sources: a PRM and a credit head on the starting LM's
hidden states, fitted once on the initial policy's traces.

Features. The starting policy reads the prompt and the completion in one causal forward
(`lm.backbone.forward(..., hidden=True)`); h(x_t) is its final state at the last token of
prefix x_t (x_0: the prompt's last token; x_{t+1}: step t's last token). h(x_t) reads the
text up to x_t only. The backbone is frozen: it is the model the `lm_backbone` credit encoder
fine-tunes, here read as it is.

  PRM          p(x) = sigmoid(MLP(h(x))) ~ P(success | x), fitted by cross-entropy to the
               trace's outcome at every prefix x_0 .. x_T (a process reward model trained on
               outcomes, as PRMs are)
  credit head  (f_t, log s_t) = MLP([h(x_{t+1}), h(x_{t+1}) - h(x_t), h(x_T), R]), fitted by
               the Gaussian likelihood of Monte Carlo credit labels (`rl.credit`, K =
               models.rollouts): a model of the whole trace, outcome included, with its
               predictive std s_t

Both standardise their inputs with the training set's mean and std, start from
`jax.random` keys of the run's seed and train full-batch with Adam (optax).

pp_credit keeps each seed's credit head current (`OnlineHead`): after every update the
head is fitted again, from its current parameters, on the last `pp.buffer` Monte Carlo
labels the source bought (pp.refit_steps Adam steps), as the symbolic `pp_credit` refits
its credit model between chunks.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hindsight.lm.backbone import forward

LENGTH_BUCKET = 64


class Features:
  """h(x_0) .. h(x_T) of completions under one (frozen) model: float32 [T + 1, D] each."""

  def __init__(self, graphdef, state, cfg):
    self.state, self.cfg = state, cfg

    def states(state, tokens):
      return forward(nnx.merge(graphdef, state), cfg, tokens, hidden=True)[0]

    self._states = jax.jit(states)

  def __call__(self, rollouts, rows: int = 16) -> list[np.ndarray]:
    seqs, marks = [], []
    for p, c in zip(rollouts.prompts, rollouts.completions, strict=True):
      seqs.append(np.concatenate([p.ids, c.ids]))
      # the last token of each step (a step without tokens keeps the previous boundary)
      ends = [len(p.ids) - 1]
      for t in range(c.num_steps):
        own = np.flatnonzero(c.token_step == t)
        ends.append(len(p.ids) + int(own[-1]) if len(own) else ends[-1])
      marks.append(np.asarray(ends))
    out: list[np.ndarray] = [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for lo in range(0, len(order), rows):
      members = order[lo : lo + rows]
      L = max(len(seqs[i]) for i in members)
      L = min(-(-L // LENGTH_BUCKET) * LENGTH_BUCKET, self.cfg.max_len)
      tokens = np.zeros((rows, L), np.int32)
      for r, i in enumerate(members):
        tokens[r, : len(seqs[i])] = seqs[i][:L]
      h = np.asarray(self._states(self.state, tokens))
      for r, i in enumerate(members):
        out[i] = h[r, np.minimum(marks[i], L - 1)]
    return out


def _mlp_init(key, sizes):
  params = []
  keys = jax.random.split(key, len(sizes) - 1)
  for k, (a, b) in zip(keys, itertools.pairwise(sizes), strict=True):
    params.append({"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.zeros(b)})
  return params


def _mlp(params, x):
  for i, layer in enumerate(params):
    x = x @ layer["w"] + layer["b"]
    if i < len(params) - 1:
      x = jax.nn.gelu(x)
  return x


def _standardised(x):
  mean, std = x.mean(0), x.std(0) + 1e-6
  return {"mean": jnp.asarray(mean), "std": jnp.asarray(std)}


def _loss(kind: str, params, xs, y, weight):
  """The heads' loss: kind "bce" (one logit, targets in [0, 1]) or "gauss" (mean and log
  std, targets real), rows weighted by `weight`."""
  z = _mlp(params, xs)
  if kind == "bce":
    per = optax.sigmoid_binary_cross_entropy(z[:, 0], y)
  else:
    log_s = jnp.clip(z[:, 1], -6.0, 3.0)
    per = 0.5 * jnp.square((y - z[:, 0]) / jnp.exp(log_s)) + log_s
  return jnp.sum(per * weight) / jnp.maximum(jnp.sum(weight), 1.0)


def _adam(params, loss, steps: int):
  """(params, losses [steps]) after `steps` full-batch Adam steps (3e-3) on loss(params)."""
  tx = optax.adam(3e-3)

  def step(carry, _):
    params, opt = carry
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt = tx.update(grads, opt, params)
    return (optax.apply_updates(params, updates), opt), value

  (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), None, length=steps)
  return params, losses


@functools.partial(jax.jit, static_argnames=("kind", "steps", "hidden"))
def _fit(key, x, y, weight, norm, kind: str, steps: int, hidden: int):
  """Full-batch Adam on an MLP [D -> hidden -> out] from a fresh init (`_loss`)."""
  out = 1 if kind == "bce" else 2
  params = _mlp_init(key, (x.shape[1], hidden, out))
  xs = (x - norm["mean"]) / norm["std"]
  return _adam(params, lambda p: _loss(kind, p, xs, y, weight), steps)


@functools.partial(jax.jit, static_argnames=("steps",))
def _refit(params, x, y, weight, norm, steps: int):
  """The credit head's Gaussian likelihood, `steps` Adam steps from `params` (a fresh Adam
  state: nothing but the parameters carries over between refits)."""
  xs = (x - norm["mean"]) / norm["std"]
  return _adam(params, lambda p: _loss("gauss", p, xs, y, weight), steps)


class PRM:
  """p(x_t) for t = 0 .. T of each trace (module docstring)."""

  def __init__(self, params, norm):
    self.params, self.norm = params, norm

  @classmethod
  def fit(cls, key, features: list[np.ndarray], outcomes, steps: int, hidden: int) -> PRM:
    x = np.concatenate(features).astype(np.float32)
    y = np.concatenate([np.full(len(h), r, np.float32) for h, r in zip(features, outcomes,
                                                                       strict=True)])  # fmt: skip
    norm = _standardised(x)
    params, _ = _fit(key, x, y, np.ones(len(x), np.float32), norm, "bce", steps, hidden)
    return cls(params, norm)

  def __call__(self, features: list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for h in features:
      z = _mlp(self.params, (jnp.asarray(h) - self.norm["mean"]) / self.norm["std"])
      out.append(np.asarray(jax.nn.sigmoid(z[:, 0])))
    return out


def credit_inputs(h: np.ndarray, outcome: float) -> np.ndarray:
  """The credit head's input per step, float32 [T, 3D + 1], from h(x_0) .. h(x_T)."""
  T = len(h) - 1
  after, before = h[1:], h[:-1]
  last = np.broadcast_to(h[-1], (T, h.shape[1]))
  return np.concatenate([after, after - before, last, np.full((T, 1), outcome)], 1).astype(
    np.float32
  )


class CreditHead:
  """(f_t, s_t) [T] each per trace: the credit head's mean and predictive std."""

  def __init__(self, params, norm):
    self.params, self.norm = params, norm

  @classmethod
  def fit(cls, key, features, outcomes, labels, steps: int, hidden: int) -> CreditHead:
    x = np.concatenate([credit_inputs(h, r) for h, r in zip(features, outcomes, strict=True)])
    y = np.concatenate(labels).astype(np.float32)
    weight = np.isfinite(y).astype(np.float32)
    y = np.where(np.isfinite(y), y, 0.0).astype(np.float32)
    norm = _standardised(x)
    params, _ = _fit(key, x, y, weight, norm, "gauss", steps, hidden)
    return cls(params, norm)

  def __call__(self, features, outcomes) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for h, r in zip(features, outcomes, strict=True):
      z = _mlp(self.params, (jnp.asarray(credit_inputs(h, r)) - self.norm["mean"])
               / self.norm["std"])  # fmt: skip
      out.append((np.asarray(z[:, 0]), np.asarray(jnp.exp(jnp.clip(z[:, 1], -6.0, 3.0)))))
    return out


class OnlineHead:
  """One seed's credit head, refit online on the labels its source buys (module docstring).

  state: {"params": the MLP's, "x": float32 [C, 3D + 1] the buffer's inputs, "y": float32
  [C] their Monte Carlo credit, "count": int32 [] labels ever added (row j holds label j mod
  C), "lam": float32 [] the weight pp_credit gave the head on the last batch} with C =
  `capacity`: fixed shapes, so a checkpoint restores it into the same structure."""

  def __init__(self, head: CreditHead, capacity: int, state: dict | None = None):
    self.norm, self.capacity = head.norm, int(capacity)
    if state is None:
      width = int(head.norm["mean"].shape[0])
      state = {"params": jax.tree.map(jnp.asarray, head.params),
               "x": jnp.zeros((self.capacity, width), jnp.float32),
               "y": jnp.zeros(self.capacity, jnp.float32), "count": jnp.zeros((), jnp.int32),
               "lam": jnp.zeros((), jnp.float32)}  # fmt: skip
    self.state = state

  @property
  def head(self) -> CreditHead:
    return CreditHead(self.state["params"], self.norm)

  def add(self, x: np.ndarray, y: np.ndarray) -> None:
    """Appends labels (x [n, 3D + 1], y [n]) to the ring buffer (the oldest go first): after
    it the buffer holds the last `capacity` labels ever added, label j in row j mod C."""
    n = len(y)
    if n == 0:
      return
    count = int(self.state["count"])
    # Only the last C labels can survive, and writing more would scatter two labels to one
    # row, where which one XLA keeps is unspecified off CPU.
    keep = min(n, self.capacity)
    rows = (count + n - keep + np.arange(keep)) % self.capacity
    x, y = x[n - keep :], y[n - keep :]
    self.state = {**self.state,
                  "x": self.state["x"].at[rows].set(jnp.asarray(x, jnp.float32)),
                  "y": self.state["y"].at[rows].set(jnp.asarray(y, jnp.float32)),
                  "count": jnp.asarray(count + n, jnp.int32)}  # fmt: skip

  def refit(self, steps: int) -> float | None:
    """Fits the head again on the buffer (`steps` Adam steps from its parameters); the last
    step's loss, or None (no label yet, no step, or a fit that diverged: kept as it was)."""
    filled = min(int(self.state["count"]), self.capacity)
    if filled == 0 or steps <= 0:
      return None
    weight = (jnp.arange(self.capacity) < filled).astype(jnp.float32)
    params, losses = _refit(self.state["params"], self.state["x"], self.state["y"], weight,
                            self.norm, int(steps))  # fmt: skip
    if not all(bool(jnp.isfinite(p).all()) for p in jax.tree.leaves(params)):
      return None
    self.state = {**self.state, "params": params}
    return float(losses[-1])
