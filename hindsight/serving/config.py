"""The server's model, batching and limits, and what `hindsight score` scores (light on
imports: the CLI's flags come from these fields)."""

from __future__ import annotations

import dataclasses
import os

from hindsight.errors import HindsightError

ADMIN_TOKEN_ENV = "HINDSIGHT_ADMIN_TOKEN"


@dataclasses.dataclass(frozen=True)
class ServeConfig:
  """The server's model, batching and limits (the `hindsight serve` flags)."""

  checkpoint: str
  step: str = "run"  # checkpoint step: run (the training run's choice), best, last or N
  window_ms: float = 0.5  # a batch closes once no request has arrived for this long
  max_batch: int = 64  # trajectories scored together at most
  max_body_bytes: int = 8 << 20
  max_trajectories: int = 256  # per request
  # per trajectory (0: the model's max_length, the longest episode it was trained on; more
  # opts in to scoring longer ones, whose positions past it reuse the last one it knows)
  max_steps: int = 0
  warmup: bool = True  # compile every bucket before /readyz says ready
  # Admin actions (POST /v1/reload) need `Authorization: Bearer TOKEN` with the token read
  # from this file (or HINDSIGHT_ADMIN_TOKEN); with neither, reload over HTTP is off.
  admin_token_file: str = ""
  # A checkpoint named in an HTTP reload must resolve inside the served run or this root.
  allow_reload_from: str = ""
  # The name /v1/models lists and a /pooling request's "model" must match ("": the run's
  # directory name).
  served_model_name: str = ""
  # /pooling (vLLM's process-reward form): the step tag that closes each step, as text and
  # as a token id of token-id inputs (Qwen2.5-Math-PRM's <extra_0>), and the marker after
  # which a string input's response starts (a chat template's assistant turn).
  step_tag: str = "<extra_0>"
  step_tag_id: int = 151651
  response_start: str = "<|im_start|>assistant\n"
  # The outcome in [0, 1] of a /pooling or /get_reward trace whose request gives none, or
  # only a reference that a model of `--verifier env` labels cannot check ("": such a
  # request is a 400 naming the field).
  outcome: str = ""

  def __post_init__(self):
    """One-line errors for limits the server cannot run with, naming the field (the CLI
    says its flag)."""
    for name in ("window_ms", "max_batch", "max_body_bytes", "max_trajectories", "max_steps"):
      value = getattr(self, name)
      if value < 0 or (name != "max_steps" and value == 0):
        raise HindsightError(f"{name} must be > 0, got {value}")
    if not self.step_tag:
      raise HindsightError("step_tag must not be empty")
    self.default_outcome()  # a bad --outcome fails the start

  def default_outcome(self) -> float | None:
    """`outcome` as a number in [0, 1], or None when it is not set."""
    if not self.outcome:
      return None
    try:
      value = float(self.outcome)
    except ValueError:
      value = float("nan")
    if not 0.0 <= value <= 1.0:
      raise HindsightError(f"outcome must be a number in [0, 1], got {self.outcome!r}")
    return value

  def model_name(self) -> str:
    """What /v1/models lists: served_model_name, or the run directory's name."""
    return self.served_model_name or os.path.basename(os.path.normpath(self.checkpoint))

  def steps_limit(self, spec) -> int:
    """Steps per trajectory served (and warmed up): max_steps, or the model's max_length."""
    return self.max_steps or spec.max_length

  def admin_token(self) -> str | None:
    """The admin bearer token: --admin-token-file's content, else $HINDSIGHT_ADMIN_TOKEN,
    else None (reload over HTTP off). A file that cannot be read or holds nothing is a
    one-line error, never a server whose admin is silently open or closed."""
    if self.admin_token_file:
      try:
        with open(self.admin_token_file) as f:
          token = f.read().strip()
      except OSError as e:
        raise HindsightError(
          f"admin_token_file {self.admin_token_file}: {e.strerror or e}"
        ) from None
      if not token:
        raise HindsightError(f"admin_token_file {self.admin_token_file} is empty")
      return token
    return os.environ.get(ADMIN_TOKEN_ENV, "").strip() or None

  def reload_roots(self) -> list[str]:
    """The directories an HTTP reload may read checkpoints from (resolved: symlinks and ..
    followed): the served run's and --allow-reload-from."""
    roots = [os.path.realpath(self.checkpoint)]
    if self.allow_reload_from:
      roots.append(os.path.realpath(self.allow_reload_from))
    return roots


@dataclasses.dataclass(frozen=True)
class ScoreConfig:
  """What `hindsight score` scores with what (its flags map onto these)."""

  checkpoint: str  # a training run's workdir
  input: str  # JSONL (the export format, or text traces) or a label dataset directory
  out: str  # the output JSONL
  step: str = "run"  # checkpoint step: run (the training run's choice), best, last or N
  allow_longer: bool = False  # score episodes longer than the model was trained on too
  progress: bool = True
