"""The credit model (flax.nnx), its loss, checkpoints and sharding."""

from hindsight.model.checkpoints import Checkpoints, verify_manifest, write_manifest
from hindsight.model.credit_model import CreditModel, ModelConfig
from hindsight.model.loss import LossConfig, credit_loss, gaussian_nll
from hindsight.model.predictor import Predictor
from hindsight.model.programs import OptimConfig, ProgramsConfig, train_programs
from hindsight.model.sharding import global_batch, make_mesh, state_shardings

__all__ = [
  "Checkpoints",
  "CreditModel",
  "LossConfig",
  "ModelConfig",
  "OptimConfig",
  "Predictor",
  "ProgramsConfig",
  "credit_loss",
  "gaussian_nll",
  "global_batch",
  "make_mesh",
  "state_shardings",
  "train_programs",
  "verify_manifest",
  "write_manifest",
]
