"""The `hindsight` command.

  hindsight label   --env SPEC --episodes N --rollouts K --replacement Q --seed S --out DIR
                    [--exact] [--chunk-size C] [--gamma G] [--unstratified]
                    [--policy MODULE:FN] [--horizon H] [--workers W] [--return-range LO:HI]
                    [--permutations P]
                    [--coordinator HOST:PORT --num-processes N --process-id I]
  hindsight train   --labels DIR --workdir WORKDIR [--config NAME|FILE.py[:VARIANT]]
                    [--config.FIELD=VALUE ...]   (the credit model; resumable)
  hindsight rl      --workdir WORKDIR [--config NAME|FILE.py[:VARIANT]] [--sources a,b,c]
                    [--config.FIELD=VALUE ...]   (policies trained on credit; resumable)
  hindsight export  DIR --format jsonl
  hindsight summary DIR
  hindsight coalition --values FILE.npy   (values [2^n] by bitmask: Shapley, interactions,
                                           dividends as JSON)
  hindsight eval    --run WORKDIR [--env SPEC] [--episodes N]
                    [--reference-rollouts K] [--out DIR]   (the drift report)
  hindsight score   --run WORKDIR --input FILE.jsonl|DATASET --out FILE.jsonl
  hindsight serve   --run WORKDIR [--host H] [--port P]   (POST /v1/credit)
  hindsight audit   --run WORKDIR (--env SPEC | --trajectories FILE|DATASET)
                    --budget N [--tolerance EPS] [--alpha A] --out DIR
                    (spot-check the model against rollouts: drift alarm, gap per slice,
                    the audited steps as a label dataset to fine-tune on)
  hindsight label   --env text:FILE.jsonl --endpoint URL --model NAME ...  (text traces
                    resampled through an OpenAI-compatible endpoint: docs/text.md)
  hindsight import  thought-anchors DIR --out OUT   (their resamples as a label dataset)
  hindsight text-world serve|prompts|exact   (a local model whose credit is exact)
  hindsight lm train --workdir W | serve --workdir W   (a small language model of our own,
                    trained on the text world, at /v1/completions)

--run names a training run's directory (--checkpoint, its older name, works the same).
Bad input exits with code 2 and one line on stderr: `hindsight: error: <what is wrong>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys

from hindsight.cli_options import build, in_flag_terms, option
from hindsight.devices import use_all_cpu_cores
from hindsight.lm.config import LMTrainConfig


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """Shows `(default: X)` where there is a default worth showing (not for required flags,
  switches that default to off, or flags without one)."""

  def _get_help_string(self, action):
    if action.required or action.default in (None, False) or action.help is None:
      return action.help
    return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
  """argparse, but usage mistakes are one line (and exit 2) like every other bad input, and
  --help shows every default."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("formatter_class", _DefaultsFormatter)
    kwargs.setdefault("allow_abbrev", False)  # --rollout is not --rollouts
    super().__init__(*args, **kwargs)
    self._given: list[str] = []

  def parse_known_args(self, args=None, namespace=None):
    self._given = list(sys.argv[1:] if args is None else args)
    return super().parse_known_args(args, namespace)

  def error(self, message):
    # argparse checks required flags before it reports unknown ones: a typo (--episods)
    # read as "--episodes is required". Name the unknown flag first.
    unknown = [
      a.split("=", 1)[0]
      for a in self._given
      if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions
    ]
    if unknown and "required" in message:
      close = difflib.get_close_matches(unknown[0], list(self._option_string_actions), n=1)
      message = f"unknown flag {unknown[0]}" + (f" (did you mean {close[0]}?)" if close else "")
    elif message.endswith("expected one argument"):
      message += " (a value that starts with '-' goes after '=': --return-range=-1:1)"
    self.exit(2, f"hindsight: error: {message} (see `{self.prog} --help`)\n")


def _return_range(text: str) -> tuple[float, float]:
  """LO:HI -> (lo, hi) for --return-range."""
  lo, sep, hi = text.partition(":")
  try:
    if not sep:
      raise ValueError
    return float(lo), float(hi)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected LO:HI, got '{text}'") from None


# A training run's directory: --run, with --checkpoint (its name before) as an alias.
RUN_FLAG = {"flag": "--run", "aliases": ("--checkpoint",), "metavar": "RUN"}
RUN_HELP = "a training run's --workdir (alias: --checkpoint; A,B,C for an ensemble in eval)"


def _env_help() -> str:
  """The registered environment families (hindsight.envs.families), for --env's help."""
  from hindsight.envs.families import known_specs

  return f"{known_specs(' | ')}; or MODULE:ARG, a family MODULE registers (docs/environments.md)"


def _text_flags(lab) -> None:
  """`hindsight label`'s flags for --env text:FILE.jsonl (docs/text.md)."""
  from hindsight.labeling.config import TextOptions as T

  text = lab.add_argument_group("text traces (--env text:FILE.jsonl, docs/text.md)")
  option(text, T, "endpoint", "OpenAI-compatible base URL (.../v1)")
  option(text, T, "model", "the endpoint's model name (required for text)")
  option(text, T, "api_key_env", "environment variable holding the API key (unset: none sent)")
  option(text, T, "temperature", "sampling temperature of every continuation")
  option(text, T, "top_p", "nucleus top-p of every continuation")
  option(text, T, "max_tokens", "cap on each continuation")
  text.add_argument("--stop", action="append", default=[], help="stop sequence (repeatable)")
  option(text, T, "chunking", "steps of a `text` trace: sentences | newlines | re:PATTERN")
  option(text, T, "verifier", "boxed (last \\boxed{} vs `reference`) or MODULE:FN")
  option(text, T, "embedding", "what counts as restating a step: lexical or MODULE:FN")
  option(text, T, "similarity", "cosine at or above which a step restates another")
  option(text, T, "max_draws", "policy_other/no_repeat: draws per step, in units of K")
  option(text, T, "null_text", "null: the step that replaces step t")
  option(text, T, "samples_per_request", "n of each request")
  option(text, T, "concurrency", "requests in flight")
  option(text, T, "budget_completions", "most completions this run may request (0: no limit)")
  option(text, T, "budget_tokens", "most completion tokens this run may spend (0: no limit)")
  option(text, T, "cache", "completion cache file (default: OUT/completions.sqlite)")
  option(text, T, "timeout", "seconds per request")
  option(text, T, "retries", "retries of a failed request")


def _text_options(args):
  """The TextOptions of `hindsight label` (None without --env text:...); a text flag given
  with another environment is an error."""
  import dataclasses

  from hindsight.envs.families import family_of
  from hindsight.labeling.config import TextOptions

  if "text" not in family_of(args.env).options:
    changed = [f.name for f in dataclasses.fields(TextOptions)
               if getattr(args, f.name) not in (f.default, [], ())]  # fmt: skip
    if changed:
      from hindsight.errors import HindsightError

      flag = "--" + changed[0].replace("_", "-")
      raise HindsightError(f"{flag} is for --env text:FILE.jsonl only")
    return None
  return build(TextOptions, args, stop=tuple(args.stop))


def _parser() -> argparse.ArgumentParser:
  from hindsight.audit.config import AuditConfig
  from hindsight.credit.names import REPLACEMENTS
  from hindsight.drift.config import DriftConfig
  from hindsight.labeling.config import LabelConfig, LabelJob, TextOptions
  from hindsight.serving.config import ServeConfig

  p = _Parser(prog="hindsight", description="Interventional credit for every step.")
  sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

  lab = sub.add_parser("label", help="label episodes with interventional credit")
  option(lab, LabelJob, "env", _env_help(), required=True)
  option(lab, LabelJob, "episodes", "number of episodes N", required=True, type=int)
  option(lab, LabelConfig, "num_rollouts", "branches K per arm and step", flag="--rollouts")
  option(lab, LabelConfig, "replacement", "q(a'|s,a)", choices=REPLACEMENTS)
  option(lab, LabelJob, "seed", "root of every random key")
  lab.add_argument("--out", required=True, help="output directory (resumable)")
  option(lab, LabelConfig, "exact", "dynamic programming (tabular only)")
  option(lab, LabelJob, "chunk_size", "episodes per saved chunk")
  option(lab, LabelConfig, "gamma", "discount (1 = undiscounted)")
  option(lab, LabelConfig, "decorative_tolerance", "|credit| under this is decorative",
         flag="--tolerance")  # fmt: skip
  option(lab, LabelConfig, "confidence", "level of the klass interval")
  option(lab, LabelJob, "policy",
         "gymnax: a JAX policy MODULE:FN(obs, key) or FN(params, obs, key) -> probs or logits;"
         " gymnasium/dm_env: MODULE:FN(obs, rng) -> action (default: uniform)")  # fmt: skip
  option(lab, LabelJob, "horizon", "gymnax/gymnasium/dm_env: cap on episode length", type=int)
  option(lab, LabelJob, "workers", "gymnasium/dm_env: processes")
  option(lab, LabelJob, "return_range",
         "gymnax/gymnasium/dm_env: bounds of any return-to-go, for honest stderrs of tied "
         "estimates (default: gymnax unknown; gymnasium/dm_env the range each episode's "
         "branches show)", type=_return_range, metavar="LO:HI")  # fmt: skip
  lab.add_argument(
    "--unstratified",
    action="store_true",
    help="draw replacements from q itself, a_t included (the plain estimator, for comparison)",
  )
  option(lab, LabelJob, "permutations",
         "multi-agent envs: sampled Shapley values over this many agent orders (even, >= 4); "
         "0: every coalition up to 8 agents, 64 orders beyond")  # fmt: skip
  lab.add_argument("--no-progress", action="store_true", help="no progress bar")
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
  _text_flags(lab)

  trn = sub.add_parser(
    "train",
    help="train the credit model on a label dataset",
    description="Trains the credit model (checkpoints, logs and report.json in --workdir; "
    "rerun to resume). Any config field is set with --config.FIELD=VALUE, e.g. "
    "--config.train.steps=500 (every field: hindsight/default_config.py).",
  )
  trn.add_argument("--labels", default="", help="label dataset (--out of `hindsight label`)")
  trn.add_argument("--workdir", required=True, help="checkpoints, logs and the report")
  trn.add_argument(
    "--config",
    default="",
    help="a shipped config (reasoning, key_to_door, tabular, team; NAME:smoke for a tiny one) "
    "or FILE.py[:VARIANT] (default: the generic config, on --labels)",
  )

  rl = sub.add_parser(
    "rl",
    help="train policies on a credit source (PPO), or every source of --sources side by side",
    description="Trains policies with PPO on a credit source, seeds vmapped (checkpoints, "
    "TensorBoard and results.json in --workdir; rerun to resume). With --sources, each source "
    "trains into WORKDIR/SOURCE and WORKDIR/table.md compares them (docs/rl.md). Any config "
    "field is set with --config.FIELD=VALUE, e.g. --config.env=gymnax:Catch-bsuite "
    "(every field: hindsight/rl/config.py).",
  )
  rl.add_argument("--config", default="rl_reasoning",
                  help="a shipped RL config (rl_reasoning, rl_key_to_door, rl_cartpole; "
                  "NAME:smoke for a tiny one) or FILE.py[:VARIANT]")  # fmt: skip
  rl.add_argument("--workdir", default="",
                  help="checkpoints, TensorBoard, results.json (required without --sources; "
                  "with them default runs/rl/ENV)")  # fmt: skip
  rl.add_argument("--sources", default="",
                  help="comma-separated credit sources to train and compare, or 'all' "
                  "(default: the config's source alone)")  # fmt: skip

  exp = sub.add_parser("export", help="print a label dataset")
  exp.add_argument("dir", help="a `hindsight label --out` directory")
  exp.add_argument("--format", default="jsonl", choices=("jsonl",), help="output format")

  summ = sub.add_parser("summary", help="credit per tag and class counts of a label dataset")
  summ.add_argument("dir", help="a `hindsight label --out` directory")

  coal = sub.add_parser("coalition", help="Shapley values, interactions, dividends of a game")
  coal.add_argument(
    "--values", required=True, help=".npy of v(S), length 2^n, index = bitmask of agents"
  )

  ev = sub.add_parser(
    "eval", help="drift report: a trained model and every baseline against the reference"
  )
  option(ev, DriftConfig, "checkpoint", RUN_HELP, required=True, **RUN_FLAG)
  option(ev, DriftConfig, "step", "checkpoint step: best, last or a number")
  option(ev, DriftConfig, "env", "evaluate fresh episodes of this env spec (default: test split)")
  option(ev, DriftConfig, "episodes", "episodes (0: the whole test split)")
  option(ev, DriftConfig, "reference_rollouts",
         "K of the reference relabel (0: RMS stderr about --reference-fraction of the "
         "spread)")  # fmt: skip
  option(ev, DriftConfig, "reference_fraction", "see above")
  option(ev, DriftConfig, "check_episodes", "episodes of the check pass")
  ev.add_argument(
    "--shift",
    action="append",
    help="OOD env spec to slice by (repeatable; default per environment, 'none' for none)",
  )
  option(ev, DriftConfig, "shift_episodes",
         "episodes per shifted set (0: as many as evaluated, within 32-128)")  # fmt: skip
  option(ev, DriftConfig, "baseline_steps",
         "steps per learned baseline (-1: 20 passes over the training split, within "
         "100-1000; 0: no learned baselines)")  # fmt: skip
  option(ev, DriftConfig, "gradient_env",
         "tabular env spec of the policy-gradient table (auto: the run's own environment "
         "when it is a tabular MDP; 'none' for none)")  # fmt: skip
  option(ev, DriftConfig, "gradient_episodes", "episodes of that table")
  option(ev, DriftConfig, "bootstrap", "bootstrap resamples per CI")
  option(ev, DriftConfig, "seed", "seed of fresh episode sets (--env, shifts), the bootstrap and "
         "baselines")  # fmt: skip
  option(ev, DriftConfig, "out", "report directory (default: CHECKPOINT/drift)")
  option(ev, DriftConfig, "cache",
         "directory of cached episodes and references (default: OUT/cache); share one "
         "between models evaluated on the same episodes")  # fmt: skip
  ev.add_argument("--no-progress", action="store_true", help="no progress bars")
  ev.add_argument(
    "--endpoint",
    default="",
    help="text runs: the completions endpoint the reference resamples through",
  )
  ev.add_argument("--reference", default="auto", choices=("auto", "exact", "resample"),
                  help="text runs: the text world's exact credit, or a resample (auto: exact "
                  "on the text world)")  # fmt: skip

  sc = sub.add_parser("score", help="batch-score a JSONL file or a label dataset")
  sc.add_argument(
    "--run", "--checkpoint", dest="checkpoint", metavar="RUN", required=True, help=RUN_HELP
  )
  sc.add_argument("--step", default="best", help="checkpoint step: best, last or a number")
  sc.add_argument("--input", required=True, help="JSONL (export format) or a dataset dir")
  sc.add_argument("--out", required=True, help="output JSONL (written atomically)")
  sc.add_argument("--allow-longer", action="store_true",
                  help="score episodes longer than the model was trained on too (their positions "
                  "past it reuse the last one it knows)")  # fmt: skip
  sc.add_argument("--no-progress", action="store_true", help="no progress bar")

  sv = sub.add_parser("serve", help="serve credit over HTTP (POST /v1/credit)")
  option(sv, ServeConfig, "checkpoint", RUN_HELP, required=True, **RUN_FLAG)
  option(sv, ServeConfig, "step", "checkpoint step: best, last or a number")
  sv.add_argument("--host", default="127.0.0.1", help="interface to listen on")
  sv.add_argument("--port", type=int, default=8000, help="port")
  option(sv, ServeConfig, "window_ms", "batching window")
  option(sv, ServeConfig, "max_batch", "trajectories per scored batch")
  option(sv, ServeConfig, "max_body_bytes", "request body limit")
  option(sv, ServeConfig, "max_trajectories", "per request")
  option(sv, ServeConfig, "max_steps", "per trajectory (0: the longest the model was trained "
         "on; more opts in to scoring longer episodes)")  # fmt: skip
  option(sv, ServeConfig, "admin_token_file",
         "a file holding the bearer token POST /v1/reload must carry (or set "
         "HINDSIGHT_ADMIN_TOKEN); without one, reload over HTTP is off (SIGHUP works)")  # fmt: skip
  option(sv, ServeConfig, "allow_reload_from",
         "a directory HTTP reloads may load checkpoints from, besides the served run")  # fmt: skip
  au = sub.add_parser(
    "audit", help="spot-check a model against rollouts: drift alarm and labels to fine-tune on"
  )
  option(au, AuditConfig, "checkpoint", RUN_HELP, required=True, **RUN_FLAG)
  option(au, AuditConfig, "step", "checkpoint step: best, last or a number")
  where = au.add_mutually_exclusive_group(required=True)
  option(where, AuditConfig, "env", "audit fresh episodes of this env spec (its policy)")
  option(where, AuditConfig, "trajectories",
         "a label dataset dir, or JSONL with seed and episode per line "
         "(docs/audit.md)")  # fmt: skip
  option(au, AuditConfig, "budget", "env steps the rollouts may spend (text: completions)",
         required=True, type=int)  # fmt: skip
  option(au, AuditConfig, "tolerance",
         "|mean gap| allowed, in credit units (0: a tenth of the model's credit "
         "scale)")  # fmt: skip
  option(au, AuditConfig, "alpha", "false-alarm rate, any duration")
  option(au, AuditConfig, "coverage_level", "interval level checked")
  option(au, AuditConfig, "coverage_tolerance", "coverage allowed below the level")
  option(au, AuditConfig, "episodes", "pool size (--env) or most read")
  option(au, AuditConfig, "rollouts", "K branches per arm and step")
  option(au, AuditConfig, "shares", "draw shares: uniform, most uncertain, most disagreeing "
         "with the outcome", type=_shares, metavar="U:S:D")  # fmt: skip
  option(au, AuditConfig, "stop_at_alarm", "stop spending once it fires")
  option(au, AuditConfig, "seed", "root of the pool, draws and rollouts")
  option(au, AuditConfig, "out", "report directory", required=True)
  option(au, AuditConfig, "endpoint", "text models: the completions endpoint to resample through")
  au.add_argument("--no-progress", action="store_true", help="no progress bar")

  imp = sub.add_parser("import", help="resamples in another tool's layout -> a label dataset")
  imp.add_argument("layout", choices=("thought-anchors",), help="the layout of DIR")
  imp.add_argument("dir", help="the directory of problem_<n> folders")
  imp.add_argument("--out", required=True, help="output directory")
  imp.add_argument("--replacement", default="policy", choices=("policy", "policy_other"),
                   help="policy: resampling importance; policy_other: counterfactual")  # fmt: skip
  option(imp, TextOptions, "embedding", "what counts as the same chunk: lexical or MODULE:FN")
  option(imp, TextOptions, "similarity", "cosine at or above which a resample is the same chunk")
  option(imp, LabelConfig, "decorative_tolerance", "|credit| under this is decorative",
         flag="--tolerance")  # fmt: skip
  option(imp, LabelConfig, "confidence", "level of the klass interval")

  tw = sub.add_parser("text-world", help="the text world: a local model with exact credit")
  tw_sub = tw.add_subparsers(dest="world_command", required=True, parser_class=_Parser)
  tws = tw_sub.add_parser("serve", help="serve it at /v1/completions (model hindsight-text-world)")
  tws.add_argument("--host", default="127.0.0.1", help="interface to listen on")
  tws.add_argument("--port", type=int, default=8100, help="port")
  twp = tw_sub.add_parser("prompts", help="write N problems as prompt-only traces (JSONL)")
  twp.add_argument("--episodes", type=int, required=True, help="number of problems N")
  twp.add_argument("--seed", type=int, default=0, help="seed of the problems")
  twp.add_argument("--max-count", type=int, default=0,
                   help="box counts 1 .. N (the small LM's); 0: the world's 3 .. 59")  # fmt: skip
  twp.add_argument("--out", required=True, help="output JSONL file")
  twe = tw_sub.add_parser("exact", help="exact credit of the world's traces in a label dataset")
  twe.add_argument("dir", help="a `hindsight label --env text:...` output against the world")
  twe.add_argument("--out", required=True, help="output JSON (per-trace exact labels, z-scores)")
  lm = sub.add_parser("lm", help="a small language model: train it, serve it (/v1/completions)")
  lm_sub = lm.add_subparsers(dest="lm_command", required=True, parser_class=_Parser)
  lmt = lm_sub.add_parser("train", help="train it on the text world's traces (rerun resumes)")
  lmt.add_argument("--workdir", required=True, help="checkpoints (rerun to resume)")
  for f in dataclasses.fields(LMTrainConfig):
    if f.name != "progress":
      lmt.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                       help=LM_TRAIN_HELP[f.name])  # fmt: skip
  lmt.add_argument("--no-progress", action="store_true", help="no progress bar")
  lms = lm_sub.add_parser("serve", help="serve it at /v1/completions (model hindsight-small-lm)")
  lms.add_argument("--workdir", required=True, help="the `hindsight lm train` workdir")
  lms.add_argument("--host", default="127.0.0.1", help="interface to listen on")
  lms.add_argument("--port", type=int, default=8101, help="port")
  return p


LM_TRAIN_HELP = {
  "traces": "text-world traces to train on (5%% held out)",
  "max_count": "box counts of its problems are 1 .. this",
  "seed": "seed of the traces, the initialisation and the batch order",
  "steps": "optimizer steps",
  "batch_size": "traces per step",
  "learning_rate": "peak AdamW learning rate",
  "warmup_steps": "linear warmup steps",
  "eval_every": "steps between the held-out loss and a checkpoint",
  "vocab_size": "BPE vocabulary",
  "width": "model width",
  "depth": "layers",
  "num_heads": "attention heads",
  "max_len": "context in tokens (prompt and continuation)",
}


def _lm(args) -> int:
  from hindsight.errors import HindsightError

  if args.lm_command == "serve":
    from hindsight.lm.server import serve_lm

    serve_lm(args.workdir, args.host, args.port)
    return 0
  from hindsight.lm.train import train_lm

  values = {f.name: getattr(args, f.name) for f in dataclasses.fields(LMTrainConfig)
            if f.name != "progress"}  # fmt: skip
  for name in ("traces", "steps", "batch_size", "eval_every", "width", "depth", "max_len",
               "max_count"):  # fmt: skip
    if values[name] < 1:
      raise HindsightError(f"--{name.replace('_', '-')} must be >= 1, got {values[name]}")
  result = train_lm(LMTrainConfig(**values, progress=not args.no_progress), args.workdir)
  print(f"language model: {result['workdir']} (step {result['step']}, held-out loss "
        f"{result['val_loss']:.4f})")  # fmt: skip
  return 0


def _shares(text: str) -> tuple[float, float, float]:
  """U:S:D -> three floats for --shares."""
  try:
    parts = tuple(float(x) for x in text.split(":"))
    if len(parts) != 3:
      raise ValueError
    return parts
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected U:S:D (three numbers), got '{text}'") from None


def _audit(args) -> int:
  from hindsight.audit import run_audit
  from hindsight.audit.config import AuditConfig

  report = run_audit(build(AuditConfig, args, progress=not args.no_progress))
  print(verdict_text(report))
  print(f"report: {os.path.join(report['out'], 'report.md')}")
  return 0


def verdict_text(report: dict) -> str:
  """The audit's verdict in two console lines."""
  v, g = report["verdict"], report["gap"]
  cs = g["confidence_sequence"]
  head = (
    f"DRIFT ALARM ({v['reason']}) after {v['fired_after_draws']} audited steps, "
    f"{v['fired_after_env_steps']:.3g} {report.get('budget_unit', 'env steps')}"
    if v["alarm"]
    else f"no alarm after {report['draws']} audited steps"
  )
  gap = f"mean gap {g['mean']:+.4f}" + (
    f", confidence sequence [{cs[0]:+.4f}, {cs[1]:+.4f}]" if cs else ""
  )
  unit = report.get("budget_unit", "env steps")
  return (
    f"audit of {report['env']}: {head} ({report['spent_env_steps']:.3g} of "
    f"{report['budget']:.3g} {unit} spent)\n  {gap}; coverage {report['coverage']['mean']:.3f}"
  )


def _train(args) -> int:
  import logging

  from hindsight.config_io import apply_overrides, load_config
  from hindsight.default_config import generic_config
  from hindsight.errors import HindsightError
  from hindsight.training import run_training

  logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
  overrides = args.config_overrides
  if args.config:
    config = load_config(args.config, overrides)
  else:
    config = apply_overrides(generic_config(), overrides)
  if args.labels:
    config.data.labels_dir = args.labels
  if not config.data.labels_dir and not config.data.label.env:
    raise HindsightError("--labels DIR is required (the --out of `hindsight label`)")
  return run_training(config, args.workdir)


def _rl(args) -> int:
  from hindsight.config_io import load_config
  from hindsight.errors import HindsightError

  overrides = args.config_overrides
  if args.sources:
    from hindsight.rl import experiment
    from hindsight.rl.sources import registered_sources

    sources = registered_sources() if args.sources == "all" else args.sources.split(",")
    out = args.workdir or experiment.default_out(load_config(args.config, overrides))
    command = " ".join(["hindsight rl", *args.argv])
    print(experiment.run_experiment(args.config, overrides, [s for s in sources if s], out,
                                    command))  # fmt: skip
    print(f"table: {os.path.join(out, 'table.md')}")
    return 0
  if not args.workdir:
    raise HindsightError("--workdir is required (or --sources a,b,c to compare sources)")
  from hindsight.rl.trainer import train_and_evaluate

  results = train_and_evaluate(load_config(args.config, overrides), args.workdir)
  seeds = results["seeds"]
  success = sum(s["success"] for s in seeds) / len(seeds)
  length = sum(s["length"] for s in seeds) / len(seeds)
  print(
    f"{results['source']} on {results['env']}: after {results['updates']} updates, success "
    f"{success:.3f}, length {length:.2f} (mean of {len(seeds)} seeds); "
    f"{os.path.join(args.workdir, 'results.json')}"
  )
  return 0


def _score(args) -> int:
  from hindsight.model.predictor import Predictor
  from hindsight.serving.batch import score_file

  n = score_file(Predictor.load(args.checkpoint, args.step), args.input, args.out,
                 progress=not args.no_progress, allow_longer=args.allow_longer)  # fmt: skip
  print(f"scored {n} episodes: {args.out}")
  return 0


def _serve(args) -> int:
  from hindsight.serving.app import serve
  from hindsight.serving.config import ServeConfig

  cfg = build(ServeConfig, args)
  serve(cfg, args.host, args.port)
  return 0


def _eval(args) -> int:
  from hindsight.drift import run_drift
  from hindsight.drift.config import DriftConfig
  from hindsight.text.evaluate import is_text_run

  if is_text_run(args.checkpoint):
    return _eval_text(args)

  shifts = None if not args.shift else tuple(s for s in args.shift if s != "none")
  gradient_env = "" if args.gradient_env == "none" else args.gradient_env
  cfg = build(DriftConfig, args, shifts=shifts, gradient_env=gradient_env,
              progress=not args.no_progress)  # fmt: skip
  report = run_drift(cfg)
  print(headline_text(report))
  print(f"report: {os.path.join(report['out'], 'report.md')}")
  return 0


def _eval_text(args) -> int:
  """`hindsight eval` on a run trained on text traces (hindsight.text.evaluate)."""
  from hindsight.text.evaluate import evaluate_text_run

  report = evaluate_text_run(
    args.checkpoint,
    out=args.out or "",
    episodes=args.episodes or 0,
    reference=args.reference,
    rollouts=args.reference_rollouts or 256,
    endpoint=args.endpoint,
    bootstrap=args.bootstrap or 400,
    seed=args.seed or 0,
    step=args.step or "best",
    progress=not args.no_progress,
    baseline_steps=-1 if args.baseline_steps is None else args.baseline_steps,
  )
  lines = [f"text credit on {report['traces']} traces ({report['steps']} steps), against the "
           f"{report['reference']['kind']} reference:"]  # fmt: skip
  for name, m in report["metrics"].items():
    e = m["spearman"]
    lines.append(f"  {name:<28} Spearman {e['value']:.3f} [{e['lo']:.3f}, {e['hi']:.3f}]")
  for name, k in report["k_star"].items():
    lines.append(f"  K* {name:<25} {k['value']:.1f} [{k['lo']:.1f}, {k['hi']:.1f}]")
  print("\n".join(lines))
  print(f"report: {os.path.join(report['out'], 'report.md')}")
  return 0


def headline_text(report: dict) -> str:
  """A few console lines: the headline Spearman of each signal, and the reference check."""
  lines = [f"drift report on {report['env']} ({report['steps']} steps, Spearman vs reference):"]
  for name in report.get("signal_order", report["headline"]):
    lines.append(f"  {name:<36} {_estimate_text(report['headline'][name]['spearman'], 3)}")
  ceiling = report["reference"]["check"].get("spearman_ceiling")
  if ceiling is not None:
    lines.append(f"  the reference's noise ceiling for Spearman: {ceiling:.3f}")
  from hindsight.drift.render import tied_reference_note

  tied = tied_reference_note(report["reference"])
  if tied:
    lines.append(f"  ({tied})")
  if "equivalent_rollouts" in report:
    e = report["equivalent_rollouts"]
    k = e["k"]
    if e.get("undefined"):
      lines.append(f"  equivalent rollouts: K undefined ({e['undefined']})")
    else:
      lines.append(f"  equivalent rollouts: K = {_estimate_text(k, 1)}")
  total = report.get("seconds", {}).get("total")
  if total is not None:
    lines.append(f"  wall time of the drift report: {total:.1f} s (a rerun reads its cache)")
  return "\n".join(lines)


def _estimate_text(e: dict, digits: int) -> str:
  """`value [lo, hi]` of an Estimate's dict; n/a for a value or bound that is undefined
  (NaN, stored as null)."""
  text = lambda x: "n/a" if x is None or x != x else f"{x:.{digits}f}"  # noqa: E731
  if text(e["value"]) == "n/a":
    return "n/a"
  return f"{text(e['value'])} [{text(e['lo'])}, {text(e['hi'])}]"


def _label(args) -> int:
  from hindsight import distributed
  from hindsight.labeling.config import LabelConfig, LabelJob
  from hindsight.labeling.job import run_label_job

  distributed.check_processes(args.coordinator, args.num_processes, args.process_id)
  distributed.initialize(args.coordinator, args.num_processes, args.process_id)
  config = build(LabelConfig, args, stratify=not args.unstratified)
  job = build(LabelJob, args, config=config, text=_text_options(args))
  path = run_label_job(job, args.out, progress=not args.no_progress)
  print(f"labels: {path}")
  return 0


def _import(args) -> int:
  from hindsight.text.similarity import Similarity
  from hindsight.text.thought_anchors import import_thought_anchors

  path = import_thought_anchors(
    args.dir,
    args.out,
    replacement=args.replacement,
    similarity=Similarity(args.embedding, args.similarity),
    tolerance=args.decorative_tolerance,
    confidence=args.confidence,
  )
  print(f"labels: {path}")
  return 0


def _text_world(args) -> int:
  from hindsight.text import world

  if args.world_command == "serve":
    from hindsight.text.server import serve_world

    serve_world(args.host, args.port)
    return 0
  if args.world_command == "prompts":
    from hindsight.errors import HindsightError
    from hindsight.text.trace import write_traces

    if args.episodes < 1:
      raise HindsightError(f"--episodes must be >= 1, got {args.episodes}")
    if args.max_count < 0:
      raise HindsightError(f"--max-count must be >= 0, got {args.max_count}")
    counts = (1, args.max_count + 1) if args.max_count else world.COUNTS
    write_traces(args.out, world.prompt_traces(args.seed, args.episodes, counts))
    print(f"prompts: {args.out}")
    return 0
  from hindsight.files import write_json
  from hindsight.text.exact import compare_to_exact

  report = compare_to_exact(args.dir)
  write_json(args.out, report)
  s = report["summary"]
  print(
    f"{s['steps']} steps of {s['traces']} traces: z RMS {s['z_rms']:.3f}, |z| > 3 on "
    f"{s['z_over_3']}, exact zeros where the truth is not 0: {s['false_zeros']}"
  )
  return 0


def _export(args) -> int:
  from hindsight.data import episode_to_json, open_labels

  labels = open_labels(args.dir)
  klass_names = labels.metadata.get("klass_names")
  for example in labels:
    line = json.dumps(episode_to_json(example, klass_names), sort_keys=True, allow_nan=False)
    sys.stdout.write(line + "\n")
  return 0


def _summary(args) -> int:
  from hindsight.data import open_labels
  from hindsight.metrics import summarize

  print(summarize(open_labels(args.dir)))
  return 0


def _coalition(args) -> int:
  import numpy as np

  from hindsight.credit import coalition
  from hindsight.errors import HindsightError

  try:
    values = np.load(args.values, allow_pickle=False)
  except OSError as e:
    raise HindsightError(f"--values {args.values}: cannot read it ({e.strerror or e})") from None
  except ValueError:  # numpy's words for a text or pickle file are about pickles
    raise HindsightError(
      f"--values {args.values}: not a .npy array file (write one with numpy.save)"
    ) from None
  if values.ndim != 1 or not np.issubdtype(values.dtype, np.number):
    raise HindsightError(f"--values {args.values}: expected a 1-D numeric array, got "
                         f"{values.dtype} {values.shape}")  # fmt: skip
  if not np.all(np.isfinite(values)):
    bad = int(np.flatnonzero(~np.isfinite(values))[0])
    raise HindsightError(f"--values {args.values}: v[{bad}] = {values[bad]} is not finite")
  n = coalition.num_agents(values)
  if n > 20:
    raise HindsightError(f"--values {args.values}: more than 20 agents; use shapley_sampled")
  d = np.asarray(coalition.dividends(values))

  def rounded(x):  # float32 results, printed to the precision they carry
    return np.asarray(x, np.float64).round(5).tolist()

  out = {
    "agents": n,
    "shapley": rounded(coalition.shapley(values)),
    "interaction": rounded(coalition.interaction(values)),
    "pair_terms": rounded(coalition.pair_terms(values)),
    # Non-zero dividends by coalition, members listed: {"0,2": d({0, 2}), ...}.
    "dividends": {
      ",".join(str(i) for i in range(n) if m >> i & 1) or "{}": round(float(d[m]), 5)
      for m in range(1 << n)
      if abs(d[m]) > 1e-9
    },
  }
  # One line per key, compact values: valid JSON that reads like the labeling docs' sample.
  print("{" + ",\n ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in out.items()) + "}")
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = _parser()
  args, rest = parser.parse_known_args(argv)
  args.argv = list(sys.argv[1:] if argv is None else argv)[1:]
  # `hindsight train` and `hindsight rl` take --config.FIELD=VALUE overrides (or
  # --config.FIELD VALUE); nothing else may be unknown.
  args.config_overrides, bare = [], ""
  if args.command in ("train", "rl"):
    from hindsight.cli_options import split_overrides

    args.config_overrides, rest, bare = split_overrides(rest)
  if rest:
    parser.error(f"unrecognized arguments: {' '.join(rest)}")
  if bare:
    parser.error(f"{bare} needs a value: {bare}=VALUE")
  use_all_cpu_cores()
  from hindsight import interrupts
  from hindsight.compile_cache import enable_compilation_cache
  from hindsight.errors import report_errors

  interrupts.install()
  enable_compilation_cache()
  commands = {
    "label": _label,
    "train": _train,
    "rl": _rl,
    "export": _export,
    "summary": _summary,
    "coalition": _coalition,
    "eval": _eval,
    "score": _score,
    "serve": _serve,
    "audit": _audit,
    "import": _import,
    "text-world": _text_world,
    "lm": _lm,
  }
  try:
    return report_errors("hindsight", commands[args.command], args, words=in_flag_terms)
  except KeyboardInterrupt:
    print("hindsight: interrupted (rerun the same command to resume)", file=sys.stderr)
    return 130
  except BrokenPipeError:
    # `hindsight export DIR | head`: the reader left; that is not an error.
    sys.stderr.close()
    return 0


if __name__ == "__main__":
  sys.exit(main())
