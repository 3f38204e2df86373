"""Variable kinds of the credit model beyond nnx's parameters."""

from flax import nnx


class Constant(nnx.Variable):
  """Data statistics fixed at construction: checkpointed with the model, never trained."""
