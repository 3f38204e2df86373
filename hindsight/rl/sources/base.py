"""What a credit source is (`CreditSource`) and the registry that names them.

A credit source is the per-step signal A_t [E, H] a policy update is driven by, and what it
costs. It is prepared once on the host (`prepare`: any model it needs, trained on the
initial policy, with the environment steps that cost) and evaluated inside the update's jit
(`signal(aux, policy_params, traj, key)` -> (A [E, H], credit env steps int32 [])). `aux`
is the source's own state (a PRM's or a credit model's parameters), an *argument* of the
compiled update: a fine-tuned credit model swaps in without a recompile.

Adding a source is one class with `@register_source` (docs/rl.md, "Your own credit source").
`config.source` names it; `MODULE:NAME` imports MODULE first, so a source can live in a
user's own module.
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.rl.task import Task

PyTree = Any
KEEP, REPLACE, PHI = range(3)  # the labeler's arms (Labeler.label_under's arm_steps)


def credit_arm_steps(arm_steps):
  """Env steps that interventional credit needs of labels with `arm_steps` [E, 3]: the keep
  and replace arms (the phi arm, which also runs, feeds progress fields credit does not
  use). What mc_credit, a credit model's labels and its audits are each charged."""
  return arm_steps[:, KEEP].sum() + arm_steps[:, REPLACE].sum()


def label_config(config: ConfigDict, rollouts: int | None = None) -> LabelConfig:
  """The run's `label` node whole (every labeler an RL run builds), at K = rollouts where
  given (the credit model's, the audits' and the reference's own K)."""
  over = {} if rollouts is None else {"num_rollouts": int(rollouts)}
  return LabelConfig.from_config(config.label, **over)


class CreditSource:
  """A credit source (module docstring). Subclasses set `name` and `summary` and override
  `signal`, and `prepare` if they need anything beyond the task.

  name: what `config.source` calls it.
  summary: one line for --help and errors (the definition lives in docs/rl.md).
  critic: the update trains a critic and takes GAE over it instead of calling `signal`.
  refreshes: the trainer audits the source's model at every evaluation point on fresh
    labels of the current policy (`audit_size`) and refits it (`refit`) when it drifts
    (`rl.refresh`).
  analytic: the source also gives action values f(s, .) (`action_values`), which the update
    adds through their expectation under the policy (Q-Prop's analytic term, `rl.ppo`).
  trust_region: the update adds credit.trust_kl x KL(pi_theta || pi_theta_0).
  unbiased: the policy gradient stays unbiased whatever the source's model gets wrong
    (docs/rl.md derives it), so a drifting model costs variance, not direction.
  Set by `prepare`:
  aux: the pytree `signal` reads (shared by every seed; None when there is none).
  setup_steps: environment steps spent preparing it (labels or outcomes of the initial
    policy), charged to every run that uses it.
  predictor: the credit model (learned sources), scored at every evaluation point.
  """

  name: ClassVar[str] = ""
  summary: ClassVar[str] = ""
  critic: ClassVar[bool] = False
  refreshes: ClassVar[bool] = False
  analytic: ClassVar[bool] = False
  trust_region: ClassVar[bool] = False
  unbiased: ClassVar[bool] = False

  def __init__(self, task: Task, config: ConfigDict):
    self.task, self.config = task, config
    self.aux: PyTree = None
    self.setup_steps = 0
    self.predictor = None

  def prepare(self, progress: bool = False) -> None:
    """Trains or loads what the signal needs (nothing, by default)."""
    del progress

  def signal(self, aux, policy_params, traj, key) -> tuple[jax.Array, jax.Array]:
    """(A [E, H], env steps spent int32 []) for the sampled episodes `traj` of the policy
    with `policy_params`, inside the update's jit; A is 0 on padding."""
    raise NotImplementedError(f"source '{self.name}' has no signal")

  def action_values(self, aux, policy_params, traj) -> jax.Array:
    """f [E, H, A]: a value per action at every step (`analytic` sources), inside the jit."""
    raise NotImplementedError(f"source '{self.name}' has no action values")

  def audit_size(self) -> tuple[int, int]:
    """(episodes, K) of each audit of a `refreshes` source: refresh.episodes at
    refresh.rollouts unless the source says otherwise."""
    return int(self.config.refresh.episodes), int(self.config.refresh.rollouts)

  def refit(self, model_state, traj, labels, batch, seed: int):
    """The model state fitted again, from `model_state`, on an audit's fresh episodes of
    the current policy: `traj`, their `labels` and `batch` (the two as
    `labeling.trajectories.trajectory_batch`; `refreshes` sources). Runs on the host
    between update chunks."""
    raise NotImplementedError(f"source '{self.name}' cannot be refit")

  def credit_prediction(self):
    """None, or predict(aux, traj, batch) -> [E, H]: the source's own estimate of each
    taken step's credit, which every evaluation point holds against the reference (the
    drift metrics and the `credit_drift` warning, `rl.measure`). Traceable."""
    return None

  @staticmethod
  def no_steps() -> jax.Array:
    return jnp.zeros((), jnp.int32)


_SOURCES: dict[str, type[CreditSource]] = {}


def register_source(cls: type[CreditSource]) -> type[CreditSource]:
  """Class decorator: adds a CreditSource subclass to the registry under `cls.name`."""
  if not cls.name:
    raise ValueError(f"{cls.__name__}: a credit source needs a name")
  if cls.name in _SOURCES and _SOURCES[cls.name] is not cls:
    raise HindsightError(f"credit source '{cls.name}' is registered already")
  _SOURCES[cls.name] = cls
  return cls


def registered_sources() -> tuple[str, ...]:
  """The names of every registered source, in registration order."""
  return tuple(_SOURCES)


def source_class(name: str) -> type[CreditSource]:
  """The class `config.source` names (`MODULE:NAME` imports MODULE first), or a one-line
  error listing the registered ones."""
  module, sep, short = name.rpartition(":")
  if sep and short not in _SOURCES:
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise HindsightError(f"source '{name}': cannot import {module} ({e})") from None
  found = _SOURCES.get(short if sep else name)
  if found is None:
    raise HindsightError(f"source '{name}' is unknown (known: {', '.join(_SOURCES)})")
  return found
