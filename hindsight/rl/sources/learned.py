"""The credit model as a source, trained at update 0 on labels of the initial policy (or
loaded from `credit.model`), scored inside the update's jit:

  learned           A_t = E[credit_t | trace], the credit model's mixture mean
  learned_current   the same, with the model kept current (`rl.refresh`: audited at every
                    evaluation point, fine-tuned on fresh labels when it drifts)
  learned_trust     the same, frozen, with the policy held near the one the model was
                    trained on: the update adds credit.trust_kl x KL(pi_theta || pi_theta_0)

Charged the labels it learned from (episodes plus the keep and replace arms) and, kept
current, every audit's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from hindsight.errors import HindsightError
from hindsight.labeling.engine import Labeler, episode_key
from hindsight.labeling.trajectories import batch_spec, trajectory_batch
from hindsight.model.credit_model import ModelConfig
from hindsight.model.fit import fit_credit_model
from hindsight.model.predictor import Predictor
from hindsight.rl.sources.base import (
  ConfigNode,
  CreditSource,
  credit_arm_steps,
  label_config,
  register_config_node,
  register_source,
)
from hindsight.rl.sources.refresh import Refreshing
from hindsight.rl.task import Task


def _credit_config() -> ConfigDict:
  """The learned sources' credit model (and the PRM of `prm` / `shaped`: its episodes,
  steps and width)."""
  c = ConfigDict()
  # a trained credit model's run directory ("" = train one at update 0 on labels of the
  # initial policy, charged to the run); prm always trains its own.
  c.model = ""
  c.model_episodes = 1024  # episodes of the initial policy the models learn from
  c.model_rollouts = 16  # K of the credit model's labels
  c.model_steps = 1500  # optimizer steps of the credit model / the PRM
  c.model_width = 32  # the in-process credit model's width (depth 1, 2 heads)
  # Staleness by design: the model's episodes come from this many policies, theta_0 and
  # snapshots whose logits are offset by a random linear map of the features (std
  # credit.snapshot_scale, > 0), an even share each; 0 or 1 = the initial policy only.
  c.model_snapshots = 0
  c.snapshot_scale = 0.0
  c.trust_kl = 0.1  # learned_trust: weight of KL(pi_theta || pi_theta_0) in the loss
  return c


def _check_credit(c: ConfigDict) -> None:
  if int(c.credit.model_snapshots) > 1 and not float(c.credit.snapshot_scale) > 0:
    raise HindsightError("credit.model_snapshots > 1 needs credit.snapshot_scale > 0")
  if float(c.credit.trust_kl) < 0:
    raise HindsightError(f"credit.trust_kl must be >= 0, got {c.credit.trust_kl}")


register_config_node(
  ConfigNode(
    "credit",
    _credit_config,
    smoke={"model_episodes": 64, "model_rollouts": 4, "model_steps": 20, "model_width": 16},
    check=_check_credit,
  )
)


def snapshot_params(task: Task, key: jax.Array, scale: float):
  """A policy near theta_0: the last layer's kernel drawn N(0, scale^2 / D), so its logits
  move by a random linear map of the features (the hidden layers are theta_0's)."""
  net = nnx.merge(task.policy.graphdef, task.policy.default_params())
  d = net.out.kernel.value.shape[0]
  noise = jax.random.normal(key, net.out.kernel.value.shape) * (scale / np.sqrt(d))
  net.out.kernel.value = noise.astype(net.out.kernel.value.dtype)
  return nnx.state(net)


def initial_labels(
  task: Task, config: ConfigDict, rollouts: int, seed_offset: int, episodes: int | None = None
):
  """(trajectories, labels, env steps) of credit.model_episodes (or `episodes`) fresh
  episodes, labeled with K = rollouts: the training data of the models sources learn. They
  come from the initial policy, or with credit.model_snapshots = S from S policies (theta_0
  and S - 1 `snapshot_params`), an even share each, each labeled under its own policy."""
  labeler = Labeler(task.env, task.policy, label_config(config, rollouts))
  n = int(config.credit.model_episodes if episodes is None else episodes)
  S = int(config.credit.model_snapshots)
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
  if not spec.encoder.reads_observation(obs.dtype, obs.shape) or (
    spec.num_actions != env.num_actions
  ):
    raise HindsightError(
      f"{where}: a credit model of {spec.encoder.describe()} and {spec.num_actions} actions "
      f"cannot score {env.name} ({obs.dtype} observations {list(obs.shape)}, "
      f"{env.num_actions} actions)"
    )
  if spec.max_length < env.horizon:
    raise HindsightError(
      f"{where}: the credit model knows episodes up to {spec.max_length} steps, "
      f"{env.name} runs {env.horizon}"
    )


def credit_model(task: Task, config: ConfigDict, episodes: int | None = None):
  """(the credit model a learned source starts from, the env steps it cost): loaded from
  credit.model, or fitted (`credit.model_steps` steps, width `credit.model_width`) on the
  `initial_labels` of credit.model_episodes (or `episodes`) episodes at K =
  credit.model_rollouts. episodes = 0: an untrained model (its initialisation, its
  observation statistics from 64 unlabelled episodes, charged), for a source that learns
  only from the labels it buys along the run."""
  if config.credit.model:
    predictor = Predictor.load(config.credit.model)
    check_credit_model(predictor, task, f"credit.model {config.credit.model}")
    steps = 0
  else:
    if episodes == 0:
      labeler = Labeler(task.env, task.policy, label_config(config, 2))
      keys = jax.vmap(episode_key, (None, 0))(config.seed + 104729, jnp.arange(64))
      traj = jax.jit(labeler.sample_under)(task.policy.default_params(), keys)
      labels, steps = None, int(np.asarray(traj.mask).sum())
    else:
      traj, labels, steps = initial_labels(
        task, config, config.credit.model_rollouts, seed_offset=104729, episodes=episodes
      )
    batch = trajectory_batch(task.env, traj, labels)
    spec = batch_spec(task.env, jax.device_get(batch), label_config(config, 2))
    model_cfg = ModelConfig(width=int(config.credit.model_width), depth=1, num_heads=2)
    fit_steps = 0 if episodes == 0 else int(config.credit.model_steps)
    predictor = fit_credit_model(batch, spec, model_cfg, fit_steps, seed=config.seed)
  if predictor.members:
    raise HindsightError("credit.model: an ensemble cannot be fine-tuned; give one run")
  return predictor, steps


@register_source
class Learned(CreditSource):
  name = "learned"
  summary = "the credit model's prediction (Predictor.credit_fn inside the update's jit)"

  def prepare(self, progress: bool = False) -> None:
    del progress
    self.predictor, self.setup_steps = credit_model(self.task, self.config)
    self.aux = self.predictor.state

  def signal(self, aux, policy_params, traj, key):
    del policy_params, key
    out = self.predictor.credit_fn()(aux, trajectory_batch(self.task.env, traj))
    return jnp.where(traj.mask, out["mean"], 0.0), self.no_steps()

  def credit_prediction(self):
    fn = self.predictor.credit_fn()
    return lambda aux, traj, batch: fn(aux, batch)["mean"]


@register_source
class LearnedCurrent(Refreshing, Learned):
  name = "learned_current"
  summary = "... audited along training, fine-tuned on fresh labels when it drifts"

  def refit(self, model_state, traj, labels, batch, seed: int):
    del traj, labels
    predictor, steps = self.predictor, int(self.config.refresh.steps)
    fitted = fit_credit_model(
      batch, predictor.spec, predictor.model_config, steps, seed=seed, init=model_state
    )
    return fitted.state


@register_source
class LearnedTrust(Learned):
  """`learned`, with the policy held near the one the model was trained on: the loss adds
  credit.trust_kl x mean_t KL(pi_theta || pi_theta_0)(s_t), theta_0 the seed's own start
  (the source's fixed state)."""

  name = "learned_trust"
  summary = "... with a KL penalty (credit.trust_kl) to the policy the model was trained on"

  def init(self, policy_params):
    # a copy: the chunk donates the state, and one buffer cannot be donated twice
    return None, jax.tree.map(jnp.copy, policy_params)

  def loss(self, state, logits, batch, scale):
    del scale
    mask = batch["mask"]
    anchor = self.task.per_step(self.task.policy.logits, state[1], batch["states"])
    logp_all, logq_all = jax.nn.log_softmax(logits), jax.nn.log_softmax(anchor)
    kl = jnp.sum(jnp.exp(logp_all) * (logp_all - logq_all), -1)
    return float(self.config.credit.trust_kl) * jnp.sum(kl * mask) / jnp.maximum(mask.sum(), 1)
