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
# The step encoder on a language model's backbone (the llm extra): loaded when a config or a
# checkpoint names the kind `lm_backbone`.
_plugins.declare("lm_backbone", "hindsight.lm.credit_encoder", on_demand=True)
# A language model's RL runs (the llm extra): `hindsight.rl.load_policy` of a run of kind `lm`.
_plugins.declare("lm", "hindsight.lm.rl.trainer", on_demand=True)

# Name -> the module that defines it. Loaded on first use (PEP 562), so `import hindsight`
# (and the CLI, which imports it) does not pay for TFDS, orbax and matplotlib up front.
_HOMES = {
  # labels: environments, policies, the labeler and its job
  "Environment": "hindsight.envs",
  "TabularEnv": "hindsight.envs",
  "TabularMDP": "hindsight.envs",
  "key_corridor_mdp": "hindsight.envs",
  "load_tabular": "hindsight.envs",
  "make": "hindsight.envs",
  "random_mdp": "hindsight.envs",
  "make_py_env": "hindsight.envs.families",
  "KeyToDoor": "hindsight.envs.key_to_door",
  "KeyToDoorPolicy": "hindsight.envs.key_to_door",
  "Reasoning": "hindsight.envs.reasoning",
  "ReasoningPolicy": "hindsight.envs.reasoning",
  "Policy": "hindsight.policies",
  "TabularPolicy": "hindsight.policies",
  "LabelConfig": "hindsight.labeling",
  "Labeler": "hindsight.labeling",
  "Trajectory": "hindsight.labeling",
  "episode_key": "hindsight.labeling.engine",
  "LabelJob": "hindsight.labeling.config",
  "run_label_job": "hindsight.labeling.job",
  # the credit math
  "credit": "hindsight.credit",
  "KLASS_NAMES": "hindsight.credit",
  "REPLACEMENTS": "hindsight.credit.names",
  "tabular_values": "hindsight.credit",
  # label datasets and episodes
  "Episode": "hindsight.data.episode",
  "LabelMetadata": "hindsight.data.metadata",
  "Labels": "hindsight.data",
  "open_labels": "hindsight.data",
  "prediction_metrics": "hindsight.metrics",
  "summarize": "hindsight.metrics",
  "tag_table": "hindsight.metrics",
  # the credit model
  "model": "hindsight.model",
  "CreditModel": "hindsight.model",
  "DataSpec": "hindsight.model.spec",
  "ModelConfig": "hindsight.model",
  "Predictor": "hindsight.model",
  # evaluation and audits
  "audit": "hindsight.audit",
  "drift": "hindsight.drift",
  "HindsightError": "hindsight.errors",
  # extension points: each registry and the interface its entries meet
  "EnvFamily": "hindsight.envs.families",
  "register_family": "hindsight.envs.families",
  "LabelSource": "hindsight.labeling.label_source",
  "SourceInfo": "hindsight.labeling.label_source",
  "SourceEntry": "hindsight.labeling.source",
  "register_label_source": "hindsight.labeling.source",
  "StepEncoder": "hindsight.model.encoders",
  "DiscreteEncoder": "hindsight.model.encoders",
  "VectorEncoder": "hindsight.model.encoders",
  "TextEncoder": "hindsight.model.encoders",
  "register_encoder": "hindsight.model.encoders",
  "register_format": "hindsight.data.formats",
  "CreditSource": "hindsight.rl.sources",
  "ConfigNode": "hindsight.rl.sources",
  "register_source": "hindsight.rl.sources",
  "register_config_node": "hindsight.rl.sources",
  "AuditBackend": "hindsight.audit.backend",
  "register_audit_backend": "hindsight.audit.backend",
  "DriftBackend": "hindsight.drift.backend",
  "register_drift_backend": "hindsight.drift.backend",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = sorted(_HOMES)
