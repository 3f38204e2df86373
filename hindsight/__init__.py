"""hindsight: which steps of a trajectory earned the reward?

One flat public API (rlax style). Environments and policies are functional (gymnax style);
the labeler branches trajectories at every step and measures interventional credit, and the
credit model (`hindsight.model`) learns to predict it in one forward pass; `Predictor` loads
a trained one, `hindsight.drift` measures it against the reference credit, and
`hindsight.audit` spot-checks a served one against rollouts (drift alarm, repair labels).
"""

from hindsight import plugins as _plugins
from hindsight._lazy import lazy_exports

# The plug-ins that ship with hindsight (`hindsight.plugins`): each registers its pieces with
# the core's registries when first asked for by name, so no core package imports them.
_plugins.declare("text", "hindsight.text.plugin")

# Name -> the module that defines it. Loaded on first use (PEP 562), so `import hindsight`
# (and the CLI, which imports it) does not pay for TFDS, orbax and matplotlib up front.
_HOMES = {
  "audit": "hindsight.audit",
  "credit": "hindsight.credit",
  "drift": "hindsight.drift",
  "Episode": "hindsight.data.episode",
  "model": "hindsight.model",
  "KLASS_NAMES": "hindsight.credit",
  "REPLACEMENTS": "hindsight.credit.names",
  "tabular_values": "hindsight.credit",
  "Labels": "hindsight.data",
  "open_labels": "hindsight.data",
  "DataSpec": "hindsight.model.spec",
  "Environment": "hindsight.envs",
  "TabularEnv": "hindsight.envs",
  "TabularMDP": "hindsight.envs",
  "key_corridor_mdp": "hindsight.envs",
  "load_tabular": "hindsight.envs",
  "make": "hindsight.envs",
  "random_mdp": "hindsight.envs",
  "make_py_env": "hindsight.envs.adapters",
  "KeyToDoor": "hindsight.envs.key_to_door",
  "KeyToDoorPolicy": "hindsight.envs.key_to_door",
  "Reasoning": "hindsight.envs.reasoning",
  "ReasoningPolicy": "hindsight.envs.reasoning",
  "HindsightError": "hindsight.errors",
  "LabelConfig": "hindsight.labeling",
  "Labeler": "hindsight.labeling",
  "Trajectory": "hindsight.labeling",
  "episode_key": "hindsight.labeling.engine",
  "LabelJob": "hindsight.labeling.config",
  "run_label_job": "hindsight.labeling.job",
  "prediction_metrics": "hindsight.metrics",
  "summarize": "hindsight.metrics",
  "tag_table": "hindsight.metrics",
  "CreditModel": "hindsight.model",
  "ModelConfig": "hindsight.model",
  "Predictor": "hindsight.model",
  "Policy": "hindsight.policies",
  "TabularPolicy": "hindsight.policies",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
  "KLASS_NAMES",
  "REPLACEMENTS",
  "CreditModel",
  "DataSpec",
  "Environment",
  "Episode",
  "HindsightError",
  "KeyToDoor",
  "KeyToDoorPolicy",
  "LabelConfig",
  "LabelJob",
  "Labeler",
  "Labels",
  "ModelConfig",
  "Policy",
  "Predictor",
  "Reasoning",
  "ReasoningPolicy",
  "TabularEnv",
  "TabularMDP",
  "TabularPolicy",
  "Trajectory",
  "audit",
  "credit",
  "drift",
  "episode_key",
  "key_corridor_mdp",
  "load_tabular",
  "make",
  "make_py_env",
  "model",
  "open_labels",
  "prediction_metrics",
  "random_mdp",
  "run_label_job",
  "summarize",
  "tabular_values",
  "tag_table",
]
