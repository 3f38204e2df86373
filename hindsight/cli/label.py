"""`hindsight label`: label episodes with interventional credit (resumable, shardable over
processes); a family's own job options (the text family's endpoint and sampling) are flags
of their own group, declared by the family's label source (`labeling.source`)."""

from __future__ import annotations

from hindsight.cli.options import build, changed_fields, dataclass_flags, option
from hindsight.cli.parser import no_progress, return_range

NAME = "label"
HELP = "label episodes with interventional credit"


def env_help() -> str:
  """The registered environment families (plug-ins' too), for --env's help."""
  from hindsight.envs.families import known_specs

  return f"{known_specs(' | ')}; or MODULE:ARG, a family MODULE registers (docs/environments.md)"


def add_parser(sub):
  from hindsight import plugins
  from hindsight.credit.names import REPLACEMENTS
  from hindsight.labeling.config import LabelConfig, LabelJob
  from hindsight.labeling.source import families_with_options

  plugins.load_all()  # the families they add, and their own job options
  lab = sub.add_parser(NAME, help=HELP)
  option(lab, LabelJob, "env", env_help(), required=True)
  option(lab, LabelJob, "episodes",
         "number of episodes N (required; for --env text:FILE default: every trace in FILE)",
         type=int, default=None)  # fmt: skip
  option(lab, LabelConfig, "num_rollouts", "branches K per arm and step", flag="--rollouts")
  option(lab, LabelConfig, "replacement", "q(a'|s,a)", choices=REPLACEMENTS)
  option(lab, LabelJob, "seed", "root of every random key")
  lab.add_argument("--out", required=True, help="output directory (resumable)")
  option(lab, LabelConfig, "exact", "dynamic programming (tabular only)")
  option(lab, LabelJob, "chunk_size", "episodes per saved chunk")
  option(lab, LabelConfig, "gamma", "discount (1 = undiscounted)")
  option(lab, LabelConfig, "decorative_tolerance", "|credit| under this is decorative")
  option(lab, LabelConfig, "confidence", "level of the klass interval")
  option(lab, LabelJob, "policy",
         "gymnax: a JAX policy MODULE:FN(obs, key) or FN(params, obs, key) -> probs or logits;"
         " gymnasium/dm_env: MODULE:FN(obs, rng) -> action (default: uniform)")  # fmt: skip
  option(lab, LabelJob, "horizon", "gymnax/gymnasium/dm_env: cap on episode length", type=int)
  option(lab, LabelJob, "workers", "gymnasium/dm_env: processes")
  option(lab, LabelJob, "return_range",
         "gymnax/gymnasium/dm_env: bounds of any return-to-go, for honest stderrs of tied "
         "estimates (default: gymnax unknown; gymnasium/dm_env the range each episode's "
         "branches show)", type=return_range, metavar="LO:HI")  # fmt: skip
  lab.add_argument(
    "--unstratified",
    action="store_true",
    help="draw replacements from q itself, a_t included (the plain estimator, for comparison)",
  )
  option(lab, LabelJob, "permutations",
         "multi-agent envs: sampled Shapley values over this many agent orders (even, >= 4); "
         "0: every coalition up to 8 agents, 64 orders beyond")  # fmt: skip
  no_progress(lab)
  multi = lab.add_argument_group(
    "several processes (jax.distributed; the training config's distributed.* fields)"
  )
  multi.add_argument(
    "--coordinator",
    default="",
    metavar="HOST:PORT",
    help="where process 0 listens ('' = one process); --out must be on a filesystem every "
    "process shares",
  )
  multi.add_argument("--num-processes", type=int, default=1, help="processes in the job")
  multi.add_argument("--process-id", type=int, default=0, help="this process's index")
  for _, options in families_with_options():
    dataclass_flags(lab.add_argument_group(options.flag_group), options)
  return lab


def family_options(args):
  """The chosen family's own job options (None when it has none); another family's option
  given is a one-line error naming its flag."""
  from hindsight.envs.families import family_of
  from hindsight.errors import HindsightError
  from hindsight.labeling.source import families_with_options, source_entry

  entry = source_entry(family_of(args.env))
  for family, options in families_with_options():
    if options is entry.options:
      continue
    changed = changed_fields(options, args)
    if changed:
      flag = "--" + changed[0].replace("_", "-")
      raise HindsightError(f"{flag} is for --env {family}:... only")
  return None if entry.options is None else build(entry.options, args)


def job_env(args, options) -> tuple[str, int]:
  """(--env as the job records it, --episodes): a family whose options say how (`job_env`:
  text's trace file made absolute, its length the default) has its say; any other needs
  --episodes."""
  from hindsight.errors import HindsightError

  env, episodes = args.env, args.episodes
  resolve = getattr(type(options), "job_env", None)
  if resolve is not None:
    env, episodes = resolve(env, episodes)
  if episodes is None:
    raise HindsightError(f"--env {env}: give --episodes N, the number of episodes to label")
  return env, episodes


def run(args) -> int:
  from hindsight import distributed
  from hindsight.labeling.config import LabelConfig, LabelJob
  from hindsight.labeling.job import run_label_job

  distributed.check_processes(args.coordinator, args.num_processes, args.process_id)
  distributed.initialize(args.coordinator, args.num_processes, args.process_id)
  config = build(LabelConfig, args, stratify=not args.unstratified)
  options = family_options(args)
  env, episodes = job_env(args, options)
  job = build(LabelJob, args, env=env, episodes=episodes, config=config, options=options)
  path = run_label_job(job, args.out, progress=not args.no_progress)
  print(f"labels: {path}")
  return 0
