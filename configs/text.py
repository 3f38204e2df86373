"""Credit model on text traces: the steps' text read by a step encoder (data.tokenizer).

  hindsight train --config text --labels DIR --workdir runs/text/model
  (`make demo-text` labels the text world's traces, or the small language model's, first.)

The labels come from `hindsight label --env text:FILE.jsonl` (docs/text.md). The model is the
functional `reasoning` config's trajectory transformer with each step's observation replaced by
its text: a 512-id byte-level BPE trained on the training split's steps, embedded, convolved and
pooled per step (`model.credit_model.StepEncoder`). The :smoke variant is for tests.
"""

from hindsight import default_config as common


def get_config(arg: str = ""):
  c = common.base_config()
  c.data.tokenizer = "bpe"  # "bpe": byte-level BPE trained on the training steps; "bytes"
  c.data.vocab_size = 512  # BPE ids (PAD, EOS, the 256 bytes, then merges)
  c.data.num_buckets = 2  # traces are 2-20 steps
  # Every text label's stderr is the tie bound at these K (independent arms of 0/1 outcomes),
  # so the loss takes out each label's sample stderr instead (hindsight/default_config.py).
  c.loss.sample_noise = True
  c.train.steps = 4000  # on 8,000 traces at K = 16: K* 213 against the exact credit (docs/text.md)
  return common.with_variant(c, arg)
