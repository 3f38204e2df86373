"""The small language model's configs, importable without jax (the CLI builds its flags from
them)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LMConfig:
  vocab_size: int = 512  # the tokenizer's (hindsight.text.tokenizer)
  width: int = 128  # W
  depth: int = 3  # layers
  num_heads: int = 4  # H
  mlp_ratio: int = 4  # MLP hidden = mlp_ratio * W
  max_len: int = 384  # S: positions, the prompt and its continuation together

  @property
  def head_dim(self) -> int:
    return self.width // self.num_heads


@dataclasses.dataclass(frozen=True)
class LMTrainConfig:
  traces: int = 4000  # text-world traces sampled for training (5% held out)
  # Box counts of its problems are 1 .. max_count: small enough that a small model learns
  # their sums (with the world's 3 .. 59 its drafts and answers are nearly always wrong).
  max_count: int = 5
  seed: int = 0  # the traces, the tokenizer's input, the initialisation, the batch order
  steps: int = 2000  # optimizer steps
  batch_size: int = 16  # traces per step
  learning_rate: float = 3e-3  # peak
  warmup_steps: int = 100
  eval_every: int = 250  # held-out loss and a checkpoint
  vocab_size: int = 512  # BPE ids
  width: int = 128
  depth: int = 2
  num_heads: int = 4
  max_len: int = 384  # prompt and continuation, in tokens
  progress: bool = True

  @property
  def counts(self) -> tuple[int, int]:
    """The [lo, hi) of its problems' box counts (`text.world.problems`)."""
    return (1, self.max_count + 1)

  def lm_config(self, vocab_size: int) -> LMConfig:
    return LMConfig(vocab_size, self.width, self.depth, self.num_heads, 4, self.max_len)
