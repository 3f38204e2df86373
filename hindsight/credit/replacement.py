"""Replacement distributions q(a' | s_t, a_t) for the intervention do(a_t <- a').

docs/design.md section 1:
  policy        a' ~ pi(. | s_t)                    (may redraw a_t itself)
  policy_other  pi restricted to a' != a_t, renormalised; undefined if pi(a_t | s_t) = 1
  uniform       a' uniform over the legal actions
  null          the environment's declared null action
  policy_no_repeat  q as policy_other, and the continuation may not take an action of a_t's
                content class again (Macar et al. 2025's resilience: a step looks
                unnecessary when the policy simply regenerates it later); the rollout side
                lives in hindsight.labeling.rollout.

Written for one step; vmap outside.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight.credit.names import REPLACEMENTS
from hindsight.errors import HindsightError

# q(a_t | s_t) above this counts as 1: nothing else is left to renormalise.
DEGENERATE = 1.0 - 1e-6


def check_replacement(
  kind: str,
  null_action: int | None,
  env_name: str = "environment",
  has_action_classes: bool = True,
) -> None:
  """Raises a one-line HindsightError if `kind` cannot be used with this environment."""
  if kind not in REPLACEMENTS:
    raise HindsightError(f"unknown replacement '{kind}' (choose from {', '.join(REPLACEMENTS)})")
  if kind == "null" and null_action is None:
    raise HindsightError(f"replacement 'null' needs a null action, and {env_name} declares none")
  if kind == "policy_no_repeat" and not has_action_classes:
    raise HindsightError(
      f"replacement 'policy_no_repeat' needs action content classes, and {env_name} declares none"
    )


def without_taken(q_t: jax.Array, a_t: jax.Array) -> tuple[jax.Array, jax.Array]:
  """q restricted to a' != a_t and renormalised, for one step: ([A], its mass 1 - q(a_t) []).

  All zeros where nothing else has mass. `policy_other` is this for q = pi; stratified
  labeling draws the replace arm from it for any q.
  """
  others = q_t * (jnp.arange(q_t.shape[-1]) != a_t)
  mass = others.sum()
  return others / jnp.where(mass > 0, mass, 1.0), mass


def replacement_probs(
  kind: str,
  pi_t: jax.Array,
  legal_t: jax.Array,
  a_t: jax.Array,
  null_action: int | None,
) -> tuple[jax.Array, jax.Array]:
  """q(. | s_t, a_t) for one step.

  Args:
    kind: one of REPLACEMENTS (static).
    pi_t: float32 [A], pi(. | s_t).
    legal_t: bool [A], legal actions at s_t.
    a_t: int32 [], the action taken.
    null_action: the environment's null action (static), needed for kind == "null".

  Returns:
    q: float32 [A], a distribution (all zeros where undefined).
    undefined: bool [], True where q does not exist (policy_other with pi(a_t|s_t) = 1).
  """
  check_replacement(kind, null_action)
  num_actions = pi_t.shape[-1]
  if kind == "policy":
    return pi_t, jnp.bool_(False)
  if kind in ("policy_other", "policy_no_repeat"):
    rest, _ = without_taken(pi_t, a_t)
    undefined = pi_t[a_t] >= DEGENERATE
    return jnp.where(undefined, 0.0, rest), undefined
  if kind == "uniform":
    legal = legal_t.astype(jnp.float32)
    return legal / legal.sum(), jnp.bool_(False)
  # null
  return jax.nn.one_hot(null_action, num_actions, dtype=jnp.float32), jnp.bool_(False)
