"""Credit model on text traces read by a language model's decoder (the `lm_backbone` step
encoder): the prompt and the steps as one token sequence, each step's state at its last
token, the decoder initialised from the policy's weights.

  hindsight train --config text_lm --labels DIR --workdir runs/text/lm_model \
      --config.data.lm=runs/text-demo/lm          # the policy: `hindsight lm train` workdir
  hindsight train --config text_lm --labels DIR --workdir W --config.data.lm=PATH/Qwen2.5-0.5B

`data.lm` is a `hindsight lm train` workdir or a Hugging Face Qwen2 / Llama 3 folder (its
tokenizer comes with it); "" trains a small random Qwen2 on a BPE of the training steps.
`data.lm_init = "random"` keeps the policy's architecture and tokenizer but not its weights.
The trajectory transformer over steps is the text config's. The :smoke variant is for tests.
"""

from hindsight.configs import text


def get_config(arg: str = ""):
  c = text.get_config(arg)
  c.data.encoder = "lm_backbone"
  c.data.lm = ""  # the policy's folder; "" a fresh small Qwen2
  c.data.lm_init = "pretrained"  # or "random"
  c.data.lm_width = 64  # the fresh Qwen2's width (data.lm = "" only)
  # The decoder is pretrained: a smaller step than the text config's from-scratch encoder.
  c.optim.learning_rate = 1e-3
  return c
