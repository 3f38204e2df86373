"""Behaviour policies as pure functions of (params, state)."""

from hindsight.policies.base import Policy, sample_categorical, sample_categorical_from_uniform
from hindsight.policies.tabular import TabularPolicy

__all__ = ["Policy", "TabularPolicy", "sample_categorical", "sample_categorical_from_uniform"]
