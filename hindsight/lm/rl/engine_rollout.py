"""The policy's slot engine as Tunix's rollout worker (`tunix.rl.rollout.BaseRollout`).

`RLCluster` samples through one rollout worker: "vanilla" (Tunix's sampler), "vllm",
"sglang_jax", or a `BaseRollout` subclass given as `ClusterConfig.rollout_engine`. This is
the last: `lm.engine`'s continuous batching, which prefills each prompt once for every row
that continues it, so a credit source's pool of K continuations of one prefix costs one
prefill. Besides Tunix's text API (`generate`) it has the token-level call the credit sources
draw their pools with (`complete`, `rollout.PolicySampler`'s): a branch continues the very
tokens the policy drew, never a re-encoding of their text.

The worker's model is the rollout role's module, which `RLCluster` makes the actor's own for a
`BaseRollout` class: `generate` samples the actor's current parameters and no weight sync is
needed (`update_params` still copies parameters in, for a caller that syncs). `complete`
takes the state to sample from, as every sampler of `lm.rl` does.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx
from tunix.rl import common
from tunix.rl.rollout import base_rollout

from hindsight.lm.rl.rollout import PolicySampler


class TunixTokenizer:
  """The project's tokenizer with the methods Tunix's `TokenizerAdapter` asks of one (encode
  writes the BOS the LM's prompts start with)."""

  def __init__(self, tokenizer, cfg):
    self.tokenizer, self.cfg = tokenizer, cfg

  def encode(self, text: str, **_) -> list[int]:
    return [int(i) for i in self.tokenizer.encode(text, start=True)]

  def decode(self, ids, **_) -> str:
    return self.tokenizer.decode([int(i) for i in ids])

  def bos_id(self) -> int:
    """The id prompts start with; the pad id for a tokenizer that writes none (the text
    world's and Qwen's tokenizers write none)."""
    start = self.tokenizer.encode("", start=True)
    return int(start[0]) if len(start) else self.pad_id()

  def eos_id(self) -> int:
    return int(self.cfg.eos_ids[0])

  def pad_id(self) -> int:
    return int(self.cfg.pad_id)


class EngineRollout(PolicySampler, base_rollout.BaseRollout):
  """Tunix's rollout worker on the slot engine (module docstring). Built by `RLCluster` as
  `functools.partial(EngineRollout, cfg=..., temperature=...)` (`tunix_learner.make_cluster`)."""

  def __init__(self, rollout_actor=None, tokenizer=None, mesh=None, rollout_config=None, *,
               cfg, temperature: float = 1.0, slots: int | None = None):  # fmt: skip
    super().__init__(nnx.graphdef(rollout_actor), cfg, temperature,
                     **({"slots": slots} if slots else {}))  # fmt: skip
    self._model, self._tokenizer = rollout_actor, tokenizer
    self._calls = 0  # `generate` calls so far: a call with no seed draws fold_in(key(0), it)
    self.mesh = None  # the cluster's rollout mesh stays as configured

  @property
  def state(self) -> nnx.State:
    """The rollout model's parameters now."""
    return nnx.state(self._model)

  def generate(self, prompts: list[str], rollout_config: base_rollout.RolloutConfig, **kwargs):
    """Tunix's text API: one completion of each prompt string (encoded with its BOS) within
    rollout_config.max_tokens_to_generate tokens, row i drawn with split(seed)[i]; with no
    seed, the n-th call's is fold_in(key(0), n), so calls draw afresh."""
    ids = [np.asarray(self._tokenizer.encode(p), np.int32) for p in prompts]
    seed = rollout_config.seed
    if seed is None:
      seed = jax.random.fold_in(jax.random.key(0), self._calls)
    elif not jax.dtypes.issubdtype(getattr(seed, "dtype", None), jax.dtypes.prng_key):
      seed = jax.random.key(int(seed))
    self._calls += 1
    keys = jax.random.split(seed, len(ids))
    budget = int(rollout_config.max_tokens_to_generate)
    tokens = self.complete(self.state, ids, [budget] * len(ids), keys)
    width = max(len(p) for p in ids)
    padded = np.full((len(ids), width), self.pad_id(), np.int32)
    for i, p in enumerate(ids):
      padded[i, width - len(p) :] = p
    eos = np.asarray(self.cfg.eos_ids)
    return base_rollout.RolloutOutput(
      text=[self._tokenizer.decode(t[~np.isin(t, eos)].tolist()) for t in tokens],
      logits=None, tokens=tokens, left_padded_prompt_tokens=padded, logprobs=None,
    )  # fmt: skip

  def get_per_token_logps(self, prompt_tokens, completion_tokens):
    return common.compute_per_token_logps(
      self.graphdef, self.state, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
      pad_id=self.pad_id(), eos_id=self.eos_id(), stop_gradient=True, return_logits=False,
      temperature=self.temperature,
    )  # fmt: skip

  def update_params(self, params, filter_types: tuple[Any, ...] | None = None) -> None:
    """The trainer's parameters (the Params filter of its model) into the worker's state."""
    nnx.update(self._model, params)

  def pad_id(self) -> int:
    return int(self.cfg.pad_id)

  def eos_id(self) -> int:
    return int(self.cfg.eos_ids[0])

  def model(self):
    return self._model
