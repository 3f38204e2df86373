"""The names of the replacement distributions and of the step classes (no JAX: the CLI's choices
and a dataset's metadata come from here)."""

REPLACEMENTS = ("policy", "policy_other", "uniform", "null", "policy_no_repeat")
# The classes of `credit.estimators.classify`, by id.
KLASS_NAMES = ("decorative", "load_bearing", "harmful", "undetermined")
