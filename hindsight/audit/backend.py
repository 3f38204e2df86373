"""Who resamples an audit's drawn steps: one written interface (`StepLabeler`) and, per
environment family of the model's labels, the backend that builds the pool and its labeler.

A functional JAX environment's steps are branched by the labeling engine from their saved
states (`RolloutSteps`, costs in env steps); a plug-in registers the backend of its own family
(the text plug-in: steps resampled through a completions endpoint, costs in completions,
`text.audit`). The runner (`audit.runner`) drives either the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from hindsight import plugins
from hindsight.envs.families import split_spec


class StepLabeler(Protocol):
  """What the audit asks of whoever labels its drawn steps.

  config: the label config (K = num_rollouts per arm, the class rule).
  env: what is audited: `.name` and `.horizon` (H, the pool's padded length).
  cost_unit: what the budget counts ("env steps", "completions").
  """

  config: Any
  env: Any
  cost_unit: str

  def step_info(self, traj) -> tuple[np.ndarray, np.ndarray]:
    """(undefined bool [E, H]: the step's credit is undefined, its state's return range
    float [E, H, 2]) over the pool's trajectories `traj`."""
    ...

  def label_steps(self, traj, ts: np.ndarray, keys) -> dict:
    """Labels of step ts[j] of episode j of `traj` (rows gathered for the draws), each with
    its own key: credit, credit_stderr, credit_bounded, klass, rollout_steps [n]."""
    ...

  def cost_bound(self, steps: dict) -> np.ndarray:
    """The most each step of the pool (`steps`: flat episode, t, ...) may cost, int [N]."""
    ...


class RolloutSteps:
  """A functional environment's steps, branched by the engine's `Labeler` from their saved
  states: K keep and K replace rollouts, at most 2 K (H - t) env steps for step t."""

  cost_unit = "env steps"

  def __init__(self, labeler):
    self.labeler = labeler
    self.config, self.env, self.policy = labeler.config, labeler.env, labeler.policy

  def step_info(self, traj):
    return self.labeler.step_info(traj)

  def label_steps(self, traj, ts, keys) -> dict:
    return self.labeler.label_steps(traj, ts, keys)

  def cost_bound(self, steps: dict) -> np.ndarray:
    return 2 * self.config.num_rollouts * (self.env.horizon - steps["t"])


def step_labeler(labeler) -> StepLabeler:
  """`labeler` as a StepLabeler: an engine `Labeler` is wrapped in `RolloutSteps`."""
  return labeler if hasattr(labeler, "cost_bound") else RolloutSteps(labeler)


@dataclasses.dataclass(frozen=True)
class AuditBackend:
  """How one family's models are audited.

  prepare(cfg, predictor, metadata, out) -> (label config, env spec, StepLabeler, pool):
    the model's labels' metadata (`LabelMetadata`) says how its steps were labeled.
  writes_labels: the audited steps are written as a label dataset to fine-tune on (they
    need the environment's trajectories, which resampled text does not have).
  """

  prepare: Callable[..., tuple]
  writes_labels: bool = True


_BACKENDS: plugins.Registry = plugins.Registry()  # family -> AuditBackend


def register_audit_backend(family: str, backend: AuditBackend) -> None:
  """Registers how models trained on labels of environment family `family` are audited."""
  _BACKENDS[family] = backend


def audit_backend(env_spec: str, default: AuditBackend) -> AuditBackend:
  """The backend of the family of `env_spec` (loading its plug-in if needed), else
  `default` (the functional environments')."""
  name, _ = split_spec(env_spec)
  return _BACKENDS.lookup(name, default)
