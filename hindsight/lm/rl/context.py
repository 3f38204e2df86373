"""What one run of `rl_text` shares between its seeds: the starting LM, its sampler, the
prompts, the verifier, and the learned models fitted once on the initial policy's traces
(cached in the setup directory under what they depend on, `Context.models_key`)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time

import jax
import msgspec
import numpy as np

from hindsight.errors import HindsightError
from hindsight.files import atomic_open
from hindsight.lm.rl.credit import Spend, all_prefixes, prefix_pools, trace_fields
from hindsight.lm.rl.models import PRM, CreditHead, Features
from hindsight.lm.rl.rollout import PolicySampler, Prompt, rollout
from hindsight.text.trace import TextTrace, read_traces
from hindsight.text.verify import load_verifier

# Key streams: fold_in(fold_in(key(seed), run seed), STREAM), then the update.
TRAIN, CREDIT, EVAL, REFERENCE, SETUP, SETUP_LABELS, MODELS = range(7)


class Prompts:
  """Draws prompts: text-world problems with box counts of the LM's training (`lm.record`),
  or the prompts of a JSONL file of traces."""

  def __init__(self, spec: str, lm):
    self.lm = lm
    self.file = None
    if spec:
      self.file = read_traces(spec)
      for i, t in enumerate(self.file):
        name = t.id or str(i + 1)
        if t.reference is None:
          raise HindsightError(f"{spec}: trace {name} has no `reference` for the verifier")
        if len(lm.tokenizer.encode(t.prompt, start=True)) >= lm.cfg.max_len:
          raise HindsightError(f"{spec}: trace {name}'s prompt fills the model's context "
                               f"({lm.cfg.max_len} tokens)")  # fmt: skip
    self.counts = tuple(lm.record.get("counts", (3, 60)))
    # What the prompts drawn depend on: the file's traces, or the text world's box counts.
    drawn = [msgspec.json.encode(t).decode() for t in self.file] if self.file else self.counts
    self.digest = hashlib.sha256(json.dumps(drawn).encode()).hexdigest()

  def draw(self, key, n: int) -> list[Prompt]:
    from hindsight.worlds import world

    tok = self.lm.tokenizer
    if self.file is not None:
      picks = np.asarray(jax.random.choice(key, len(self.file), (n,), replace=n > len(self.file)))
      return [Prompt(t, tok.encode(t.prompt, start=True)) for t in (self.file[i] for i in picks)]
    seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
    out = []
    for p in world.problems(seed, n, self.counts):
      trace = TextTrace(prompt=p.prompt(), id=f"problem_{p.number}", reference=str(p.total))
      out.append(Prompt(trace, tok.encode(trace.prompt, start=True), p))
    return out


def stream_key(root, seed_index: int, stream: int, index: int = 0):
  return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(root, seed_index), stream), index)


class Models:
  """The PRM and the credit head (`rl.models`) on the starting LM's features, with what their
  data cost: `traces` completions of the initial policy (the PRM's outcomes), and for the
  credit head also their labels."""

  def __init__(self, features: Features, prm: PRM, head: CreditHead, spend: dict, stats: dict):
    self.extract, self.prm, self.head = features, prm, head
    self.spend, self.stats = spend, stats

  def spend_for(self, source: str) -> Spend:
    outcomes = Spend(**self.spend["traces"])
    return outcomes + Spend(**self.spend["labels"]) if source == "pp_credit" else outcomes

  def features(self, rollouts) -> list[np.ndarray]:
    """h(x_0) .. h(x_T) [T + 1, D] of each trace (cached on the rollouts)."""
    if "features" not in rollouts.cache:
      rollouts.cache["features"] = self.extract(rollouts)
    return rollouts.cache["features"]

  def prm_values(self, rollouts) -> list[np.ndarray]:
    """p(x_0) .. p(x_T) of each trace."""
    return self.prm(self.features(rollouts))

  def credit_values(self, rollouts) -> list[tuple[np.ndarray, np.ndarray]]:
    """(f_t, s_t) [T] of each trace."""
    return self.head(self.features(rollouts), rollouts.rewards)


class Context:
  """A run's shared parts (module docstring). setup_dir caches the fitted models."""

  def __init__(self, config, lm, setup_dir: str):
    self.config, self.lm, self.setup_dir = config, lm, setup_dir
    if int(config.grpo.max_tokens) >= lm.cfg.max_len:
      raise HindsightError(f"grpo.max_tokens ({config.grpo.max_tokens}) must be below the "
                           f"model's context ({lm.cfg.max_len} tokens)")  # fmt: skip
    self.tokenizer = lm.tokenizer
    self.sampler = PolicySampler(lm.graphdef, lm.cfg, float(config.grpo.temperature))
    self.verify = load_verifier(config.verifier)
    self.prompts = Prompts(config.prompts, lm)
    self.root = jax.random.key(int(config.seed))
    self._models = None

  def rollout(self, state, prompts, key):
    return rollout(self.sampler, state, prompts, int(self.config.grpo.max_tokens), key,
                   self.tokenizer, self.verify)  # fmt: skip

  def pools(self, state, rollouts, wanted, K: int, key):
    """`credit.prefix_pools` with the run's sampler, budget, tokenizer and verifier."""
    return prefix_pools(self.sampler, state, rollouts, wanted, K, int(self.config.grpo.max_tokens),
                        key, self.tokenizer, self.verify)  # fmt: skip

  def models(self) -> Models:
    if self._models is None:
      self._models = self._fit_models()
    return self._models

  def models_key(self) -> dict:
    """What the fitted models depend on, so a cached fit is reused only for the same: the LM's
    weights (their digest: every trained workdir is named `hindsight-small-lm`), the prompts,
    the verifier, the sampling, the seed and the `models` node."""
    from hindsight.model.programs import state_digest

    c = self.config
    return {"lm": self.lm.name, "weights": state_digest(self.lm.state),
            "prompts": self.prompts.digest, "verifier": str(c.verifier),
            "temperature": float(c.grpo.temperature), "max_tokens": int(c.grpo.max_tokens),
            "seed": int(c.seed), **c.models.to_dict()}  # fmt: skip

  def _fit_models(self) -> Models:
    m = self.config.models
    features = Features(self.lm.graphdef, self.lm.state, self.lm.cfg)
    path = os.path.join(self.setup_dir, "models.pkl")
    fields = self.models_key()
    if os.path.exists(path):
      with open(path, "rb") as f:
        saved = pickle.load(f)
      if saved["fields"] == fields:
        return Models(features, PRM(*saved["prm"]), CreditHead(*saved["head"]), saved["spend"],
                      saved["stats"])  # fmt: skip
    start = time.time()
    state = self.lm.state
    prompts = self.prompts.draw(stream_key(self.root, 0, SETUP), int(m.traces))
    ro = self.rollout(state, prompts, stream_key(self.root, 0, SETUP, 1))
    pools, label_spend = self.pools(state, ro, all_prefixes(ro), int(m.rollouts),
                                    stream_key(self.root, 0, SETUP_LABELS))  # fmt: skip
    labels = [trace_fields(pools, i, c.num_steps, ro.rewards[i])["credit"]
              for i, c in enumerate(ro.completions)]  # fmt: skip
    h = features(ro)
    k_prm, k_head = jax.random.split(stream_key(self.root, 0, MODELS))
    prm = PRM.fit(k_prm, h, ro.rewards, int(m.steps), int(m.hidden))
    head = CreditHead.fit(k_head, h, ro.rewards, labels, int(m.steps), int(m.hidden))
    spend = {"traces": {"completions": len(ro.completions), "tokens": ro.tokens},
             "labels": label_spend.as_dict()}  # fmt: skip
    stats = {"success": float(ro.rewards.mean()), "traces": len(ro.completions),
             "seconds": time.time() - start}  # fmt: skip
    os.makedirs(self.setup_dir, exist_ok=True)
    blob = {"fields": fields, "prm": (jax.device_get(prm.params), jax.device_get(prm.norm)),
            "head": (jax.device_get(head.params), jax.device_get(head.norm)),
            "spend": spend, "stats": stats}  # fmt: skip
    with atomic_open(path, "wb") as f:
      pickle.dump(blob, f)
    return Models(features, prm, head, spend, stats)
