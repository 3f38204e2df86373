"""hindsight: which steps of a trajectory earned the reward?

One flat public API (rlax style). Environments and policies are functional (gymnax style);
the labeler branches trajectories at every step and measures interventional credit, and the
credit model (`hindsight.model`) learns to predict it in one forward pass; `Predictor` loads
a trained one, `hindsight.drift` measures it against the reference credit, and
`hindsight.audit` spot-checks a served one against rollouts (drift alarm, repair labels).
"""

from hindsight import audit, credit, drift, model
from hindsight.credit import KLASS_NAMES, REPLACEMENTS, tabular_values
from hindsight.data import Labels, open_labels
from hindsight.data.batching import DataSpec
from hindsight.envs import (
  Environment,
  TabularEnv,
  TabularMDP,
  key_corridor_mdp,
  load_tabular,
  make,
  random_mdp,
)
from hindsight.envs.adapters import make_py_env
from hindsight.envs.key_to_door import KeyToDoor, KeyToDoorPolicy
from hindsight.envs.reasoning import Reasoning, ReasoningPolicy
from hindsight.errors import HindsightError
from hindsight.labeling import LabelConfig, Labeler, Trajectory
from hindsight.labeling.engine import episode_key
from hindsight.labeling.job import LabelJob, run_label_job
from hindsight.metrics import prediction_metrics, summarize, tag_table
from hindsight.model import CreditModel, ModelConfig, Predictor
from hindsight.policies import Policy, TabularPolicy

__all__ = [
  "KLASS_NAMES",
  "REPLACEMENTS",
  "CreditModel",
  "DataSpec",
  "Environment",
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
