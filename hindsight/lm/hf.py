"""Hugging Face checkpoints from local files: a Qwen2 / Qwen2.5 or Llama 3 folder (`config.json`,
`*.safetensors`, `tokenizer.json`) read with no network, and our own models written in that
layout (`write_hf`), so any tool of that ecosystem reads them too.

`read_config` maps `config.json` to a `BackboneConfig`; `load_hf` checks every weight's name
and shape against it (a one-line error naming the first missing or mismatched one) and hands
the folder to Tunix's safetensors loader, which maps Hugging Face's names onto its modules:

  model.embed_tokens.weight [V, D]            -> embedder.input_embedding [V, D]
  ...self_attn.{q,k,v}_proj.weight [N*H, D]   -> attn.{q,k,v}_proj.w [D, N, H]   (transposed)
  ...self_attn.{q,k,v}_proj.bias [N*H]        -> attn.{q,k,v}_bias               (Qwen2)
  ...self_attn.o_proj.weight [D, N*H]         -> attn.o_proj.w [N, H, D]
  ...mlp.{gate,up}_proj.weight [F, D]         -> mlp.{gate,up}_proj.kernel [D, F]
  ...mlp.down_proj.weight [D, F]              -> mlp.down_proj.kernel [F, D]
  ...{input,post_attention}_layernorm.weight  -> {input,post_attention}_layernorm.w
  model.norm.weight, lm_head.weight [V, D]    -> final_norm.w, lm_head.w [D, V]  (untied only)
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from hindsight.errors import HindsightError
from hindsight.lm.config import BackboneConfig

CONFIG, TOKENIZER, GENERATION = "config.json", "tokenizer.json", "generation_config.json"
MODEL_TYPES = {"qwen2": "qwen2", "llama": "llama3"}
DEFAULT_MAX_LEN = 2048  # the context a loaded model is run at unless told (its KV cache size)


def is_hf_folder(path: str) -> bool:
  return os.path.isfile(os.path.join(path, CONFIG))


def read_config(path: str, max_len: int | None = None) -> BackboneConfig:
  """The BackboneConfig of a Hugging Face folder's config.json; its context is `max_len`
  (default the smaller of the model's and DEFAULT_MAX_LEN)."""
  file = os.path.join(path, CONFIG)
  try:
    with open(file) as f:
      c = json.load(f)
  except OSError:
    raise HindsightError(f"{path}: no {CONFIG} (a Hugging Face model folder)") from None
  except ValueError:
    raise HindsightError(f"{file}: not JSON") from None
  kind = c.get("model_type")
  if kind not in MODEL_TYPES:
    raise HindsightError(
      f"{file}: model_type {kind!r} is not supported (qwen2 or llama: Qwen2, Qwen2.5, Llama 3)"
    )
  if c.get("use_sliding_window"):
    raise HindsightError(f"{file}: sliding-window attention is not supported")
  try:
    heads = int(c["num_attention_heads"])
    width = int(c["hidden_size"])
    scaling = c.get("rope_scaling") or {}
    if scaling and scaling.get("rope_type", scaling.get("type")) != "llama3":
      raise HindsightError(f"{file}: rope_scaling {scaling} is not supported (llama3 only)")
    rope_scaling = ()
    if scaling:
      rope_scaling = (float(scaling["factor"]), float(scaling["low_freq_factor"]),
                      float(scaling["high_freq_factor"]),
                      int(scaling["original_max_position_embeddings"]))  # fmt: skip
    eos = end_ids(path, c)
    context = int(c.get("max_position_embeddings", DEFAULT_MAX_LEN))
    pad = c.get("pad_token_id")
    return BackboneConfig(
      arch=MODEL_TYPES[kind],
      vocab_size=int(c["vocab_size"]),
      width=width,
      depth=int(c["num_hidden_layers"]),
      num_heads=heads,
      num_kv_heads=int(c.get("num_key_value_heads") or heads),
      head_dim=int(c.get("head_dim") or width // heads),
      hidden=int(c["intermediate_size"]),
      rope_theta=float(c.get("rope_theta", 10_000.0)),
      rope_scaling=rope_scaling,
      norm_eps=float(c.get("rms_norm_eps", 1e-6)),
      tied=bool(c.get("tie_word_embeddings", False)),
      max_len=int(max_len or min(context, DEFAULT_MAX_LEN)),
      eos_ids=tuple(eos),
      pad_id=int(pad if pad is not None else eos[0]),
    )
  except (KeyError, TypeError, ValueError) as e:
    raise HindsightError(f"{file}: missing or bad field ({e})") from None


def _ids(value) -> list[int]:
  return [value] if isinstance(value, int) else [int(i) for i in value or ()]


def end_ids(path: str, config: dict) -> list[int]:
  """The ids that end a completion, as Hugging Face's generate and vLLM read them: config.json's
  `eos_token_id` and generation_config.json's (an Instruct model lists its end-of-turn token,
  Llama 3's <|eot_id|>, only there), else tokenizer_config.json's `eos_token` looked up in
  tokenizer.json; none at all is a one-line error (a completion would never end)."""
  out = _ids(config.get("eos_token_id"))
  generation = os.path.join(path, GENERATION)
  if os.path.isfile(generation):
    try:
      with open(generation) as f:
        out += _ids(json.load(f).get("eos_token_id"))
    except (OSError, ValueError, TypeError, AttributeError):
      raise HindsightError(f"{generation}: not JSON with an eos_token_id") from None
  if not out:
    from hindsight.text.chat_template import TOKENIZER_CONFIG, token_text

    try:
      with open(os.path.join(path, TOKENIZER_CONFIG)) as f:
        token = token_text(json.load(f).get("eos_token"))
      from tokenizers import Tokenizer as HfTokenizer

      found = HfTokenizer.from_file(os.path.join(path, TOKENIZER)).token_to_id(token or "")
      out = [] if found is None else [int(found)]
    except Exception:  # a missing or unreadable file; the library raises its own types
      out = []
  if not out:
    raise HindsightError(
      f"{path}: no end-of-sequence id (eos_token_id in {CONFIG} or {GENERATION}, or eos_token "
      "in tokenizer_config.json): a completion would never end"
    )
  return list(dict.fromkeys(out))


def hf_shapes(cfg: BackboneConfig) -> dict[str, tuple[int, ...]]:
  """Every weight a folder of `cfg` holds, by Hugging Face name, with its shape."""
  D, N, K, H, F, V = (cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden,
                      cfg.vocab_size)  # fmt: skip
  out = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
  for i in range(cfg.depth):
    p = f"model.layers.{i}."
    out |= {
      p + "self_attn.q_proj.weight": (N * H, D),
      p + "self_attn.k_proj.weight": (K * H, D),
      p + "self_attn.v_proj.weight": (K * H, D),
      p + "self_attn.o_proj.weight": (D, N * H),
      p + "mlp.gate_proj.weight": (F, D),
      p + "mlp.up_proj.weight": (F, D),
      p + "mlp.down_proj.weight": (D, F),
      p + "input_layernorm.weight": (D,),
      p + "post_attention_layernorm.weight": (D,),
    }
    if cfg.arch == "qwen2":
      out |= {
        p + "self_attn.q_proj.bias": (N * H,),
        p + "self_attn.k_proj.bias": (K * H,),
        p + "self_attn.v_proj.bias": (K * H,),
      }
  if not cfg.tied:
    out["lm_head.weight"] = (V, D)
  return out


def _stored_shapes(path: str) -> dict[str, tuple[int, ...]]:
  from safetensors import safe_open

  files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
  if not files:
    raise HindsightError(f"{path}: no *.safetensors weights")
  out = {}
  for file in files:
    try:
      with safe_open(file, "numpy") as f:
        for name in f.keys():  # noqa: SIM118  (a safe_open handle is not a dict)
          out[name] = tuple(f.get_slice(name).get_shape())
    except Exception as e:  # safetensors raises its own types on a damaged file
      raise HindsightError(f"{file}: unreadable safetensors ({e})") from None
  return out


def check_weights(path: str, cfg: BackboneConfig) -> None:
  """A one-line error naming the first weight `cfg` needs that the folder lacks or holds at
  another shape."""
  stored = _stored_shapes(path)
  for name, shape in hf_shapes(cfg).items():
    if name not in stored:
      raise HindsightError(f"{path}: weight {name} is missing")
    if stored[name] != shape:
      raise HindsightError(
        f"{path}: weight {name} has shape {list(stored[name])}, config.json implies {list(shape)}"
      )


def read_tokenizer(path: str):
  """The folder's tokenizer.json as a `Tokenizer` of kind "hf"."""
  from hindsight.model.encoders.tokenizer import Tokenizer

  file = os.path.join(path, TOKENIZER)
  try:
    with open(file) as f:
      return Tokenizer("hf", f.read())
  except OSError:
    raise HindsightError(f"{path}: no {TOKENIZER} (the fast tokenizer's file)") from None


def load_hf(path: str, max_len: int | None = None, mesh=None, dtype=None):
  """(model, BackboneConfig, Tokenizer) of a Hugging Face folder, its weights placed by their
  Tunix sharding annotations over `mesh` (None: the first device) as `dtype` (default
  float32)."""
  import jax.numpy as jnp

  from hindsight.lm.backbone import require_llm, tunix_config

  cfg = read_config(path, max_len)
  check_weights(path, cfg)
  tokenizer = read_tokenizer(path)
  if tokenizer.vocab_size > cfg.vocab_size:
    raise HindsightError(
      f"{path}: {TOKENIZER} holds {tokenizer.vocab_size} tokens, more than the model's "
      f"vocab_size {cfg.vocab_size} ({CONFIG}): the ids past it have no embedding"
    )
  require_llm()
  if cfg.arch == "qwen2":
    from tunix.models.qwen2.params import create_model_from_safe_tensors
  else:
    from tunix.models.llama3.params import create_model_from_safe_tensors
  model = create_model_from_safe_tensors(
    os.path.abspath(path), tunix_config(cfg), mesh=mesh, dtype=dtype or jnp.float32
  )
  return model, cfg, tokenizer


def hf_weights(model, cfg: BackboneConfig) -> dict[str, np.ndarray]:
  """The model's weights by Hugging Face name, in that layout (module docstring)."""
  D, N, K, H = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  out = {"model.embed_tokens.weight": model.embedder.input_embedding[...],
         "model.norm.weight": model.final_norm.w[...]}  # fmt: skip
  for i, layer in enumerate(model.layers):
    p, a = f"model.layers.{i}.", layer.attn
    out |= {
      p + "self_attn.q_proj.weight": a.q_proj.w[...].reshape(D, N * H).T,
      p + "self_attn.k_proj.weight": a.k_proj.w[...].reshape(D, K * H).T,
      p + "self_attn.v_proj.weight": a.v_proj.w[...].reshape(D, K * H).T,
      p + "self_attn.o_proj.weight": a.o_proj.w[...].reshape(N * H, D).T,
      p + "mlp.gate_proj.weight": layer.mlp.gate_proj.kernel[...].T,
      p + "mlp.up_proj.weight": layer.mlp.up_proj.kernel[...].T,
      p + "mlp.down_proj.weight": layer.mlp.down_proj.kernel[...].T,
      p + "input_layernorm.weight": layer.input_layernorm.w[...],
      p + "post_attention_layernorm.weight": layer.post_attention_layernorm.w[...],
    }
    if cfg.arch == "qwen2":
      out |= {p + f"self_attn.{x}_proj.bias": getattr(a, f"{x}_bias")[...] for x in "qkv"}
  if not cfg.tied:
    out["lm_head.weight"] = model.lm_head.w[...].T
  return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}


def hf_config(cfg: BackboneConfig) -> dict:
  """config.json of `cfg` as the transformers library writes it for these families."""
  kind = "qwen2" if cfg.arch == "qwen2" else "llama"
  c = {
    "architectures": ["Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM"],
    "model_type": kind,
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.width,
    "intermediate_size": cfg.hidden,
    "num_hidden_layers": cfg.depth,
    "num_attention_heads": cfg.num_heads,
    "num_key_value_heads": cfg.num_kv_heads,
    "head_dim": cfg.head_dim,
    "hidden_act": "silu",
    "max_position_embeddings": cfg.max_len,
    "rms_norm_eps": cfg.norm_eps,
    "rope_theta": cfg.rope_theta,
    "tie_word_embeddings": cfg.tied,
    "eos_token_id": list(cfg.eos_ids) if len(cfg.eos_ids) > 1 else cfg.eos_ids[0],
    "pad_token_id": cfg.pad_id,
    "torch_dtype": "float32",
  }
  if cfg.rope_scaling:
    f, lo, hi, orig = cfg.rope_scaling
    c["rope_scaling"] = {
      "rope_type": "llama3",
      "factor": f,
      "low_freq_factor": lo,
      "high_freq_factor": hi,
      "original_max_position_embeddings": orig,
    }
  return c


def write_hf(model, cfg: BackboneConfig, tokenizer, path: str) -> str:
  """Writes `model` as a Hugging Face folder: config.json, model.safetensors and (for a BPE
  tokenizer) tokenizer.json; returns the folder."""
  from safetensors.numpy import save_file

  os.makedirs(path, exist_ok=True)
  save_file(hf_weights(model, cfg), os.path.join(path, "model.safetensors"),
            metadata={"format": "pt"})  # fmt: skip
  with open(os.path.join(path, CONFIG), "w") as f:
    json.dump(hf_config(cfg), f, indent=1)
  if tokenizer is not None and tokenizer.kind != "bytes":
    with open(os.path.join(path, TOKENIZER), "w") as f:
      f.write(tokenizer.bpe_json)
  return path
