"""`hindsight lm train`: the small language model, trained on the text world's traces.

Data: `traces` traces sampled by the text world itself (`world.sample_traces(seed, n)`, box
counts 1 .. max_count), each
the prompt, then the completion and EOS, as ids of a byte-level BPE trained on them
(`model.encoders.tokenizer.train_bpe`); 5% of the traces are held out. The loss is the next-token
cross-entropy on the completion and its EOS only (the prompt's problem number and counts are
random: nothing to learn there, but the completion must copy them).

AdamW (optax) with warmup and cosine decay; batches drawn from a permutation per epoch
folded from the seed; the held-out loss and a checkpoint (orbax, `model.checkpoints`) every
`eval_every` steps, so a killed run resumes from its last checkpoint and ends with the same
parameters. Each step directory carries `hindsight_lm.json` (the model config and the
tokenizer), so `load_lm(WORKDIR)` needs nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hindsight.errors import HindsightError
from hindsight.lm.config import LMConfig, LMTrainConfig
from hindsight.lm.model import LanguageModel
from hindsight.model.encoders.tokenizer import EOS, Tokenizer, train_bpe

LM_FILE = "hindsight_lm.json"
MODEL_NAME = "hindsight-small-lm"
LENGTH_BUCKET = 64  # training batches are padded to a multiple of this many tokens


def training_sequences(config: LMTrainConfig):
  """(tokenizer, ids int32 [N, S], loss mask float32 [N, S] over the targets ids[:, 1:] ...
  as [N, S] with the last column 0, held-out row mask bool [N])."""
  from hindsight.text import world

  traces = world.sample_traces(config.seed, config.traces, config.counts)
  prompts = [t.prompt for t in traces]
  completions = [t.completion() for t in traces]
  tok = train_bpe(prompts + completions, config.vocab_size)
  p_ids, c_ids = tok.encode_batch(prompts), tok.encode_batch(completions)
  S = config.max_len
  ids = np.zeros((len(traces), S), np.int32)
  mask = np.zeros((len(traces), S), np.float32)
  for i, (p, c) in enumerate(zip(p_ids, c_ids, strict=True)):
    seq = np.concatenate([p, c, [EOS]])
    if seq.size > S:
      raise HindsightError(f"trace {i} is {seq.size} tokens, longer than max_len {S}")
    ids[i, : seq.size] = seq
    # Position j predicts ids[j + 1]: the completion's tokens and the EOS.
    mask[i, p.size - 1 : seq.size - 1] = 1.0
  held = np.zeros(len(traces), bool)
  perm = np.asarray(jax.random.permutation(jax.random.key(config.seed), len(traces)))
  held[perm[: max(1, len(traces) // 20)]] = True
  return tok, ids, mask, held


def epoch_batches(rows: np.ndarray, bucket: np.ndarray, batch_size: int, seed: int, epoch: int):
  """[(row ids [batch_size], padded length)] of one epoch: rows shuffled, grouped by their
  length bucket (attention costs L^2: a batch is padded to its own bucket, not to max_len),
  cut into full batches, the batches shuffled; keys folded from (seed, epoch)."""
  key = jax.random.fold_in(jax.random.key(seed), 100 + epoch)
  order = rows[np.asarray(jax.random.permutation(key, rows.size))]
  out = []
  for b in np.unique(bucket[rows]):
    mine = order[bucket[order] == b]
    out += [
      (mine[i : i + batch_size], int(b)) for i in range(0, mine.size - batch_size + 1, batch_size)
    ]
  shuffle = np.asarray(jax.random.permutation(jax.random.fold_in(key, 1), len(out)))
  return [out[i] for i in shuffle]


def lm_files(cfg: LMConfig, tok: Tokenizer, counts: tuple[int, int]) -> dict[str, str]:
  record = {"format": 1, "model": MODEL_NAME, "lm_config": dataclasses.asdict(cfg)}
  record["counts"] = list(counts)  # the box counts of the problems it was trained on
  record["tokenizer"] = tok.to_json()
  return {LM_FILE: json.dumps(record, indent=1, sort_keys=True)}


def _loss(model, ids, mask):
  logits, _ = model(ids)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:])
  m = mask[:, :-1]
  return (ce * m).sum() / jnp.maximum(m.sum(), 1.0)


def train_lm(config: LMTrainConfig, workdir: str) -> dict:
  """Trains (or resumes) the model in WORKDIR/checkpoints; returns {step, val_loss, ...}."""
  from hindsight.model.checkpoints import Checkpoints
  from hindsight.progress import CompileAwareBar

  tok, ids, mask, held = training_sequences(config)
  cfg = config.lm_config(tok.vocab_size)
  train_rows = np.flatnonzero(~held)
  warmup = min(config.warmup_steps, config.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, config.learning_rate, warmup, max(config.steps, warmup + 1), config.learning_rate * 0.05
  )
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4))

  def build(key):
    model = LanguageModel(cfg, rngs=nnx.Rngs(params=key))
    return {"model": model, "optimizer": nnx.Optimizer(model, tx, wrt=nnx.Param)}

  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build(jax.random.key(0))))

  @jax.jit
  def train_step(state, x, m):
    parts = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(_loss)(parts["model"], x, m)
    parts["optimizer"].update(parts["model"], grads)
    return nnx.state(parts), loss

  @jax.jit
  def eval_loss(state, x, m):
    return _loss(nnx.merge(graphdef, state)["model"], x, m)

  os.makedirs(workdir, exist_ok=True)
  ckpt = Checkpoints(os.path.join(workdir, "checkpoints"), keep=1)
  start, state = ckpt.restore(abstract)
  if state is None:
    start, state = 0, nnx.state(build(jax.random.fold_in(jax.random.key(config.seed), 1)))
  B = config.batch_size
  lengths = (ids > 0).sum(1)
  bucket = np.minimum(-(-lengths // LENGTH_BUCKET) * LENGTH_BUCKET, config.max_len)
  held_ids, held_mask = jnp.asarray(ids[held]), jnp.asarray(mask[held])
  files = lm_files(cfg, tok, config.counts)
  val = float("nan")
  progress = CompileAwareBar(total=config.steps, initial=start, desc="lm train", unit="step",
                             disable=not config.progress)  # fmt: skip
  batches, epoch = [], -1
  loss = jnp.float32(0.0)
  for step in range(start, config.steps):
    while len(batches) <= step:  # every epoch's batches, in order, up to this step
      epoch += 1
      batches += epoch_batches(train_rows, bucket, B, config.seed, epoch)
    rows, pad = batches[step]
    x, m = jnp.asarray(ids[rows, :pad]), jnp.asarray(mask[rows, :pad])
    state, loss = train_step(state, x, m)
    progress.update(1)
    done = step + 1
    if done % config.eval_every == 0 or done == config.steps:
      val = float(eval_loss(state, held_ids, held_mask))
      progress.set_postfix(loss=f"{float(loss):.3f}", val=f"{val:.3f}")
      ckpt.save(done, state, val, files)
  progress.close()
  if start >= config.steps:
    val = float(ckpt.manager.metrics(ckpt.steps()[-1])["val_loss"])
  ckpt.close()
  return {"step": config.steps, "val_loss": val, "workdir": os.path.abspath(workdir)}


def load_lm(workdir: str):
  """(graphdef, state, tokenizer, record) of the last checkpoint of `hindsight lm train`."""
  from hindsight.model.checkpoints import Checkpoints

  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    raise HindsightError(
      f"{os.path.abspath(workdir)}: no language model (run `hindsight lm train`)"
    )
  ckpt = Checkpoints(directory, read_only=True)
  try:
    steps = ckpt.steps()
    if not steps:
      raise HindsightError(f"{directory}: no finished checkpoint")
    path = os.path.join(ckpt.step_dir(steps[-1]), LM_FILE)
    try:
      with open(path) as f:
        record = json.load(f)
      cfg = LMConfig(**record["lm_config"])
      tok = Tokenizer.from_json(record["tokenizer"])
    except (OSError, ValueError, KeyError, TypeError):
      raise HindsightError(f"{path}: missing or unreadable") from None
    graphdef, abstract = nnx.split(
      nnx.eval_shape(lambda: LanguageModel(cfg, rngs=nnx.Rngs(params=jax.random.key(0))))
    )
    got, restored = ckpt.restore({"model": abstract}, step=steps[-1], partial=True)
    if got is None:
      raise HindsightError(f"{directory}: the last checkpoint could not be restored")
  finally:
    ckpt.close()
  return graphdef, restored["model"], tok, record
