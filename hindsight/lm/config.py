"""The small language model's configs, importable without jax (the CLI builds its flags from
them)."""

from __future__ import annotations

import dataclasses

from hindsight.errors import HindsightError


@dataclasses.dataclass(frozen=True)
class LMConfig:
  vocab_size: int = 512  # the tokenizer's (hindsight.model.encoders.tokenizer)
  width: int = 128  # W
  depth: int = 3  # layers
  num_heads: int = 4  # H
  mlp_ratio: int = 4  # MLP hidden = mlp_ratio * W
  max_len: int = 384  # S: positions, the prompt and its continuation together

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads


def _field(default, help: str):
  return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class LMTrainConfig:
  """How `hindsight lm train` trains the small language model (each field is a flag)."""

  traces: int = _field(4000, "text-world traces to train on (5%% held out)")
  # Box counts of its problems are 1 .. max_count: small enough that a small model learns
  # their sums (with the world's 3 .. 59 its drafts and answers are nearly always wrong).
  max_count: int = _field(5, "box counts of its problems are 1 .. this")
  seed: int = _field(0, "seed of the traces, the initialisation and the batch order")
  steps: int = _field(2000, "optimizer steps")
  batch_size: int = _field(16, "traces per step")
  learning_rate: float = _field(3e-3, "peak AdamW learning rate")
  warmup_steps: int = _field(100, "linear warmup steps")
  eval_every: int = _field(250, "steps between the held-out loss and a checkpoint")
  vocab_size: int = _field(512, "BPE vocabulary")
  width: int = _field(128, "model width")
  depth: int = _field(2, "layers")
  num_heads: int = _field(4, "attention heads")
  max_len: int = _field(384, "context in tokens (prompt and continuation)")
  progress: bool = True

  def __post_init__(self):
    for name in ("traces", "steps", "batch_size", "eval_every", "width", "depth", "max_len",
                 "max_count"):  # fmt: skip
      if getattr(self, name) < 1:
        raise HindsightError(f"{name} must be >= 1, got {getattr(self, name)}")

  @property
  def counts(self) -> tuple[int, int]:
    """The [lo, hi) of its problems' box counts (`text.world.problems`)."""
    return (1, self.max_count + 1)

  def lm_config(self, vocab_size: int) -> LMConfig:
    return LMConfig(vocab_size, self.width, self.depth, self.num_heads, 4, self.max_len)
