"""The one exception type for bad input, and the one way programs report it.

Every user-facing mistake (a malformed file, a config that does not fit, a request that
cannot be served) raises `HindsightError` with a one-line message naming what is wrong.
Programs run their work through `report_errors`, which turns it (and the filesystem's
refusals, OSError) into `PROG: error: <message>` and exit code 2, never a traceback; servers
answer it as a 4xx with `error_body`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable


class HindsightError(ValueError):
  """Bad input: the message is one line and names the offending thing."""

  # Set on errors after which the process must leave without running its exit handlers
  # (`report_errors` then ends it at once): see `hindsight.distributed.ProcessLost`.
  exit_at_once = False


def one_line(message: object) -> str:
  """Any message folded into one line (third-party messages can span several)."""
  return " ".join(str(message).split())


# OpenAI's error type of each status every server here answers with.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "NotFoundError", 409: "conflict_error",
               413: "request_too_large", 503: "service_unavailable"}  # fmt: skip


def error_body(status: int, message: str, kind: str | None = None) -> dict:
  """The JSON body of a refused request, OpenAI's shape (vLLM's and every server of this
  package): {"error": {"message": one line, "type", "param": null, "code": status}}."""
  kind = kind or ERROR_TYPES.get(status, "internal_server_error" if status >= 500 else "error")
  return {"error": {"message": one_line(message), "type": kind, "param": None, "code": status}}


def note(message: str) -> None:
  """A one-line remark on stderr (`hindsight: MESSAGE`): a default chosen for the user, or
  something that will not work as they may expect; the job goes on."""
  print(f"hindsight: {one_line(message)}", file=sys.stderr, flush=True)


def make_dir(path: str, what: str) -> str:
  """os.makedirs(path, exist_ok=True), or a one-line HindsightError naming `what` (a flag)."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise HindsightError(f"{what} {path}: cannot create it ({e.strerror or e})") from None
  if not os.access(path, os.W_OK):
    raise HindsightError(f"{what} {path}: not writable")
  return path


def report_errors(
  prog: str, fn: Callable[..., int], *args, words: Callable[[str], str] = str
) -> int:
  """fn(*args), with bad input and filesystem refusals as one line on stderr and exit 2.
  words: the program's way of saying a library message (the CLI names its flags)."""
  try:
    return fn(*args)
  except HindsightError as e:
    print(f"{prog}: error: {words(one_line(e))}", file=sys.stderr)
    if e.exit_at_once:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(2)
  except BrokenPipeError:
    raise  # a reader that left is not bad input: the caller decides
  except OSError as e:
    where = f"{e.filename}: " if e.filename else ""
    print(f"{prog}: error: {where}{one_line(e.strerror or e)}", file=sys.stderr)
  return 2
