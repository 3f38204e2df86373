"""Language models from local Hugging Face folders: a tiny random Qwen2 and Llama 3 written in
that layout, loaded back with no network, and held against a NumPy forward written here from
Hugging Face's definitions (not from the package's)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hindsight.errors import HindsightError
from hindsight.lm import backbone, hf
from hindsight.lm.config import BackboneConfig
from hindsight.model.encoders.tokenizer import train_bpe

QWEN = BackboneConfig("qwen2", vocab_size=300, width=32, depth=2, num_heads=4, num_kv_heads=2,
                      head_dim=8, hidden=48, max_len=64, tied=True)  # fmt: skip
# Llama 3.1's rope_scaling at an original context of 64: of the 8 rotary wavelengths (6 to
# 6e5 positions) one is under 64 / high_freq_factor (kept), one between (blended) and six over
# 64 / low_freq_factor (divided by the factor), so every band of the rescaling is exercised.
LLAMA = BackboneConfig("llama3", vocab_size=300, width=32, depth=2, num_heads=4, num_kv_heads=1,
                       head_dim=16, hidden=48, rope_theta=500_000.0, max_len=64, tied=False,
                       rope_scaling=(8.0, 1.0, 4.0, 64), eos_ids=(1, 2))  # fmt: skip


def _bands(cfg: BackboneConfig) -> tuple[int, int, int]:
  """(kept, blended, divided): how many rotary frequencies fall in each band of Llama 3.1's
  rescaling (Hugging Face's `_compute_llama3_parameters`)."""
  _, low_factor, high_factor, original = cfg.rope_scaling
  wavelength = 2 * np.pi * cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim)
  kept = int(np.sum(wavelength < original / high_factor))
  divided = int(np.sum(wavelength > original / low_factor))
  return kept, wavelength.size - kept - divided, divided


def reference_logits(weights: dict, c: dict, tokens: np.ndarray) -> np.ndarray:
  """Hugging Face's Qwen2 / Llama forward in NumPy (modeling_qwen2 / modeling_llama): RMSNorm,
  q/k/v projections (with biases where stored), rotate_half RoPE (Llama 3.1's rescaled
  frequencies where config.json asks), repeat_kv grouped attention, causal softmax, SwiGLU."""
  N, K = c["num_attention_heads"], c["num_key_value_heads"]
  H, L = c.get("head_dim") or c["hidden_size"] // N, tokens.size

  def norm(x, w):
    return w * x / np.sqrt(np.mean(x**2, -1, keepdims=True) + c["rms_norm_eps"])

  inv = 1.0 / c["rope_theta"] ** (np.arange(0, H, 2) / H)
  if c.get("rope_scaling"):
    s = c["rope_scaling"]
    wavelen = 2 * np.pi / inv
    low, high = (s["original_max_position_embeddings"] / s["low_freq_factor"],
                 s["original_max_position_embeddings"] / s["high_freq_factor"])  # fmt: skip
    smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
      s["high_freq_factor"] - s["low_freq_factor"]
    )
    scaled = np.where(wavelen > low, inv / s["factor"], inv)
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    inv = np.where(~(wavelen < high) & ~(wavelen > low), smoothed, scaled)
  angle = np.arange(L)[:, None] * inv[None]
  cos, sin = np.concatenate([np.cos(angle)] * 2, -1), np.concatenate([np.sin(angle)] * 2, -1)

  def rotate(x):  # [L, heads, H]
    half = np.concatenate([-x[..., H // 2 :], x[..., : H // 2]], -1)
    return x * cos[:, None] + half * sin[:, None]

  x = weights["model.embed_tokens.weight"][tokens]
  causal = np.tril(np.ones((L, L), bool))
  for i in range(c["num_hidden_layers"]):
    p = f"model.layers.{i}."
    h = norm(x, weights[p + "input_layernorm.weight"])
    proj = {}
    for name in "qkv":
      y = h @ weights[p + f"self_attn.{name}_proj.weight"].T
      if p + f"self_attn.{name}_proj.bias" in weights:
        y = y + weights[p + f"self_attn.{name}_proj.bias"]
      proj[name] = y.reshape(L, -1, H)
    q, k, v = rotate(proj["q"]), rotate(proj["k"]), proj["v"]
    k, v = np.repeat(k, N // K, axis=1), np.repeat(v, N // K, axis=1)  # repeat_kv
    scores = np.einsum("lnh,snh->nls", q, k) / np.sqrt(H)
    scores = np.where(causal, scores, -np.inf)
    attn = np.exp(scores - scores.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    out = np.einsum("nls,snh->lnh", attn, v).reshape(L, N * H)
    x = x + out @ weights[p + "self_attn.o_proj.weight"].T
    h = norm(x, weights[p + "post_attention_layernorm.weight"])
    gate = h @ weights[p + "mlp.gate_proj.weight"].T
    up = h @ weights[p + "mlp.up_proj.weight"].T
    x = x + (gate / (1 + np.exp(-gate)) * up) @ weights[p + "mlp.down_proj.weight"].T
  x = norm(x, weights["model.norm.weight"])
  head = (
    weights["lm_head.weight"]
    if "lm_head.weight" in weights
    else weights["model.embed_tokens.weight"]
  )
  return x @ head.T


@pytest.fixture(scope="module")
def tokenizer():
  return train_bpe(["Problem 3: boxes hold 4 and 5 apples.", "So the answer is 9."] * 4, 300)


@pytest.mark.parametrize("cfg", [QWEN, LLAMA], ids=["qwen2", "llama3"])
def test_a_hugging_face_folder_loads_back_to_the_same_logits(cfg, tokenizer, tmp_path):
  model = backbone.build(cfg, jax.random.key(0))
  folder = hf.write_hf(model, cfg, tokenizer, str(tmp_path / cfg.arch))
  weights = load_file(folder + "/model.safetensors")
  # The names Hugging Face's checkpoints of these families hold, layer 0 and the rest.
  layer0 = {f"model.layers.0.{n}" for n in (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
  )}  # fmt: skip
  if cfg.arch == "qwen2":
    layer0 |= {f"model.layers.0.self_attn.{x}_proj.bias" for x in "qkv"}
  assert {n for n in weights if n.startswith("model.layers.0.")} == layer0
  assert ("lm_head.weight" in weights) == (not cfg.tied)
  assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (
    cfg.head_dim * cfg.num_kv_heads,
    32,
  )
  if cfg.rope_scaling:
    assert all(n >= 1 for n in _bands(cfg)), _bands(cfg)

  loaded, cfg2, tok2 = hf.load_hf(folder, max_len=64)
  assert (
    cfg2 == cfg
    and tok2.encode("So the answer").tolist() == tokenizer.encode("So the answer").tolist()
  )
  tokens = np.asarray(tokenizer.encode("Problem 3: boxes hold 4 and 5 apples. So"), np.int32)
  ours, _ = backbone.forward(model, cfg, tokens[None])
  again, _ = backbone.forward(loaded, cfg2, tokens[None])
  np.testing.assert_array_equal(np.asarray(again), np.asarray(ours))
  with open(folder + "/config.json") as f:
    reference = reference_logits(weights, json.load(f), tokens)
  np.testing.assert_allclose(np.asarray(ours[0]), reference, atol=2e-5, rtol=1e-4)


def test_a_sharded_bf16_folder_without_head_dim_loads_to_its_own_logits(tokenizer, tmp_path):
  """A folder as released checkpoints come: bfloat16 weights split over two safetensors files
  with their index, and a config.json without `head_dim` (then hidden_size / heads). The
  loaded model's logits are the reference forward's on those bf16 weights."""
  import dataclasses
  import os

  import ml_dtypes

  cfg = dataclasses.replace(LLAMA, width=64)  # head_dim 16 = hidden_size 64 / 4 heads
  folder = hf.write_hf(backbone.build(cfg, jax.random.key(3)), cfg, tokenizer,
                       str(tmp_path / "sharded"))  # fmt: skip
  weights = load_file(folder + "/model.safetensors")
  os.remove(folder + "/model.safetensors")
  bf16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()}
  names = sorted(bf16)
  files = {"model-00001-of-00002.safetensors": names[::2],
           "model-00002-of-00002.safetensors": names[1::2]}  # fmt: skip
  for file, part in files.items():
    save_file({k: bf16[k] for k in part}, os.path.join(folder, file))
  with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": {k: f for f, ks in files.items() for k in ks}}, f)
  with open(folder + "/config.json") as f:
    c = json.load(f)
  assert c.pop("head_dim") == 16
  with open(folder + "/config.json", "w") as f:
    json.dump(c | {"torch_dtype": "bfloat16"}, f)
  loaded, cfg2, _ = hf.load_hf(folder, max_len=64)
  assert cfg2 == cfg
  tokens = np.asarray(tokenizer.encode("Problem 3: boxes hold 4 and 5 apples. So"), np.int32)
  got, _ = backbone.forward(loaded, cfg2, tokens[None])
  rounded = {k: np.asarray(v, np.float32) for k, v in bf16.items()}
  reference = reference_logits(rounded, c, tokens)
  np.testing.assert_allclose(np.asarray(got[0]), reference, atol=2e-5, rtol=1e-4)
  # The bf16 rounding is real: the float32 weights' logits differ by more than the tolerance.
  assert not np.allclose(reference, reference_logits(weights, c, tokens), atol=2e-5, rtol=1e-4)


def test_a_missing_or_mismatched_weight_is_one_line(tokenizer, tmp_path):
  folder = hf.write_hf(backbone.build(QWEN, jax.random.key(1)), QWEN, tokenizer,
                       str(tmp_path / "q"))  # fmt: skip
  weights = load_file(folder + "/model.safetensors")
  name = "model.layers.1.mlp.up_proj.weight"
  save_file({k: v for k, v in weights.items() if k != name}, folder + "/model.safetensors")
  with pytest.raises(HindsightError, match=f"weight {name} is missing"):
    hf.load_hf(folder)
  weights[name] = weights[name][:, :16]
  save_file(weights, folder + "/model.safetensors")
  with pytest.raises(HindsightError, match=rf"weight {name} has shape \[48, 16\], config.json "
                     r"implies \[48, 32\]"):  # fmt: skip
    hf.load_hf(folder)
  with open(folder + "/config.json") as f:
    c = json.load(f)
  with open(folder + "/config.json", "w") as f:
    json.dump(c | {"model_type": "gemma"}, f)
  with pytest.raises(HindsightError, match="model_type 'gemma' is not supported"):
    hf.read_config(folder)
  with pytest.raises(HindsightError, match=r"no config\.json"):
    hf.read_config(str(tmp_path))


def test_a_hugging_face_folder_trains_and_serves_from_the_cli(tokenizer, tmp_path):
  from hindsight.cli import main
  from hindsight.lm.engine import Row
  from hindsight.lm.server import open_engine

  folder = hf.write_hf(backbone.build(QWEN, jax.random.key(2)), QWEN, tokenizer,
                       str(tmp_path / "q"))  # fmt: skip
  work = str(tmp_path / "tuned")
  assert main(["lm", "train", "--lm", folder, "--workdir", work, "--traces", "24", "--steps",
               "4", "--eval-every", "2", "--batch-size", "4", "--max-len", "1024",
               "--learning-rate", "1e-6", "--no-progress"]) == 0  # fmt: skip
  # The fine-tuning started from the folder's weights: after 4 steps at a tiny learning rate
  # its logits are still the folder's, not a fresh draw's (whose logits share nothing with
  # them).
  from hindsight.lm.train import load_lm

  tokens = np.asarray(tokenizer.encode("Problem 3: boxes hold 4 and 5 apples."), np.int32)[None]
  start, tuned = load_lm(folder), load_lm(work)
  before = np.asarray(backbone.forward(start.model, start.cfg, tokens)[0])
  after = np.asarray(backbone.forward(tuned.model, tuned.cfg, tokens)[0])
  fresh = np.asarray(backbone.forward(backbone.build(QWEN, jax.random.key(9)), QWEN, tokens)[0])
  assert np.linalg.norm(after - before) < 0.01 * np.linalg.norm(fresh - before)
  for path in (folder, work):  # the folder itself, and the model fine-tuned from it
    engine = open_engine(path, max_batch=4)
    try:
      assert engine.cfg.vocab_size == QWEN.vocab_size
      [(tokens, _)] = engine.complete([Row(tokenizer.encode("So the"), 5, 1.0, 1.0,
                                           jax.random.key(0))])  # fmt: skip
      assert 1 <= tokens.size <= 5
    finally:
      engine.close()


def test_without_the_extra_the_error_names_it(monkeypatch):
  import sys

  monkeypatch.setitem(sys.modules, "tunix.models.qwen2", None)  # import fails as if absent
  with pytest.raises(HindsightError, match=r"pip install 'hindsight\[llm\]'"):
    backbone.require_llm()
