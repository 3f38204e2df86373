"""Credit sources: the per-step signal A_t [E, H] a policy update is driven by, and its cost.

Each source is prepared once on the host (`prepare`: models it needs, trained on the
initial policy, with the environment steps that cost) and then evaluated inside the
update's jit (`Source.signal(aux, policy_params, traj, key)` -> (A [E, H], credit env
steps int32 [])). `aux` is the source's own state (a PRM's or a credit model's parameters),
an *argument* of the compiled update: a fine-tuned credit model swaps in without a
recompile. The signals, with G_t the return to go and R = G_0:

  outcome       A_t = R - mean_batch(R)                              (REINFORCE + baseline)
  gae           rlax GAE(lambda) over a learned critic (in `rl.ppo`, which trains the critic)
  mc_progress   A_t = progress_t = r_t + V(s_{t+1}) - V(s_t), V by K rollouts of pi from
                each state (VinePPO); charged the phi arm's env steps
  prm           A_t = p_t - p_{t-1}, p_t = PRM(h_<=t) = P(success | history) (a causal
                history model trained by cross-entropy on outcomes; drift.baselines)
  mc_credit     A_t = credit_t, the labeler's interventional credit with K branch pairs
                under pi_theta itself (the oracle); charged the keep and replace arms
  learned       A_t = E[credit_t | trace], the credit model's mixture mean
  learned_current   the same, with the model kept current (`rl.refresh`)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from hindsight.drift.baselines import BaselineConfig, prm_increments, train_history_model
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.labeling.engine import Labeler, episode_key
from hindsight.labeling.trajectories import batch_spec, trajectory_batch
from hindsight.model.credit_model import ModelConfig
from hindsight.model.fit import fit_credit_model
from hindsight.model.predictor import Predictor
from hindsight.rl.task import Task

PyTree = Any
KEEP, REPLACE, PHI = range(3)  # the labeler's arms (Labeler.label_under's arm_steps)


def credit_arm_steps(arm_steps):
  """Env steps that interventional credit needs of labels with `arm_steps` [E, 3]: the keep
  and replace arms (the phi arm, which also runs, feeds progress fields credit does not
  use). What mc_credit, a credit model's labels and its audits are each charged."""
  return arm_steps[:, KEEP].sum() + arm_steps[:, REPLACE].sum()


@dataclasses.dataclass
class Source:
  """A prepared credit source (module docstring).

  aux: the pytree `signal` reads (shared by every seed; None when there is none).
  setup_steps: environment steps spent preparing it (labels or outcomes of the initial
    policy), charged to every run that uses it.
  predictor: the credit model (learned sources), whose `credit_fn` the signal calls.
  """

  name: str
  task: Task
  labeler: Labeler | None = None
  aux: PyTree = None
  setup_steps: int = 0
  predictor: Predictor | None = None
  prm_graphdef: Any = None
  prm_base: float = 0.0

  def signal(self, aux, policy_params, traj, key) -> tuple[jax.Array, jax.Array]:
    mask = traj.mask
    zero = jnp.zeros((), jnp.int32)
    if self.name == "outcome":
      R = traj.rewards.sum(-1)
      return jnp.where(mask, (R - R.mean())[:, None], 0.0), zero
    if self.name in ("mc_progress", "mc_credit"):
      keys = jax.random.split(key, mask.shape[0])
      labels = self.labeler.label_under(policy_params, traj, keys)
      arms = labels["arm_steps"]
      if self.name == "mc_progress":
        return jnp.where(mask, labels["progress"], 0.0), arms[:, PHI].sum()
      credit = jnp.where(jnp.isfinite(labels["credit"]), labels["credit"], 0.0)
      return jnp.where(mask, credit, 0.0), credit_arm_steps(arms)
    batch = trajectory_batch(self.task.env, traj)
    if self.name == "prm":
      logits = nnx.merge(self.prm_graphdef, aux)(batch)
      return prm_increments(logits, mask, self.prm_base), zero
    if self.name in ("learned", "learned_current"):
      out = self.predictor.credit_fn()(aux, batch)
      return jnp.where(mask, out["mean"], 0.0), zero
    raise HindsightError(f"source '{self.name}' has no signal here (gae lives in rl.ppo)")


def label_config(config: ConfigDict, rollouts: int) -> LabelConfig:
  return LabelConfig(num_rollouts=int(rollouts), replacement=config.credit.replacement)


def snapshot_params(task: Task, key: jax.Array, scale: float):
  """A policy near theta_0: the last layer's kernel drawn N(0, scale^2 / D), so its logits
  move by a random linear map of the features (the hidden layers are theta_0's)."""
  net = nnx.merge(task.policy.graphdef, task.policy.default_params())
  d = net.out.kernel.value.shape[0]
  noise = jax.random.normal(key, net.out.kernel.value.shape) * (scale / np.sqrt(d))
  net.out.kernel.value = noise.astype(net.out.kernel.value.dtype)
  return nnx.state(net)


def initial_labels(task: Task, config: ConfigDict, rollouts: int, seed_offset: int):
  """(trajectories, labels, env steps) of credit.model_episodes fresh episodes, labeled
  with K = rollouts: the training data of the models sources learn. They come from the
  initial policy, or with credit.model_snapshots = S from S policies (theta_0 and S - 1
  `snapshot_params`), an even share each, each labeled under its own policy."""
  labeler = Labeler(task.env, task.policy, label_config(config, rollouts))
  n, S = int(config.credit.model_episodes), int(config.credit.model_snapshots)
  keys = jax.vmap(episode_key, (None, 0))(config.seed + seed_offset, jnp.arange(n))

  def sample_and_label(params, k):
    traj = labeler.sample_under(params, k)
    return traj, labeler.label_under(params, traj, k)

  run = jax.jit(sample_and_label)
  parts = []
  for j, chunk in enumerate(np.array_split(np.arange(n), max(S, 1))):
    params = task.policy.default_params()
    if j > 0:
      k = jax.random.fold_in(jax.random.key(config.seed + seed_offset), 10**6 + j)
      params = snapshot_params(task, k, float(config.credit.snapshot_scale))
    parts.append(run(params, keys[chunk]))
  traj = jax.tree.map(lambda *xs: jnp.concatenate(xs), *[p[0] for p in parts])
  labels = jax.tree.map(lambda *xs: jnp.concatenate(xs), *[p[1] for p in parts])
  # Charged the episodes and what credit needs of their labels (`credit_arm_steps`).
  arms = np.asarray(labels.pop("arm_steps"))
  steps = int(traj.mask.sum()) + int(credit_arm_steps(arms))
  return traj, labels, steps


def check_credit_model(predictor: Predictor, task: Task, where: str) -> None:
  """Refuses (one line) a credit model made for another environment's traces."""
  spec, env = predictor.spec, task.env
  obs = jax.eval_shape(
    lambda k: env.observation(env.reset(k, task.env_params), task.env_params), jax.random.key(0)
  )
  dim = 1 if obs.ndim == 0 else int(obs.shape[-1])
  kind = "discrete" if jnp.issubdtype(obs.dtype, jnp.integer) else "vector"
  if (spec.obs_kind, spec.num_actions) != (kind, env.num_actions) or (
    kind == "vector" and spec.obs_dim != dim
  ):
    raise HindsightError(
      f"{where}: a credit model of {spec.obs_kind} observations [{spec.obs_dim}] and "
      f"{spec.num_actions} actions cannot score {env.name} ({kind} [{dim}], "
      f"{env.num_actions} actions)"
    )
  if spec.max_length < env.horizon:
    raise HindsightError(
      f"{where}: the credit model knows episodes up to {spec.max_length} steps, "
      f"{env.name} runs {env.horizon}"
    )


def prepare(task: Task, config: ConfigDict, progress: bool = False) -> Source:
  """The source `config.source` for `task`, with any model it needs trained (module
  docstring) and what that cost in environment steps."""
  name = config.source
  source = Source(name, task)
  if name in ("mc_progress", "mc_credit"):
    source.labeler = Labeler(task.env, task.policy, label_config(config, config.credit.rollouts))
    return source
  if name == "prm":
    # Outcomes of the initial policy's episodes only: a PRM never sees a credit label.
    labeler = Labeler(task.env, task.policy, label_config(config, 2))
    n = int(config.credit.model_episodes)
    keys = jax.vmap(episode_key, (None, 0))(config.seed + 7919, jnp.arange(n))
    traj = labeler.sample(keys)
    batch = jax.tree.map(np.asarray, trajectory_batch(task.env, traj))
    spec = batch_spec(task.env, batch)
    model_cfg = ModelConfig(width=int(config.credit.model_width), depth=1, num_heads=2)
    rng = np.random.default_rng(config.seed)
    rows = [rng.integers(0, n, 32) for _ in range(int(config.credit.model_steps))]
    graphdef, state = train_history_model(
      "prm",
      lambda i: {k: v[rows[i]] for k, v in batch.items()},
      spec,
      model_cfg,
      BaselineConfig(steps=int(config.credit.model_steps), seed=config.seed),
      return_scale=1.0,
      progress=progress,
    )
    source.aux, source.prm_graphdef = state, graphdef
    source.prm_base = float(batch["success"].mean())
    source.setup_steps = int(batch["mask"].sum())
    return source
  if name in ("learned", "learned_current"):
    if config.credit.model:
      predictor = Predictor.load(config.credit.model)
      check_credit_model(predictor, task, f"credit.model {config.credit.model}")
    else:
      traj, labels, source.setup_steps = initial_labels(
        task, config, config.credit.model_rollouts, seed_offset=104729
      )
      batch = trajectory_batch(task.env, traj, labels)
      spec = batch_spec(task.env, jax.device_get(batch), label_config(config, 2))
      model_cfg = ModelConfig(width=int(config.credit.model_width), depth=1, num_heads=2)
      predictor = fit_credit_model(
        batch, spec, model_cfg, int(config.credit.model_steps), seed=config.seed
      )
    if predictor.members:
      raise HindsightError("credit.model: an ensemble cannot be fine-tuned; give one run")
    source.predictor, source.aux = predictor, predictor.state
    return source
  return source  # outcome, gae: nothing to prepare
