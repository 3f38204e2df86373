"""Benchmark: the language model's training tokens/s and MFU, and the slot engine's
completions/s, on whatever device JAX finds.

1. Training: the decoder the `lm_backbone` credit encoder fine-tunes (`lm.backbone`, Qwen2
   architecture, float32 weights computing in --dtype) on random token batches [B, S]: one
   Adam step on the next-token cross-entropy per call. tokens/s = B S / seconds per step;
   the FLOP/s achieved from XLA's count of the compiled step (`model.programs.program_flops`);
   MFU against the device's dense bf16 peak (`model.programs.peak_bf16_tflops`, or
   --peak-tflops; none on a CPU).
2. Sampling: `lm.rl.rollout.PolicySampler`, the slot engine that LM RL draws its rollouts
   and credit pools with, on the same decoder: --prompts prompts of --prompt-len random
   tokens, --tokens new tokens each: completions/s, and new tokens/s as drawn (a completion
   that draws the EOS id stops there; random weights draw it about once in V tokens).

--size small (the default on a CPU: width 128, depth 2) or qwen0.5b (Qwen2.5-0.5B's shape:
width 896, depth 24, 14 heads, 2 KV heads, head 64, MLP 4864, vocab 151,936; the default on
an accelerator). Steady state: each program compiled and run once first, best of --repeats.

  python eval/bench_lm.py                     # the device's default size
  python eval/bench_lm.py --size qwen0.5b --batch 16 --seq 2048
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hindsight.lm import backbone
from hindsight.lm.config import BackboneConfig
from hindsight.model.programs import peak_bf16_tflops, program_flops

SIZES = {
  "small": BackboneConfig(vocab_size=512, width=128, depth=2, num_heads=4, num_kv_heads=2,
                          head_dim=32, hidden=384, max_len=384),
  "qwen0.5b": BackboneConfig(vocab_size=151_936, width=896, depth=24, num_heads=14,
                             num_kv_heads=2, head_dim=64, hidden=4864, rope_theta=1e6,
                             max_len=4096),
}  # fmt: skip
# (batch, sequence, prompts, prompt tokens, new tokens) per size
DEFAULTS = {"small": (8, 128, 64, 32, 32), "qwen0.5b": (8, 1024, 256, 256, 128)}


def _best(fn, repeats: int) -> float:
  best = float("inf")
  for _ in range(repeats):
    tic = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - tic)
  return best


def train_rate(cfg: BackboneConfig, dtype, batch: int, seq: int, steps: int, repeats: int):
  """(tokens/s, FLOPs of one step or None, parameters) of Adam on next-token loss."""
  model = backbone.build(cfg, jax.random.key(0), dtype)
  optimizer = nnx.Optimizer(model, optax.adam(1e-4), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))

  def loss_fn(model, tokens):
    logits, _ = backbone.forward(model, cfg, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  @jax.jit
  def step(state, tokens):
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss

  tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, cfg.vocab_size)
  flops = program_flops(step, state, tokens)

  def run():
    nonlocal state
    for _ in range(steps):
      state, loss = step(state, tokens)
    jax.block_until_ready(loss)

  run()  # compile, warm up
  seconds = _best(run, repeats) / steps
  return batch * seq / seconds, flops, backbone.parameter_count(model)


def sample_rate(cfg: BackboneConfig, prompts: int, prompt_len: int, new: int, repeats: int):
  """(completions/s, new tokens/s) of the slot engine on `prompts` random prompts."""
  from hindsight.lm.rl.rollout import PolicySampler

  model = backbone.build(cfg, jax.random.key(0))
  graphdef, state = nnx.split(model)
  sampler = PolicySampler(graphdef, cfg, temperature=1.0)
  rng = np.random.default_rng(0)
  # Prompt ids from 2 up: neither the EOS (1) nor the padding (0).
  ids = [rng.integers(2, cfg.vocab_size, prompt_len).astype(np.int32) for _ in range(prompts)]
  keys = jax.random.split(jax.random.key(2), prompts)
  out = []

  def run():
    out[:] = sampler.complete(state, ids, [new] * prompts, keys)

  run()  # compile, warm up
  seconds = _best(run, repeats)
  drawn = sum(len(x) for x in out)
  return prompts / seconds, drawn / seconds


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--size", choices=sorted(SIZES), default="",
                 help="small (CPU default) or qwen0.5b (accelerator default)")  # fmt: skip
  p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
  p.add_argument("--batch", type=int, default=0, help="training rows (default: the size's)")
  p.add_argument("--seq", type=int, default=0, help="training tokens per row")
  p.add_argument("--steps", type=int, default=5, help="train steps per timing")
  p.add_argument("--prompts", type=int, default=0, help="prompts sampled at once")
  p.add_argument("--prompt-len", type=int, default=0)
  p.add_argument("--tokens", type=int, default=0, help="new tokens per completion")
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument(
    "--peak-tflops", type=float, default=0.0, help="one device's peak TFLOP/s (default: known bf16)"
  )
  args = p.parse_args(argv)

  backend = jax.default_backend()
  size = args.size or ("small" if backend == "cpu" else "qwen0.5b")
  cfg = SIZES[size]
  batch, seq, prompts, prompt_len, new = (
    given or default
    for given, default in zip(
      (args.batch, args.seq, args.prompts, args.prompt_len, args.tokens),
      DEFAULTS[size],
      strict=True,
    )
  )
  if seq + 1 > cfg.max_len or prompt_len + new > cfg.max_len:
    raise SystemExit(f"bench_lm: sequences longer than the {size} model's {cfg.max_len} tokens")
  dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
  device = str(jax.devices()[0].device_kind)
  tokens_per_s, flops, params = train_rate(cfg, dtype, batch, seq, args.steps, args.repeats)
  completions_per_s, new_per_s = sample_rate(cfg, prompts, prompt_len, new, args.repeats)
  # The known peaks are bf16's: a float32 run reports MFU only against a peak it is given.
  peak = args.peak_tflops or (peak_bf16_tflops() if args.dtype == "bfloat16" else None) or 0.0
  result = {
    "backend": backend,
    "device": device,
    "size": size + (" (the CPU's smallest)" if backend == "cpu" else ""),
    "params": int(params),
    "train": {"dtype": args.dtype, "batch": batch, "seq": seq,
              "tokens_per_s": round(tokens_per_s, 1)},
    "sample": {"prompts": prompts, "prompt_tokens": prompt_len, "new_tokens": new,
               "completions_per_s": round(completions_per_s, 2),
               "new_tokens_per_s": round(new_per_s, 1)},
  }  # fmt: skip
  if flops is not None:
    achieved = flops * tokens_per_s / (batch * seq)
    result["train"]["achieved_tflops"] = round(achieved / 1e12, 4)
    result["train"]["mfu"] = round(achieved / (peak * 1e12), 4) if peak else None
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
