"""`hindsight serve`: a trained credit model over HTTP (POST /v1/credit, /pooling,
/get_reward; docs/serving.md)."""

from __future__ import annotations

from hindsight.cli.options import build, option
from hindsight.cli.parser import RUN_FLAG, RUN_HELP, STEP_HELP

NAME = "serve"
HELP = "serve credit over HTTP (POST /v1/credit, vLLM's /pooling, OpenRLHF's /get_reward)"


def add_parser(sub):
  from hindsight.serving.config import ServeConfig

  sv = sub.add_parser(NAME, help=HELP)
  option(sv, ServeConfig, "checkpoint", RUN_HELP, required=True, **RUN_FLAG)
  option(sv, ServeConfig, "step", STEP_HELP)
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
  option(sv, ServeConfig, "served_model_name",
         "the name GET /v1/models lists and /pooling requests name (default: the run's "
         "directory name)")  # fmt: skip
  option(sv, ServeConfig, "step_tag", "POST /pooling: the text that closes each step")
  option(sv, ServeConfig, "step_tag_id", "POST /pooling: the step tag's token id in token-id "
         "inputs (Qwen2.5-Math-PRM's <extra_0>)")  # fmt: skip
  option(sv, ServeConfig, "response_start", "POST /pooling: the marker after which a string "
         "input's response starts (before it: the prompt)")  # fmt: skip
  option(sv, ServeConfig, "outcome", "the outcome in [0, 1] of a /pooling or /get_reward "
         "trace whose request gives no outcome or reference, or a reference a model of "
         "--verifier env labels cannot check (default: such a request is a 400)")  # fmt: skip
  return sv


def interrupted(args) -> str:
  """What Ctrl-C says: the server stopped (nothing to resume)."""
  del args
  return "stopped"


def run(args) -> int:
  from hindsight.serving.app import serve
  from hindsight.serving.config import ServeConfig

  serve(build(ServeConfig, args), args.host, args.port)
  return 0
