"""The credit math: replacement distributions, MC estimators, exact oracles, coalitions."""

from hindsight.credit.coalition import (
  coma_advantage,
  dividends,
  interaction,
  pair_terms,
  shapley,
  shapley_sampled,
)
from hindsight.credit.estimators import (
  KLASS_NAMES,
  bounded_mean_stderr,
  classify,
  mean_stderr,
  tie_upper_rates,
  z_value,
)
from hindsight.credit.exact import exact_step_credit, tabular_values
from hindsight.credit.replacement import REPLACEMENTS, check_replacement, replacement_probs

__all__ = [
  "KLASS_NAMES",
  "REPLACEMENTS",
  "bounded_mean_stderr",
  "check_replacement",
  "classify",
  "coma_advantage",
  "dividends",
  "exact_step_credit",
  "interaction",
  "mean_stderr",
  "pair_terms",
  "replacement_probs",
  "shapley",
  "shapley_sampled",
  "tabular_values",
  "tie_upper_rates",
  "z_value",
]
