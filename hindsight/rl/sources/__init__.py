"""Credit sources: the per-step signal A_t [E, H] a policy update is driven by, and its cost
(`base.CreditSource`, the registry in `base`). One module per family of sources; importing
this package registers the ones that ship with hindsight, in the order docs/rl.md lists them
(those marked * train a language model too, the same class: `steps`):

  outcome*, gae                outcome.py        no labels
  mc_progress, mc_credit*      monte_carlo.py    the labeler under the current policy
  prm*, shaped*                prm.py            a learned P(success | history)
  learned, learned_current,    learned.py        the credit model
  learned_trust
  credit_cv, credit_cv_current,  action_values.py  per-action credit heads around the
  anchored, credit_gated                         outcome
  pp_credit*                   prediction_powered.py  the credit model, rectified by MC
                                                 credit on a few steps it chooses
"""

import importlib

from hindsight.rl.sources.base import (
  ConfigNode,
  CreditSource,
  Probe,
  Terms,
  config_nodes,
  credit_arm_steps,
  label_config,
  register_config_node,
  register_source,
  registered_sources,
  source_class,
)
from hindsight.rl.sources.steps import Branched, Steps, StepSignal

# The modules of the shipped sources, imported (so registered) in this order.
BUILTIN_MODULES = (
  "outcome",
  "monte_carlo",
  "prm",
  "learned",
  "action_values",
  "prediction_powered",
)
for _module in BUILTIN_MODULES:
  importlib.import_module(f"{__name__}.{_module}")

__all__ = [
  "Branched",
  "ConfigNode",
  "CreditSource",
  "Probe",
  "StepSignal",
  "Steps",
  "Terms",
  "config_nodes",
  "credit_arm_steps",
  "label_config",
  "prepare",
  "register_config_node",
  "register_source",
  "registered_sources",
  "source_class",
]


def prepare(task, config, progress: bool = False) -> CreditSource:
  """The source `config.source` for `task`, with any model it needs trained (or loaded)
  and what that cost in environment steps (`setup_steps`)."""
  source = source_class(config.source)(task, config)
  source.prepare(progress=progress)
  return source
