"""What a credit source is (`CreditSource`), the registry that names them, and the config
nodes they bring.

A credit source is the per-step signal A_t [E, H] a policy update is driven by, what it
costs, and whatever else it adds to the update, in the manner of optax's (init, update)
pairs: the trainer composes whatever a source brings and names none of them.

  prepare(progress)              on the host, once: any model it needs (trained on the
                                 initial policy, charged `setup_steps`), its `aux`
  init(policy_params)            per seed: (its trainable parameters, optimised with the
                                 policy's: a critic; its fixed state: theta_0), or (None, None)
  terms(aux, state, params, traj, key)   inside the update's jit: a `Terms`: A [E, H], the
                                 env steps spent, and the per-step data its loss reads
  loss(state, logits, batch, scale)      inside the update's loss: its own term (Q-Prop's
                                 analytic term, a KL to theta_0, a critic's regression), or None
  between_chunks(...)            on the host between update chunks: keep its model current
                                 (audit on fresh labels, refit), with what that cost
  probe()                        what every evaluation point holds against the reference

Most sources only override `signal(aux, policy_params, traj, key) -> (A, env steps)`, which
the default `terms` calls. `aux` is the source's own model state (a PRM's or a credit model's
parameters), an *argument* of the compiled update: a fine-tuned credit model swaps in without
a recompile.

A source whose math is the same for every trainer overrides `step_signal(steps, key)`
instead (and `prediction(steps)` for its probe): `steps` (`sources.steps.Steps`) holds the
batch's mask and outcomes, its models' readings and a branch function, which the symbolic
trainer builds from its episodes (`symbolic_steps`) and the language-model trainer from its
completions (`lm.rl.sources`). Such a source lists "text" in `trainers`; `mc_credit`,
`pp_credit`, `prm`, `shaped` and `outcome` are written so, one class each for both.

Adding a source is one class with `@register_source` (docs/rl.md, "Your own credit source"),
and its settings one `ConfigNode` registered beside it. `config.source` names it;
`MODULE:NAME` imports MODULE first, so a source can live in a user's own module.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import struct
from ml_collections import ConfigDict

from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.rl.sources.steps import Branched, Steps, StepSignal
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


@struct.dataclass
class Terms:
  """What a source gives one update: advantages A [E, H] (0 on padding), the env steps its
  credit spent (int32 []), per-step data [E, H, ...] its `loss` reads (minibatched with
  the episodes; {} for most), and what the host reads after the chunk (`record`, handed to
  `between_chunks` stacked over the chunk's updates: the labels it bought; {} for most)."""

  advantages: jax.Array
  credit_steps: jax.Array
  data: dict = struct.field(default_factory=dict)
  record: dict = struct.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Probe:
  """What every evaluation point holds against the reference (`rl.measure`): the source's
  own estimate of each taken step's credit, predict(aux, traj, batch) -> [E, H] (traceable),
  what a drift of it costs a policy trained on it (said in the `credit_drift` warning), and
  whether the reference's shift test raises that warning (False: the source has an alarm of
  its own, which a run can have without a reference; the reference then only measures)."""

  predict: Callable
  consequence: str
  warns: bool = True


HACKABLE = "a policy trained on it can be hacked"
UNBIASED = "it costs this unbiased source variance, not direction"


class CreditSource:
  """A credit source (module docstring). Subclasses set `name` and `summary` and override
  `signal` (or `terms`), and whichever of the other members they need.

  name: what `config.source` calls it.
  summary: one line for --help and errors (the definition lives in docs/rl.md).
  unbiased: the policy gradient stays unbiased whatever the source's model gets wrong
    (docs/rl.md derives it), so a drifting model costs variance, not direction.
  Set by `prepare`:
  aux: the pytree `terms` reads (shared by every seed; None when there is none).
  setup_steps: environment steps spent preparing it (labels or outcomes of the initial
    policy), charged to every run that uses it.
  predictor: the credit model (learned sources).
  """

  name: ClassVar[str] = ""
  summary: ClassVar[str] = ""
  unbiased: ClassVar[bool] = False
  # The trainers it runs on: "symbolic" (PPO on a functional environment), "text" (GRPO of
  # a language model: the source implements `step_signal`).
  trainers: ClassVar[tuple[str, ...]] = ("symbolic",)
  # The learned model it reads (the language-model trainer fits it in its setup): "prm",
  # "credit" (the credit model) or None.
  model: ClassVar[str | None] = None
  # Its signal is standardised already where episodes come in groups (no normalisation on
  # top by a trainer that normalises per batch).
  standardised: ClassVar[bool] = False

  def __init__(self, task: Task | None, config: ConfigDict):
    self.task, self.config = task, config
    self.aux: PyTree = None
    self.setup_steps = 0
    self.predictor = None
    self.labeler = None  # set by `prepare` where the source branches episodes
    self.lanes = None  # the labeler's work-queue lanes for sparse step masks (None: default)

  def prepare(self, progress: bool = False) -> None:
    """Trains or loads what the signal needs (nothing, by default)."""
    del progress

  # -- inside the update -------------------------------------------------------------------

  def init(self, policy_params) -> tuple[PyTree, PyTree]:
    """(trainable, fixed): the source's own per-seed state, made from a seed's theta_0.
    The trainable part is optimised beside the policy by the update's loss; the fixed part
    is read, never trained. (None, None) by default."""
    del policy_params
    return None, None

  def signal(self, aux, policy_params, traj, key) -> tuple[jax.Array, jax.Array]:
    """(A [E, H], env steps spent int32 []) for the sampled episodes `traj` of the policy
    with `policy_params`, inside the update's jit; A is 0 on padding. By default
    `step_signal` on the episodes' `symbolic_steps`."""
    out = self.step_signal(self.symbolic_steps(aux, policy_params, traj), key)
    return out.advantages, out.cost

  # -- the math every trainer shares (`sources.steps`) -------------------------------------

  def step_signal(self, steps: Steps, key) -> StepSignal:
    """The signal of one batch from what its trainer supplies (module docstring)."""
    del steps, key
    raise NotImplementedError(f"source '{self.name}' has no signal")

  def prediction(self, steps: Steps):
    """None, or the source's own estimate of each taken step's credit [E, H] (its probe)."""
    del steps
    return None

  def symbolic_steps(self, aux, policy_params, traj, batch=None) -> Steps:
    """`Steps` of the symbolic trainer's episodes `traj` (leaves [E, H, ...]) under the
    policy with `policy_params`, traceable: the branch function is the labeler's
    `label_under`, the models' readings the source's own (`history`, `credit_outputs`) on
    `batch` (their `trajectory_batch`, made when not given)."""
    return Steps(
      mask=traj.mask,
      outcome=traj.rewards.sum(-1),
      branch=lambda z, key: self.branch(policy_params, traj, z, key),
      zero=self.no_steps(),
      history=lambda: self.history(aux, traj, batch),
      credit_model=lambda: self.credit_outputs(aux, traj, batch),
    )

  def branch(self, policy_params, traj, z, key) -> Branched:
    """Credit-only labels of the steps z [E, H] (None: all) of `traj` under the current
    policy (`Labeler.label_under`, K = label.num_rollouts), charged the keep and replace
    arms' env steps. The run's labeler (`label` node) is made on first use where the
    source's `prepare` made none."""
    if self.labeler is None:
      from hindsight.labeling.engine import Labeler

      self.labeler = Labeler(self.task.env, self.task.policy, label_config(self.config))
    keys = jax.random.split(key, traj.mask.shape[0])
    labels = self.labeler.label_under(policy_params, traj, keys, credit_only=True,
                                      step_mask=z, num_lanes=self.lanes)  # fmt: skip
    return Branched(labels["credit"], labels["credit_stderr"], labels["credit_sample_stderr"],
                    credit_arm_steps(labels["arm_steps"]))  # fmt: skip

  def history(self, aux, traj, batch):
    """p [E, H + 1]: the source's PRM on the episodes (`Steps.history`)."""
    del aux, traj, batch
    raise HindsightError(f"source '{self.name}' has no process reward model")

  def credit_outputs(self, aux, traj, batch):
    """(f, s, lam): the source's credit model on the episodes (`Steps.credit_model`)."""
    del aux, traj, batch
    raise HindsightError(f"source '{self.name}' has no credit model")

  def terms(self, aux, state, policy_params, traj, key) -> Terms:
    """The update's `Terms` (`state`: (trainable, fixed) of `init`). By default `signal`."""
    del state
    return Terms(*self.signal(aux, policy_params, traj, key))

  def loss(self, state, logits, batch: dict, scale) -> jax.Array | None:
    """The source's own loss term for a minibatch (None: it has none). `state`: (trainable,
    fixed); logits [m, H, A]: pi_theta at the minibatch's states; batch: its states,
    actions, mask, advantages and the source's `Terms.data`; scale: 1 / the std the
    advantages were divided by (so a term in advantage units matches them)."""
    del state, logits, batch, scale
    return None

  # -- between update chunks, on the host --------------------------------------------------

  def between_chunks(self, aux, policy_params, seed_key, update: int, seed: int, record=None):
    """(new aux or None, record or None) for one seed after `update` updates: a source that
    keeps its model current audits it on fresh labels of the current policy and refits it
    (`rl.sources.refresh`), or learns from the labels its updates bought (`record`: the
    `Terms.record` of the chunk's updates, leaves [n, E, H, ...], host arrays); the record
    it returns says what happened, what it cost (`env_steps`) and any `warnings` (kind ->
    message) the run should raise at this point. Nothing by default."""
    del aux, policy_params, seed_key, update, seed, record
    return None, None

  def probe(self) -> Probe | None:
    """What every evaluation point holds against the reference (None: no model to hold)."""
    predict = self.credit_prediction()
    if predict is None:
      return None
    return Probe(predict, UNBIASED if self.unbiased else HACKABLE)

  def credit_prediction(self):
    """None, or predict(aux, traj, batch) -> [E, H]: the source's own estimate of each
    taken step's credit (`probe`), by default its `prediction` on the episodes'
    `symbolic_steps`. Traceable."""
    if type(self).prediction is CreditSource.prediction:
      return None
    return lambda aux, traj, batch: self.prediction(self.symbolic_steps(aux, None, traj, batch))

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


@dataclasses.dataclass(frozen=True)
class ConfigNode:
  """The settings a source (or a family of sources) brings to the RL config: the node
  `name`, its fields at their defaults (`defaults()`, a ConfigDict with a comment on every
  field), the tiny values of the `:smoke` variant, and a check that refuses a bad value in
  one line."""

  name: str
  defaults: Callable[[], ConfigDict]
  smoke: dict = dataclasses.field(default_factory=dict)
  check: Callable[[ConfigDict], None] | None = None


_NODES: dict[str, ConfigNode] = {}


def register_config_node(node: ConfigNode) -> ConfigNode:
  """Adds a source's config node (`base_config` composes every registered one)."""
  _NODES[node.name] = node
  return node


def config_nodes() -> tuple[ConfigNode, ...]:
  return tuple(_NODES.values())
