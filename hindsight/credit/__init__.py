"""The credit math: replacement distributions, MC estimators, exact oracles."""

from hindsight.credit.estimators import KLASS_NAMES, classify, mean_stderr, z_value
from hindsight.credit.exact import exact_step_credit, tabular_values
from hindsight.credit.replacement import REPLACEMENTS, check_replacement, replacement_probs

__all__ = [
  "KLASS_NAMES",
  "REPLACEMENTS",
  "check_replacement",
  "classify",
  "exact_step_credit",
  "mean_stderr",
  "replacement_probs",
  "tabular_values",
  "z_value",
]
