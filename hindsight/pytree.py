"""Frozen dataclasses that are JAX pytrees: environment states and the labeler's records.

`pytree.dataclass` does what `flax.struct.dataclass` does for these classes (every field a
leaf, in declaration order, and `.replace(**changes)`), on `jax.tree_util.register_dataclass`
alone: the label path then never imports flax, 0.2 s of a warm `hindsight label`.
"""

from __future__ import annotations

import dataclasses

import jax


def dataclass(cls: type) -> type:
  """cls as a frozen dataclass registered as a pytree whose fields are all leaves."""
  cls = dataclasses.dataclass(frozen=True)(cls)
  fields = [f.name for f in dataclasses.fields(cls)]
  jax.tree_util.register_dataclass(cls, data_fields=fields, meta_fields=[])

  def replace(self, **changes):
    """A copy with `changes` applied (dataclasses.replace)."""
    return dataclasses.replace(self, **changes)

  cls.replace = replace
  return cls
