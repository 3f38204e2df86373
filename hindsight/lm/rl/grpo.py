"""One GRPO update of the policy LM on per-token advantages, with Tunix's GRPO loss.

`tunix.rl.algo_core.grpo_loss_fn` takes advantages [B, C] per completion token (its 1-D
[B] form is plain GRPO). Per token j of completion i, with r = pi_theta / pi_old:

    loss_ij = max(-A_ij r, -A_ij clip(r, 1 - eps, 1 + eps)) + beta KL_j(pi_theta || pi_0)

aggregated by Tunix's "sequence-mean-token-mean" (each completion's tokens averaged, then
the completions). One gradient step per batch (Tunix's num_iterations = 1), so pi_old is
pi_theta itself (r = 1, its gradient the policy gradient) and the KL's reference pi_0 is the
starting policy, as Tunix keeps it. Its "low_var_kl" (k3) estimator has zero gradient at
pi_theta = pi_0, so a zero advantage leaves the weights where they are.

Tunix's learner (`GRPOLearner`) is not used: its rollouts go through its own sampler and its
advantages through `_generate_and_compute_advantage`, while here the sampler is the policy's
own (`lm.sample`, per-row keys: a killed run resumes to the same draws) and the advantages
come from a credit source between sampling and the update. Its PPO learner's rewards are an
int32 array (fractions truncate), so per-step credit never goes through it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tunix.rl import common
from tunix.rl.algo_core import grpo_loss_fn
from tunix.rl.grpo.grpo_learner import GRPOConfig, TrainExample

COMPLETION_BUCKET = 32  # completions are padded to a multiple of this many tokens
PROMPT_BUCKET = 32


def token_advantages(step_signal: np.ndarray, token_step: np.ndarray) -> np.ndarray:
  """A per token [C]: each step's signal on exactly that step's tokens (token_step [C], the
  step of each token, `rl.rollout`)."""
  return np.asarray(step_signal, np.float32)[np.asarray(token_step)]


def _bucket(n: int, size: int) -> int:
  return max(size, -(-n // size) * size)


def batch_arrays(prompts, completions, advantages, pad_id: int) -> dict:
  """Tunix's layout: prompt ids [B, P] left-padded, completion ids [B, C] right-padded, their
  mask and the token advantages [B, C] (0 on padding)."""
  B = len(prompts)
  P = _bucket(max(len(p) for p in prompts), PROMPT_BUCKET)
  C = _bucket(max(max(len(c) for c in completions), 1), COMPLETION_BUCKET)
  prompt_ids = np.full((B, P), pad_id, np.int32)
  completion_ids = np.full((B, C), pad_id, np.int32)
  mask = np.zeros((B, C), np.float32)
  adv = np.zeros((B, C), np.float32)
  for i, (p, c, a) in enumerate(zip(prompts, completions, advantages, strict=True)):
    prompt_ids[i, P - len(p) :] = p
    completion_ids[i, : len(c)] = c
    mask[i, : len(c)] = 1.0
    adv[i, : len(c)] = a
  return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
          "completion_mask": mask, "advantages": adv}  # fmt: skip


@dataclasses.dataclass
class Learner:
  """The update of one policy: init(state) -> parts (model and optimizer state) and
  update(parts, batch) -> (parts, aux), jitted per batch shape."""

  graphdef: nnx.GraphDef
  ref_state: nnx.State
  pad_id: int
  eos_id: int
  algo: GRPOConfig
  tx: optax.GradientTransformation

  def __post_init__(self):
    self._graphdef = nnx.graphdef(nnx.eval_shape(lambda: self.parts(self.ref_state)))
    self._update = jax.jit(self._step)

  def parts(self, state):
    model = nnx.merge(self.graphdef, state)
    return {"model": model, "optimizer": nnx.Optimizer(model, self.tx, wrt=nnx.Param)}

  def init(self, state) -> nnx.State:
    return nnx.state(self.parts(state))

  def abstract(self, state) -> nnx.State:
    """The shape of `init(state)` (a checkpoint's restore target)."""
    return nnx.state(nnx.eval_shape(lambda: self.parts(state)))

  def _step(self, parts_state, batch):
    parts = nnx.merge(self._graphdef, parts_state)
    ref = common.compute_per_token_logps(
      self.graphdef, self.ref_state, batch["prompt_ids"], batch["completion_ids"],
      pad_id=self.pad_id, eos_id=self.eos_id, stop_gradient=True,
      temperature=self.algo.temperature,
    )  # fmt: skip
    example = TrainExample(
      prompt_ids=batch["prompt_ids"], prompt_mask=batch["prompt_ids"] != self.pad_id,
      completion_ids=batch["completion_ids"], completion_mask=batch["completion_mask"],
      advantages=batch["advantages"], ref_per_token_logps=ref, old_per_token_logps=None,
    )  # fmt: skip

    def loss(model):
      return grpo_loss_fn(model, example, self.algo, self.pad_id, self.eos_id)

    (value, aux), grads = nnx.value_and_grad(loss, has_aux=True)(parts["model"])
    parts["optimizer"].update(parts["model"], grads)
    aux = {k: aux[k] for k in ("kl", "pg_loss", "entropy")} | {"loss": value}
    return nnx.state(parts), aux

  def update(self, parts_state, batch: dict):
    return self._update(parts_state, {k: jnp.asarray(v) for k, v in batch.items()})


def make_learner(graphdef, ref_state, cfg, grpo) -> Learner:
  """The learner of config node `grpo` (rl_text's) for a model (graphdef, state at start)."""
  algo = GRPOConfig(num_generations=int(grpo.group), beta=float(grpo.beta),
                    epsilon=float(grpo.epsilon), kl_loss_mode=str(grpo.kl))  # fmt: skip
  # Tunix's loss reads the sampling temperature from its config (its learner sets it there)
  algo.temperature = float(grpo.temperature)
  tx = optax.chain(optax.clip_by_global_norm(float(grpo.max_grad_norm)),
                   optax.adam(float(grpo.learning_rate)))  # fmt: skip
  # The pad id must be a token the model never writes inside a completion: Tunix masks by it.
  return Learner(graphdef, ref_state, int(cfg.pad_id), int(cfg.eos_ids[0]), algo, tx)
