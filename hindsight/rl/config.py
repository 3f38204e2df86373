"""The RL trainer's configuration: every field with its default and meaning.

The trainer's own nodes (policy, ppo, label, eval) are here; each credit source brings its
own (`rl.sources.base.ConfigNode`: gae, credit, head, refresh), composed by `base_config`.
configs/rl_NAME.py start from `base_config()`; `check_config` refuses a bad one in one line.
"""

from __future__ import annotations

from ml_collections import ConfigDict

from hindsight.errors import HindsightError
from hindsight.labeling.config import label_node


def base_config() -> ConfigDict:
  c = ConfigDict()
  c.env = "reasoning"  # --env spec (hindsight.envs.make); gymnax:ID too
  # gymnax only: episode cap. 0: the longest of 1,024 episodes of the initial policy when
  # that is below the environment's declared cap (rl.task; evaluation points warn when the
  # policy's episodes outgrow it), else the declared cap.
  c.horizon = 0
  # gymnax only: "LO:HI", bounds of any return-to-go ("" = unknown). Without them a step
  # whose branches all tie has no finite stderr, and most reference labels of a sparse-reward
  # environment come back undetermined (the run warns when more than half do).
  c.return_range = ""
  c.source = "outcome"  # a registered credit source (rl.sources; MODULE:NAME for your own)
  c.seed = 0  # root of every key
  c.num_seeds = 5  # independent runs trained together (vmapped): keys fold_in(seed, i)

  c.policy = ConfigDict()
  c.policy.hidden = (64, 64)  # MLP widths of pi_theta (and of the critic)
  c.policy.prior = True  # start from the environment's scripted policy (log-prior logits)
  c.policy.latent = True  # reasoning: the learner reads its own competence c (docs/rl.md)

  c.ppo = ConfigDict()
  c.ppo.updates = 100  # policy updates
  c.ppo.episodes = 64  # episodes sampled per update (per seed)
  c.ppo.epochs = 4  # passes over each batch
  c.ppo.minibatches = 4  # per pass (episodes split evenly)
  c.ppo.learning_rate = 3e-4  # Adam
  c.ppo.max_grad_norm = 0.5  # global gradient norm clip
  c.ppo.clip = 0.2  # PPO ratio clip epsilon
  c.ppo.entropy = 0.01  # entropy bonus weight
  c.ppo.gamma = 1.0  # discount (episodic outcome rewards: 1)
  c.ppo.normalize = True  # advantages standardized over each batch's valid steps

  # How every labeler of the run labels, under LabelConfig's own names (replacement: q of
  # the credit sources, the credit model's labels, the audits and the reference; gamma,
  # confidence, ...: hindsight.labeling.config.LabelConfig). num_rollouts is the K of
  # mc_progress / mc_credit; the other labelers take theirs from credit.model_rollouts,
  # refresh.rollouts and eval.rollouts.
  c.label = label_node(num_rollouts=8)

  add_source_nodes(c)

  c.eval = ConfigDict()
  c.eval.every = 10  # updates between evaluation points (checkpoint, reference labels)
  c.eval.episodes = 128  # fresh episodes of the current policy per evaluation (per seed)
  c.eval.rollouts = 32  # the reference labeler's K (independent keys)
  # The drift tests of sources with a model (rl.refresh): per-tag |mean gap| beyond this is
  # drift, at every evaluation point (its change since update 0 raises credit_drift) and in
  # the audits of sources kept current; each test's false-alarm probability over a whole run.
  c.eval.tolerance = 0.02
  c.eval.alpha = 0.05
  # Their confidence sequences: "asymptotic" (width from the gaps' spread) or "bounded"
  # (exact within the return range, which on most environments is far wider than the gaps).
  c.eval.boundary = "asymptotic"

  c.progress = True  # console progress bar
  return c


def add_source_nodes(c: ConfigDict) -> ConfigDict:
  """Adds the config node of every registered credit source that `c` lacks, at its
  defaults (a user's source registered after the config was made gets its node here)."""
  from hindsight.rl.sources import config_nodes

  for node in config_nodes():
    if node.name not in c:
      c[node.name] = node.defaults()
  return c


def smoke(c: ConfigDict) -> ConfigDict:
  """A tiny variant for tests: 2 seeds, a few small updates, small credit models, and a
  learning rate at which 4 updates move the sampled actions (so sources differ)."""
  c.num_seeds = 2
  c.policy.hidden = (16,)
  c.ppo.updates = 4
  c.ppo.episodes = 16
  c.ppo.epochs = 2
  c.ppo.minibatches = 2
  c.ppo.learning_rate = 3e-2
  c.label.num_rollouts = 4
  from hindsight.rl.sources import config_nodes

  for node in config_nodes():
    for field, value in node.smoke.items():
      c[node.name][field] = value
  c.eval.every = 2
  c.eval.episodes = 16
  c.eval.rollouts = 4
  c.progress = False
  return c


def with_variant(c: ConfigDict, arg: str, smoke_variant=None) -> ConfigDict:
  """`get_config(arg)`'s variants: "" (the config as is) or "smoke" (`smoke_variant`, by
  default this trainer's `smoke`)."""
  if arg == "smoke":
    return (smoke_variant or smoke)(c)
  if arg:
    raise HindsightError(f"unknown variant {arg!r} (expected '' or 'smoke')")
  return c


def check_config(c: ConfigDict) -> None:
  """One-line HindsightError for a configuration the trainer cannot run."""
  from hindsight.rl.sources import config_nodes, source_class

  source_class(c.source)  # a one-line error naming the registered ones
  add_source_nodes(c)
  p = c.ppo
  for name in ("updates", "episodes", "epochs", "minibatches"):
    if int(p[name]) < 1:
      raise HindsightError(f"ppo.{name} must be >= 1, got {p[name]}")
  if p.episodes % p.minibatches:
    raise HindsightError(
      f"ppo.episodes ({p.episodes}) must be a multiple of ppo.minibatches ({p.minibatches})"
    )
  if int(c.num_seeds) < 1:
    raise HindsightError(f"num_seeds must be >= 1, got {c.num_seeds}")
  if int(c.eval.every) < 1 or int(c.eval.episodes) < 1:
    raise HindsightError("eval.every and eval.episodes must be >= 1")
  if p.updates % c.eval.every:
    raise HindsightError(
      f"ppo.updates ({p.updates}) must be a multiple of eval.every ({c.eval.every})"
    )
  from hindsight.metrics.sequential import BOUNDARIES

  if c.eval.boundary not in BOUNDARIES:
    raise HindsightError(f"eval.boundary must be one of {', '.join(BOUNDARIES)}, got "
                         f"{c.eval.boundary!r}")  # fmt: skip
  if c.label.num_rollouts < 2 or c.eval.rollouts < 2:
    raise HindsightError("label.num_rollouts and eval.rollouts must be >= 2")
  for node in config_nodes():
    if node.check is not None:
      node.check(c)
  if not 0.0 < p.gamma <= 1.0:
    raise HindsightError(f"ppo.gamma must be in (0, 1], got {p.gamma}")
