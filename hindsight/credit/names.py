"""The replacement distributions' names (no JAX: the CLI's choices come from here)."""

REPLACEMENTS = ("policy", "policy_other", "uniform", "null", "policy_no_repeat")
