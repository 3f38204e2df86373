"""The RL trainer's configuration: every field with its default and meaning.

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
  c.ppo.value_coef = 0.5  # critic loss weight (gae only)
  c.ppo.gamma = 1.0  # discount (episodic outcome rewards: 1)
  c.ppo.gae_lambda = 0.95  # GAE lambda (gae only)
  c.ppo.normalize = True  # advantages standardized over each batch's valid steps

  # How every labeler of the run labels, under LabelConfig's own names (replacement: q of
  # the credit sources, the credit model's labels, the audits and the reference; gamma,
  # confidence, ...: hindsight.labeling.config.LabelConfig). num_rollouts is the K of
  # mc_progress / mc_credit; the other labelers take theirs from credit.model_rollouts,
  # refresh.rollouts and eval.rollouts.
  c.label = label_node(num_rollouts=8)

  c.credit = ConfigDict()
  # learned sources: a trained credit model's run directory ("" = train one at update 0 on
  # labels of the initial policy, charged to the run); prm always trains its own.
  c.credit.model = ""
  c.credit.model_episodes = 1024  # episodes of the initial policy the models learn from
  c.credit.model_rollouts = 16  # K of the credit model's labels
  c.credit.model_steps = 1500  # optimizer steps of the credit model / the PRM
  c.credit.model_width = 32  # the in-process credit model's width (depth 1, 2 heads)
  # Staleness by design: the model's episodes come from this many policies, theta_0 and
  # snapshots whose logits are offset by a random linear map of the features (std
  # credit.snapshot_scale, > 0), an even share each; 0 or 1 = the initial policy only.
  c.credit.model_snapshots = 0
  c.credit.snapshot_scale = 0.0
  c.credit.trust_kl = 0.1  # learned_trust: weight of KL(pi_theta || pi_theta_0) in the loss

  # credit_cv, credit_cv_current, anchored, credit_gated: an ensemble of per-action credit
  # heads over the policy's features, fitted on labels of the initial policy (charged)
  c.head = ConfigDict()
  c.head.episodes = 128  # episodes of the initial policy labeled for the heads
  c.head.rollouts = 8  # their K
  c.head.members = 4  # ensemble size (its std is credit_gated's uncertainty)
  c.head.hidden = (64, 64)
  c.head.steps = 1000  # Adam steps (minibatches of 256 steps, bootstrap weights per member)
  c.head.learning_rate = 1e-3
  c.head.beta = 1.0  # anchored: A = R - b + beta f(s, a)
  c.head.gate = 0.05  # credit_gated: ensemble std above which a step takes R - b
  # credit_cv_current: each audit labels this many fresh episodes of the current policy at
  # this K and refits the heads on them (refresh.steps Adam steps) when the test fires
  c.head.refresh_episodes = 32
  c.head.refresh_rollouts = 8

  c.refresh = ConfigDict()  # learned_current: audit at every evaluation point
  c.refresh.episodes = 32  # fresh episodes of the current policy labeled per audit
  c.refresh.rollouts = 16  # their K
  # per-tag |mean gap| beyond this is drift: in the audits, and in every evaluation point's
  # tests against the reference (its change since update 0 raises credit_drift)
  c.refresh.tolerance = 0.02
  c.refresh.alpha = 0.05  # false-alarm probability of one test (split over the tags)
  c.refresh.steps = 300  # fine-tuning steps when the alarm fires (from the current model)

  c.eval = ConfigDict()
  c.eval.every = 10  # updates between evaluation points (checkpoint, reference labels)
  c.eval.episodes = 128  # fresh episodes of the current policy per evaluation (per seed)
  c.eval.rollouts = 32  # the reference labeler's K (independent keys)

  c.progress = True  # console progress bar
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
  c.credit.model_episodes = 64
  c.credit.model_rollouts = 4
  c.credit.model_steps = 20
  c.credit.model_width = 16
  c.head.episodes = 16
  c.head.rollouts = 4
  c.head.members = 2
  c.head.hidden = (16,)
  c.head.steps = 20
  c.head.refresh_episodes = 8
  c.head.refresh_rollouts = 4
  c.refresh.episodes = 8
  c.refresh.rollouts = 4
  c.refresh.steps = 5
  c.eval.every = 2
  c.eval.episodes = 16
  c.eval.rollouts = 4
  c.progress = False
  return c


def with_variant(c: ConfigDict, arg: str) -> ConfigDict:
  if arg == "smoke":
    return smoke(c)
  if arg:
    raise HindsightError(f"unknown variant {arg!r} (expected '' or 'smoke')")
  return c


def check_config(c: ConfigDict) -> None:
  """One-line HindsightError for a configuration the trainer cannot run."""
  from hindsight.rl.sources import source_class

  source_class(c.source)  # a one-line error naming the registered ones
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
  if c.label.num_rollouts < 2 or c.eval.rollouts < 2 or c.refresh.rollouts < 2:
    raise HindsightError("label.num_rollouts, eval.rollouts and refresh.rollouts must be >= 2")
  if int(c.credit.model_snapshots) > 1 and not float(c.credit.snapshot_scale) > 0:
    raise HindsightError("credit.model_snapshots > 1 needs credit.snapshot_scale > 0")
  if int(c.head.members) < 1 or int(c.head.episodes) < 1 or int(c.head.steps) < 1:
    raise HindsightError("head.members, head.episodes and head.steps must be >= 1")
  if min(c.head.rollouts, c.head.refresh_rollouts) < 2:
    raise HindsightError("head.rollouts and head.refresh_rollouts must be >= 2")
  if int(c.head.refresh_episodes) < 1:
    raise HindsightError(f"head.refresh_episodes must be >= 1, got {c.head.refresh_episodes}")
  if float(c.credit.trust_kl) < 0:
    raise HindsightError(f"credit.trust_kl must be >= 0, got {c.credit.trust_kl}")
  if not 0.0 < p.gamma <= 1.0:
    raise HindsightError(f"ppo.gamma must be in (0, 1], got {p.gamma}")
