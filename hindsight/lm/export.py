"""`hindsight lm export RUN --out DIR`: a language model as a Hugging Face folder, for vLLM,
SGLang, `transformers` or `hindsight lm serve --lm DIR`.

RUN is a `hindsight rl --config rl_text` run (the tuned policy of `--seed`), a `hindsight lm
train` workdir, or a Hugging Face folder. DIR gets config.json, model.safetensors and
tokenizer.json (`hf.write_hf`), generation_config.json with the end-of-sequence ids, and the
chat template of the folder the model came from (tokenizer_config.json) where it had one. The
folder is written beside DIR and renamed into place when complete: a killed export leaves no
folder that looks finished.
"""

from __future__ import annotations

import json
import os
import shutil

from hindsight.errors import HindsightError


def load_any(path: str, seed: int = 0):
  """The LoadedLM of an RL run's seed, a `hindsight lm train` workdir or a Hugging Face
  folder."""
  from hindsight.lm.train import load_lm
  from hindsight.rl.load import load_policy

  if os.path.isfile(os.path.join(path, "results.json")):
    lm, _ = load_policy(path, seed)
    return lm
  return load_lm(path)


def export_lm(path: str, out: str, seed: int = 0) -> str:
  """Writes the model at `path` (module docstring) as the Hugging Face folder `out`."""
  from hindsight.lm import hf
  from hindsight.text.chat_template import TOKENIZER_CONFIG, ChatTemplate

  if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
    raise HindsightError(f"out {out} exists and is not an empty directory")
  lm = load_any(path, seed)
  if lm.tokenizer.kind == "bytes":
    raise HindsightError(f"{path}: a bytes tokenizer has no tokenizer.json to export")
  partial = out.rstrip("/") + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  hf.write_hf(lm.model, lm.cfg, lm.tokenizer, partial)
  eos = list(lm.cfg.eos_ids)
  with open(os.path.join(partial, hf.GENERATION), "w") as f:
    json.dump({"eos_token_id": eos if len(eos) > 1 else eos[0], "pad_token_id": lm.cfg.pad_id},
              f, indent=1)  # fmt: skip
  chat = ChatTemplate.from_json(lm.record.get("chat"))
  if chat is not None:
    with open(os.path.join(partial, TOKENIZER_CONFIG), "w") as f:
      json.dump({"chat_template": chat.source, **dict(chat.tokens)}, f, indent=1)
  if os.path.isdir(out):
    os.rmdir(out)  # empty, checked above
  os.replace(partial, out)
  return out
