"""Evaluators looked up by name (big_vision style): each is built once over a split and run
on a model state.

  evaluator = evaluators.get("label_fit")(programs, plan, reader, spec, mesh, rows)
  result = evaluator.run(state)

  validation_loss  weighted mean losses over a split (checkpoint selection)
  sigma_scale      the post-hoc scale of the predicted spread, fitted on a split
                   (`model.calibration`; the validation split)
  label_fit        the split's per-step predictions scored against its training labels
                   (report.json of a training run; against the *reference* credit is the
                   drift harness's job, `hindsight eval`)
"""

from __future__ import annotations

from hindsight.errors import HindsightError
from hindsight.evaluators.label_fit import LabelFitEvaluator, SigmaScaleEvaluator, write_label_fit
from hindsight.evaluators.split_pass import LossEvaluator, predict_split

REGISTRY = {
  "validation_loss": LossEvaluator,
  "label_fit": LabelFitEvaluator,
  "sigma_scale": SigmaScaleEvaluator,
}


def get(name: str):
  """The evaluator class registered as `name`."""
  if name not in REGISTRY:
    raise HindsightError(f"unknown evaluator '{name}' (known: {', '.join(REGISTRY)})")
  return REGISTRY[name]


__all__ = [
  "REGISTRY",
  "LabelFitEvaluator",
  "LossEvaluator",
  "SigmaScaleEvaluator",
  "get",
  "predict_split",
  "write_label_fit",
]
