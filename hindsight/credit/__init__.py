"""The credit math: replacement distributions, MC estimators, exact oracles, coalitions.

Names load their module on first use (`hindsight._lazy`): the CLI's parser reads the
replacement names without importing JAX.
"""

from hindsight._lazy import lazy_exports

_HOMES = {
  "KLASS_NAMES": "hindsight.credit.names",
  "REPLACEMENTS": "hindsight.credit.names",
  "bounded_mean_stderr": "hindsight.credit.estimators",
  "check_replacement": "hindsight.credit.replacement",
  "classify": "hindsight.credit.estimators",
  "coma_advantage": "hindsight.credit.coalition",
  "dividends": "hindsight.credit.coalition",
  "exact_step_credit": "hindsight.credit.exact",
  "interaction": "hindsight.credit.coalition",
  "mean_stderr": "hindsight.credit.estimators",
  "pair_terms": "hindsight.credit.coalition",
  "replacement_probs": "hindsight.credit.replacement",
  "shapley": "hindsight.credit.coalition",
  "shapley_sampled": "hindsight.credit.coalition",
  "tabular_values": "hindsight.credit.exact",
  "tie_upper_rates": "hindsight.credit.estimators",
  "z_value": "hindsight.credit.estimators",
}
# Its modules too, as attributes (`hindsight.credit.coalition.shapley`), as before the
# exports were lazy.
_MODULES = ("coalition", "estimators", "exact", "fields", "names", "policy_gradient", "replacement")
_HOMES.update({m: f"hindsight.credit.{m}" for m in _MODULES})
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(set(_HOMES) - set(_MODULES))
