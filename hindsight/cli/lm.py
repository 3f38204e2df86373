"""`hindsight lm train | serve | export`: a Qwen2-architecture language model (the `llm` extra),
trained on the text world or on your own text traces (`--traces-file`), served at
/v1/completions and written as a Hugging Face folder;
`--lm PATH` starts from or serves a Hugging Face Qwen2 / Llama 3 folder (docs/text.md)."""

from __future__ import annotations

from hindsight.cli.options import build, dataclass_flags
from hindsight.cli.parser import Parser, no_progress

NAME = "lm"
HELP = "a language model (Qwen2 / Llama 3): train it, serve it (/v1/completions), export it"


def add_parser(sub):
  from hindsight.lm.config import LMTrainConfig

  lm = sub.add_parser(NAME, help=HELP)
  lm_sub = lm.add_subparsers(dest="lm_command", required=True, parser_class=Parser)
  lmt = lm_sub.add_parser("train", help="train it on the text world's traces or your own "
                          "(rerun resumes)")  # fmt: skip
  lmt.add_argument("--workdir", required=True, help="checkpoints (rerun to resume)")
  dataclass_flags(lmt, LMTrainConfig)
  lmt.add_argument(
    "--traces-file",
    default=None,
    metavar="FILE.jsonl",
    help="train on these text traces (hindsight label's text:FILE.jsonl format: a prompt, "
    "then steps or text) instead of the text world's; --traces, --world and --max-count "
    "then have no say",
  )
  no_progress(lmt)
  lms = lm_sub.add_parser("serve", help="serve it at /v1/completions (continuous batching)")
  which = lms.add_mutually_exclusive_group(required=True)
  which.add_argument("--workdir", help="a `hindsight lm train` workdir")
  which.add_argument("--lm", help="a Hugging Face Qwen2 / Llama 3 folder (local files)")
  lms.add_argument("--host", default="127.0.0.1", help="interface to listen on")
  lms.add_argument("--port", type=int, default=8101, help="port")
  lms.add_argument("--max-batch", type=int, default=64, help="choices sampled at once (slots)")
  lms.add_argument("--max-len", type=int, default=None,
                   help="context in tokens (default: the model's, at most 2048)")  # fmt: skip
  lms.add_argument(
    "--served-model-name",
    default=None,
    help="the model's name in requests and /v1/models (default: the folder's)",
  )
  lms.add_argument(
    "--no-warmup",
    action="store_true",
    help="serve at once; each program compiles on the first request needing it",
  )
  lme = lm_sub.add_parser("export", help="write it as a Hugging Face folder (vLLM, transformers)")
  lme.add_argument("run", help="a `hindsight rl --config rl_text` run, a `hindsight lm train` "
                   "workdir or a Hugging Face folder")  # fmt: skip
  lme.add_argument("--out", required=True, help="the folder to write (new or empty)")
  lme.add_argument("--seed", type=int, default=0, help="an RL run's seed (its index)")
  return lm


def interrupted(args) -> str:
  """What Ctrl-C says: a server stops; a training run resumes."""
  if args.lm_command == "serve":
    return "stopped"
  return "interrupted (rerun the same command to resume)"


def run(args) -> int:
  if args.lm_command == "serve":
    from hindsight.lm.server import serve_lm

    serve_lm(args.workdir or args.lm, args.host, args.port, warmup=not args.no_warmup,
             max_batch=args.max_batch, max_len=args.max_len,
             name=args.served_model_name)  # fmt: skip
    return 0
  if args.lm_command == "export":
    from hindsight.lm.backbone import require_llm
    from hindsight.lm.export import export_lm

    require_llm()
    print(f"hugging face folder: {export_lm(args.run, args.out, args.seed)}")
    return 0
  from hindsight.lm.config import LMTrainConfig
  from hindsight.lm.train import train_lm

  config = build(LMTrainConfig, args, progress=not args.no_progress)
  result = train_lm(config, args.workdir, traces_file=args.traces_file)
  print(f"language model: {result['workdir']} (step {result['step']}, held-out loss "
        f"{result['val_loss']:.4f})")  # fmt: skip
  return 0
