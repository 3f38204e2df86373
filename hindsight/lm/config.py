"""The language model's configs, importable without jax (the CLI builds its flags from them).

`BackboneConfig` is one decoder of the Qwen2 / Llama 3 family (pre-RMSNorm, rotary positions,
grouped-query attention, a SwiGLU MLP; Qwen2 adds biases to q, k and v): what a Hugging Face
`config.json` of those families says (`hf.read_config`), or the small model `hindsight lm
train` builds (`LMTrainConfig.backbone`).
"""

from __future__ import annotations

import dataclasses

from hindsight.errors import HindsightError

ARCHITECTURES = ("qwen2", "llama3")


@dataclasses.dataclass(frozen=True)
class BackboneConfig:
  """One decoder (module docstring). Frozen and hashable: jitted programs take it static.

  arch: "qwen2" (q, k, v biases) or "llama3".
  vocab_size V, width D (hidden_size), depth (layers), num_heads N, num_kv_heads K (N / K
  query heads share each key and value head), head_dim H, hidden F (the MLP's width).
  rope_theta: the rotary base; rope_scaling: Llama 3.1's frequency rescaling as
    (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings), or ().
  tied: the output projection is the input embedding's transpose.
  max_len S: the context in tokens (prompt and continuation).
  eos_ids: the tokens that end a completion; pad_id: the id padding is written with.
  """

  arch: str = "qwen2"
  vocab_size: int = 512
  width: int = 128
  depth: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  hidden: int = 384
  rope_theta: float = 10_000.0
  rope_scaling: tuple = ()
  norm_eps: float = 1e-6
  tied: bool = True
  max_len: int = 384
  eos_ids: tuple[int, ...] = (1,)
  pad_id: int = 0

  def __post_init__(self):
    if self.arch not in ARCHITECTURES:
      raise HindsightError(
        f"architecture {self.arch!r}: expected one of {', '.join(ARCHITECTURES)}"
      )
    if self.num_heads % self.num_kv_heads:
      raise HindsightError(
        f"{self.num_heads} attention heads do not split over {self.num_kv_heads} key-value heads"
      )

  @property
  def eos(self) -> int:
    """The first end-of-sequence id (what training appends)."""
    return self.eos_ids[0]

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["rope_scaling"], d["eos_ids"] = list(self.rope_scaling), list(self.eos_ids)
    return d

  @classmethod
  def from_json(cls, d: dict) -> BackboneConfig:
    d = dict(d)
    d["rope_scaling"] = tuple(d.get("rope_scaling", ()))
    d["eos_ids"] = tuple(int(i) for i in d.get("eos_ids", (1,)))
    return cls(**d)


def _field(default, help: str):
  return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class LMTrainConfig:
  """How `hindsight lm train` trains the language model (each field is a flag)."""

  traces: int = _field(4000, "text-world traces to train on (5%% held out)")
  world: str = _field(
    "text",
    "whose traces: text (the text world) or tools (the tool world's "
    "agent, its tool results in the text)",
  )
  # Box counts of its problems are 1 .. max_count: small enough that a small model learns
  # their sums (with the world's 3 .. 59 its drafts and answers are nearly always wrong).
  max_count: int = _field(5, "box counts of its problems are 1 .. this")
  seed: int = _field(0, "seed of the traces, the initialisation and the batch order")
  steps: int = _field(2000, "optimizer steps")
  batch_size: int = _field(16, "traces per step")
  learning_rate: float = _field(3e-3, "peak AdamW learning rate")
  warmup_steps: int = _field(100, "linear warmup steps")
  eval_every: int = _field(250, "steps between the held-out loss and a checkpoint")
  lm: str = _field(
    "", "start from this model (a Hugging Face Qwen2 / Llama 3 folder, or a `hindsight lm "
    "train` workdir) with its tokenizer; empty: a small Qwen2 from random weights"
  )  # fmt: skip
  vocab_size: int = _field(512, "BPE vocabulary (random start only)")
  width: int = _field(128, "model width (random start only)")
  depth: int = _field(2, "layers (random start only)")
  num_heads: int = _field(4, "attention heads (random start only)")
  num_kv_heads: int = _field(2, "key-value heads (random start only)")
  max_len: int = _field(384, "context in tokens, prompt and continuation")
  progress: bool = True

  def __post_init__(self):
    if self.world not in ("text", "tools"):
      raise HindsightError(f"world must be text or tools, got '{self.world}'")
    for name in ("traces", "steps", "batch_size", "eval_every", "width", "depth", "max_len",
                 "max_count", "num_heads", "num_kv_heads"):  # fmt: skip
      if getattr(self, name) < 1:
        raise HindsightError(f"{name} must be >= 1, got {getattr(self, name)}")

  @property
  def counts(self) -> tuple[int, int]:
    """The [lo, hi) of its problems' box counts (`worlds.world.problems`)."""
    return (1, self.max_count + 1)

  def backbone(self, vocab_size: int) -> BackboneConfig:
    """The small Qwen2 of a random start: head_dim = width / heads, MLP 3 x width."""
    return BackboneConfig(
      "qwen2", vocab_size, self.width, self.depth, self.num_heads, self.num_kv_heads,
      self.width // self.num_heads, 3 * self.width, max_len=self.max_len,
    )  # fmt: skip
