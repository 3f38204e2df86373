"""Step encoders: how the credit model reads what each step shows, one module per kind
(`base.StepEncoder`: record, host, device), looked up by the kind a checkpoint or a dataset
names. The kinds that ship: discrete ids, float vectors, text steps (with its tokenizer)."""

from hindsight.model.encoders import discrete, text, vector  # noqa: F401  (registers them)
from hindsight.model.encoders.base import (
  StepEncoder,
  detect_encoder,
  encoder_class,
  register_encoder,
  registered_encoders,
)
from hindsight.model.encoders.discrete import DiscreteEncoder
from hindsight.model.encoders.text import TextEncoder, token_bucket
from hindsight.model.encoders.vector import VectorEncoder, observation_statistics

__all__ = [
  "DiscreteEncoder",
  "StepEncoder",
  "TextEncoder",
  "VectorEncoder",
  "detect_encoder",
  "encoder_class",
  "observation_statistics",
  "register_encoder",
  "registered_encoders",
  "token_bucket",
]
