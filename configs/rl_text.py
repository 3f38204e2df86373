"""GRPO of the text world's small language model on a per-step credit source (docs/rl.md, "RL
on a language model").

  hindsight rl --config rl_text --sources outcome,mc_credit,pp_credit,prm,shaped \
      --workdir runs/rl/text                          # the experiment (about an hour, 2 cores)
  hindsight rl --config rl_text --workdir runs/rl/text/mc_credit --config.source=mc_credit
  hindsight rl --config rl_text --config.lm=PATH/Qwen2.5-0.5B --config.prompts=mine.jsonl \
      --config.verifier=my_module:verify ...         # your own LM, prompts and verifier

5 seeds x 30 updates x 8 prompts x 4 completions. With no `lm`, the small LM is trained
first (about 4 minutes) into WORKDIR/lm. The :smoke variant (a barely trained LM, 2 seeds
of 2 updates) is for tests. Every field: hindsight/lm/rl/config.py.
"""

from hindsight.lm.rl.config import base_config, with_variant


def get_config(arg: str = ""):
  return with_variant(base_config(), arg)
