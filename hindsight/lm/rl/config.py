"""`rl_text`'s configuration: GRPO of a language model on a per-step credit source, every field
with its default and meaning (`configs/rl_text.py` starts from `base_config()`;
`check_config` refuses a bad one in one line)."""

from __future__ import annotations

from ml_collections import ConfigDict

from hindsight.errors import HindsightError

KIND = "lm"  # `hindsight rl` trains a language model when a config's `kind` says this


def base_config() -> ConfigDict:
  c = ConfigDict()
  c.kind = KIND
  # The policy: a `hindsight lm train` workdir or a Hugging Face Qwen2 / Llama 3 folder. ""
  # trains the text world's small LM at `lm_train`'s settings into WORKDIR/lm first (once
  # per experiment: every source starts from it).
  c.lm = ""
  c.lm_train = ConfigDict({"traces": 4000, "steps": 2000, "width": 128, "depth": 2,
                           "batch_size": 16, "max_count": 5})  # fmt: skip
  # Prompts: "" draws text-world problems (box counts of the LM's own training); a JSONL of
  # traces (`prompt` and `reference` each) draws from its prompts.
  c.prompts = ""
  c.verifier = "boxed"  # the outcome: "boxed" or MODULE:FN(completion, trace) -> [0, 1]
  c.source = "outcome"  # a registered source with "text" in its trainers (hindsight.rl.sources)
  c.seed = 0  # root of every key
  c.num_seeds = 5  # independent runs (trained one after another)

  c.grpo = ConfigDict()
  c.grpo.updates = 30  # policy updates
  c.grpo.prompts = 8  # prompts per update
  c.grpo.group = 4  # completions per prompt (GRPO's G)
  c.grpo.max_tokens = 160  # completion budget (the small LM's traces are about 80 tokens)
  c.grpo.temperature = 1.0  # sampling temperature of the policy (1: its own distribution)
  c.grpo.learning_rate = 3e-4  # Adam
  c.grpo.max_grad_norm = 1.0
  c.grpo.beta = 0.04  # KL(pi_theta || pi_0) weight, Tunix's GRPO default
  c.grpo.kl = "low_var_kl"  # Tunix's KL estimator (k3: zero gradient at pi_theta = pi_0)
  c.grpo.epsilon = 0.2  # ratio clip
  # Per-step signals are divided by their std over the batch's steps (GRPO's group
  # standardisation does this for `outcome`); False: used as they are.
  c.grpo.normalize = True

  c.label = ConfigDict()
  c.label.num_rollouts = 4  # K of mc_credit and pp_credit: continuations per prefix

  c.pp = ConfigDict()
  c.pp.rho = 0.1  # pp_credit: expected share of steps labelled by Monte Carlo
  c.pp.p_min = 0.02  # the least labelling probability of any step
  c.pp.lam = -1.0  # weight on the model; < 0: PPI++'s tuned weight, cross-fitted
  # Each seed's credit head is refit after every update on the last pp.buffer labels it
  # bought (pp.refit_steps Adam steps from its current parameters; 0: frozen).
  c.pp.refit_steps = 50
  c.pp.buffer = 256

  # The learned models (prm, shaped, pp_credit), fitted once on the initial policy's traces
  # and shared by every seed and source of an experiment: a PRM and a credit head on the
  # starting LM's hidden states at each step's end.
  c.models = ConfigDict()
  c.models.traces = 256  # the initial policy's traces (one completion per prompt)
  c.models.rollouts = 4  # K of their credit labels (the credit head's targets)
  c.models.steps = 600  # full-batch Adam steps of each head
  c.models.hidden = 64  # the heads' MLP width

  c.eval = ConfigDict()
  c.eval.every = 10  # updates between evaluation points (and checkpoints)
  c.eval.prompts = 128  # fresh prompts per point (one completion each, per seed)
  c.eval.reference = 16  # of them, traces labelled at eval.rollouts (sources with a model)
  c.eval.rollouts = 8  # the reference's K
  c.eval.tolerance = 0.05  # the drift tests' |mean gap| tolerance per sentence class
  c.eval.alpha = 0.05  # their false-alarm probability over a run
  # The training alarm (`hindsight.lm.rl.alarm`): the learned sources' gap per sentence class
  # on labelled training steps, pooled over updates; tolerance and alpha are eval's.
  c.alarm = ConfigDict()
  c.alarm.steps = 16  # prm, shaped: training steps Monte Carlo labelled per update (charged)
  c.alarm.baseline = 5  # the first updates, whose gaps are the reference
  c.alarm.window = 5  # the updates pooled in each later test
  # Where the learned models are cached ("": WORKDIR/setup); `--sources` shares OUT/setup.
  c.setup_dir = ""
  c.progress = True
  return c


def smoke(c: ConfigDict) -> ConfigDict:
  """A tiny variant for tests: a briefly trained LM (it writes the world's sentences, seldom
  the right answer), 2 seeds of 2 small updates at a step size that moves it."""
  c.lm_train = ConfigDict({"traces": 400, "steps": 200, "width": 48, "depth": 1,
                           "batch_size": 8, "max_count": 5})  # fmt: skip
  c.num_seeds = 2
  c.grpo.updates = 2
  c.grpo.prompts = 2
  c.grpo.group = 2
  c.grpo.max_tokens = 64
  c.grpo.learning_rate = 3e-3
  c.label.num_rollouts = 2
  c.models.traces = 8
  c.models.rollouts = 2
  c.models.steps = 20
  c.models.hidden = 16
  c.eval.every = 1
  c.eval.prompts = 16
  c.eval.reference = 2
  c.pp.refit_steps = 5
  c.pp.buffer = 16
  c.eval.rollouts = 2
  c.alarm.steps = 4
  c.alarm.baseline = 1
  c.alarm.window = 1
  c.progress = False
  return c


def with_variant(c: ConfigDict, arg: str) -> ConfigDict:
  """`get_config(arg)`'s variants: "" (the config as is) or "smoke"."""
  from hindsight.rl.config import with_variant as variant

  return variant(c, arg, smoke)


def check_config(c: ConfigDict) -> None:
  """One-line HindsightError for a configuration the trainer cannot run."""
  from hindsight.lm.rl.sources import source_class

  source_class(c.source)
  g = c.grpo
  for name in ("updates", "prompts", "max_tokens"):
    if int(g[name]) < 1:
      raise HindsightError(f"grpo.{name} must be >= 1, got {g[name]}")
  if int(g.group) < 2:
    raise HindsightError(f"grpo.group must be >= 2 (a group compares completions), got {g.group}")
  if int(c.num_seeds) < 1:
    raise HindsightError(f"num_seeds must be >= 1, got {c.num_seeds}")
  if int(c.eval.every) < 1 or g.updates % c.eval.every:
    raise HindsightError(
      f"grpo.updates ({g.updates}) must be a multiple of eval.every ({c.eval.every}, >= 1)"
    )
  if int(c.eval.prompts) < 1 or not 0 <= int(c.eval.reference) <= int(c.eval.prompts):
    raise HindsightError("eval.prompts must be >= 1 and eval.reference in [0, eval.prompts]")
  if int(c.label.num_rollouts) < 2 or int(c.eval.rollouts) < 2 or int(c.models.rollouts) < 2:
    raise HindsightError("label.num_rollouts, models.rollouts and eval.rollouts must be >= 2")
  if not 0.0 < float(c.pp.rho) <= 1.0 or not 0.0 < float(c.pp.p_min) <= float(c.pp.rho):
    raise HindsightError("pp.rho must be in (0, 1] and pp.p_min in (0, pp.rho]")
  if int(c.pp.refit_steps) < 0 or int(c.pp.buffer) < 1:
    raise HindsightError(f"pp.refit_steps must be >= 0 and pp.buffer >= 1, got "
                         f"{c.pp.refit_steps} and {c.pp.buffer}")  # fmt: skip
  a = c.alarm
  if int(a.steps) < 0 or int(a.baseline) < 1 or int(a.window) < 1:
    raise HindsightError("alarm.steps must be >= 0, alarm.baseline and alarm.window >= 1")
  if g.kl not in ("kl", "mse_kl", "low_var_kl"):
    raise HindsightError(f"grpo.kl must be kl, mse_kl or low_var_kl, got {g.kl!r}")
  if float(g.temperature) <= 0:
    raise HindsightError(f"grpo.temperature must be > 0, got {g.temperature}")
