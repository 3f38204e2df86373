"""What a GRPO update of the policy LM takes from a credit source: per-token advantages, in
the layout of Tunix's `TrainExample`.

`tunix.rl.algo_core.grpo_loss_fn` takes advantages [B, C] per completion token (its 1-D [B]
form is plain GRPO). Per token j of completion i, with r = pi_theta / pi_old:

    loss_ij = max(-A_ij r, -A_ij clip(r, 1 - eps, 1 + eps)) + beta KL_j(pi_theta || pi_0)

aggregated by Tunix's "sequence-mean-token-mean" (each completion's tokens averaged, then
the completions). One gradient step per batch (Tunix's num_iterations = 1), so pi_old is
pi_theta itself (r = 1, its gradient the policy gradient) and the KL's reference pi_0 is the
starting policy (the cluster's reference role). Its "low_var_kl" (k3) estimator has zero
gradient at pi_theta = pi_0, so a zero advantage leaves the weights where they are. The update
itself is Tunix's (`rl.tunix_learner`). Its PPO learner's rewards are an int32 array
(fractions truncate), so per-step credit never goes through it.
"""

from __future__ import annotations

import numpy as np

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
