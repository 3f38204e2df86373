"""RL with credit: policies trained on hindsight's credit (and on the signals it is compared
with), the credit model kept current as they move, and the experiment that measures it.

  from hindsight.rl import load_policy, train_and_evaluate
  env, policy = load_policy("runs/rl/reasoning/mc_credit")   # ready for Labeler(env, policy, ...)
"""

from hindsight._lazy import lazy_exports

_HOMES = {
  "ConfigNode": "hindsight.rl.sources",
  "CreditSource": "hindsight.rl.sources",
  "Terms": "hindsight.rl.sources",
  "Branched": "hindsight.rl.sources",
  "Steps": "hindsight.rl.sources",
  "StepSignal": "hindsight.rl.sources",
  "register_config_node": "hindsight.rl.sources",
  "register_source": "hindsight.rl.sources",
  "registered_sources": "hindsight.rl.sources",
  "base_config": "hindsight.rl.config",
  "load_policy": "hindsight.rl.load",
  "train_and_evaluate": "hindsight.rl.trainer",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
__all__ = sorted(_HOMES)
