"""`hindsight lm train`: the language model, trained on the text world's traces.

The model is a Qwen2-architecture decoder (`lm.backbone`, Tunix's modules): a small one from
random weights (`LMTrainConfig.backbone`), or, with `--lm PATH`, a Hugging Face Qwen2 / Llama 3
folder or another `hindsight lm train` workdir, fine-tuned with its own tokenizer.

Data: `traces` traces sampled by the text world itself (`world.sample_traces(seed, n)`, box
counts 1 .. max_count), or with `world = "tools"` the tool world's agent and environment
(`tool_world.sample_traces`: its calls and their results inline, boxes of 1 .. max_count),
or with `--traces-file FILE.jsonl` the user's own traces in the format `hindsight label --env
text:FILE.jsonl` reads (`text.trace`: each trace's prompt, then its steps' texts or its text;
`traces`, `world` and `max_count` then have no say), each the prompt, then the completion and
EOS, as ids of a byte-level BPE trained on them (`model.encoders.tokenizer.train_bpe`) or of
the loaded model's tokenizer; 5% of the traces are held out. The loss is the next-token
cross-entropy on the completion and its EOS only (the prompt's problem number and counts are
random: nothing to learn there, but the completion must copy them).

AdamW (optax) with warmup and cosine decay; batches drawn from a permutation per epoch
folded from the seed; the held-out loss and a checkpoint (orbax, `model.checkpoints`) every
`eval_every` steps, so a killed run resumes from its last checkpoint and ends with the same
parameters. Without the progress bar a line says each checkpoint, and the loss every
`LOG_EVERY` steps between. Each step directory carries `hindsight_lm.json` (the model config,
the tokenizer and the steps the run was asked for), so `load_lm(WORKDIR)` needs nothing
else; `load_lm` reads a Hugging Face folder the same way (`lm.hf`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from hindsight.errors import HindsightError
from hindsight.lm import backbone
from hindsight.lm.config import BackboneConfig, LMTrainConfig
from hindsight.model.encoders.tokenizer import Tokenizer, train_bpe

LM_FILE = "hindsight_lm.json"
MODEL_NAME = "hindsight-small-lm"
LENGTH_BUCKET = 64  # training batches are padded to a multiple of this many tokens
LOG_EVERY = 50  # steps between the lines said without a progress bar (and at each checkpoint)


@dataclasses.dataclass
class LoadedLM:
  """A language model ready to run: its static half and parameters (`nnx.split`), config,
  tokenizer and record (name, box counts, whether it writes ASCII only)."""

  graphdef: nnx.GraphDef
  state: nnx.State
  cfg: BackboneConfig
  tokenizer: Tokenizer
  record: dict

  @property
  def model(self):
    return nnx.merge(self.graphdef, self.state)

  @property
  def name(self) -> str:
    return self.record["model"]


def read_training_traces(path: str) -> tuple[list[str], list[str]]:
  """(prompts, completions) of the text traces in the JSONL file `path` (`text.trace`'s
  format: a completion is a trace's steps' texts joined, or its text); a trace with no
  completion is a one-line error (there is nothing to train on in it)."""
  from hindsight.text.trace import read_traces

  traces = read_traces(path)
  for i, t in enumerate(traces):
    if not t.completion():
      raise HindsightError(
        f"{path}: trace {t.id or i + 1} has no completion (`steps` or `text`) to train on"
      )
  return [t.prompt for t in traces], [t.completion() for t in traces]


def training_sequences(config: LMTrainConfig, tok: Tokenizer | None = None, eos: int = 1,
                       texts: tuple[list[str], list[str]] | None = None):  # fmt: skip
  """(tokenizer, ids int32 [N, S], loss mask float32 [N, S] over the targets ids[:, 1:] ...
  as [N, S] with the last column 0, held-out row mask bool [N]). `tok` None: a BPE trained
  on the traces (EOS id 1). `texts`: (prompts, completions) to train on
  (`read_training_traces`) instead of traces the world samples."""
  from hindsight.worlds import tool_world, world

  if texts is not None:
    prompts, completions = texts
  else:
    if config.world == "tools":  # the agent's turns and the environment's results, as one text
      traces = tool_world.sample_traces(config.seed, config.traces, config.max_count)
    else:
      traces = world.sample_traces(config.seed, config.traces, config.counts)
    prompts = [t.prompt for t in traces]
    completions = [t.completion() for t in traces]
  tok = tok or train_bpe(prompts + completions, config.vocab_size)
  p_ids, c_ids = tok.encode_batch(prompts, start=True), tok.encode_batch(completions)
  S = config.max_len
  n = len(prompts)
  ids = np.zeros((n, S), np.int32)
  mask = np.zeros((n, S), np.float32)
  for i, (p, c) in enumerate(zip(p_ids, c_ids, strict=True)):
    seq = np.concatenate([p, c, [eos]])
    if seq.size > S:
      raise HindsightError(f"trace {i} is {seq.size} tokens, longer than max_len {S}")
    ids[i, : seq.size] = seq
    # Position j predicts ids[j + 1]: the completion's tokens and the EOS.
    mask[i, p.size - 1 : seq.size - 1] = 1.0
  held = np.zeros(n, bool)
  perm = np.asarray(jax.random.permutation(jax.random.key(config.seed), n))
  held[perm[: max(1, n // 20)]] = True
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


def lm_files(cfg: BackboneConfig, tok: Tokenizer, counts, ascii: bool, name=MODEL_NAME,
             chat: dict | None = None, steps: int | None = None):  # fmt: skip
  record = {"format": 2, "model": name, "backbone": cfg.to_json(), "ascii": ascii}
  if steps is not None:  # the steps the run was asked for: a server says how far it got
    record["steps"] = int(steps)
  record["counts"] = list(counts)  # the box counts of the problems it was trained on
  record["tokenizer"] = tok.to_json()
  if chat:  # the chat template of the folder it was fine-tuned from
    record["chat"] = chat
  return {LM_FILE: json.dumps(record, indent=1, sort_keys=True)}


def completion_loss(model, cfg: BackboneConfig, ids, mask):
  """Mean next-token cross-entropy of ids [B, L] where mask [B, L] (position j predicts
  ids[:, j + 1])."""
  logits, _ = backbone.forward(model, cfg, ids)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:])
  m = mask[:, :-1]
  return (ce * m).sum() / jnp.maximum(m.sum(), 1.0)


def train_lm(config: LMTrainConfig, workdir: str, traces_file: str | None = None) -> dict:
  """Trains (or resumes) the model in WORKDIR/checkpoints; returns {step, val_loss, ...}.
  traces_file: train on the text traces of this JSONL file (module docstring) instead of
  the world's."""
  from hindsight.model.checkpoints import Checkpoints
  from hindsight.progress import CompileAwareBar

  texts = read_training_traces(traces_file) if traces_file else None
  start_from = load_lm(config.lm, max_len=config.max_len) if config.lm else None
  if start_from is None:
    tok, ids, mask, held = training_sequences(config, texts=texts)
    cfg = config.backbone(tok.vocab_size)
  else:
    cfg = dataclasses.replace(start_from.cfg, max_len=config.max_len)
    tok, ids, mask, held = training_sequences(config, start_from.tokenizer, cfg.eos, texts)
  train_rows = np.flatnonzero(~held)
  warmup = min(config.warmup_steps, config.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, config.learning_rate, warmup, max(config.steps, warmup + 1), config.learning_rate * 0.05
  )
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=1e-4))

  def build(key):
    model = backbone.build(cfg, key) if start_from is None else start_from.model
    return {"model": model, "optimizer": nnx.Optimizer(model, tx, wrt=nnx.Param)}

  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: build(jax.random.key(0))))
  loss_fn = functools.partial(completion_loss, cfg=cfg)

  @jax.jit
  def train_step(state, x, m):
    parts = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(lambda model: loss_fn(model, ids=x, mask=m))(parts["model"])
    parts["optimizer"].update(parts["model"], grads)
    return nnx.state(parts), loss

  @jax.jit
  def eval_loss(state, x, m):
    return loss_fn(nnx.merge(graphdef, state)["model"], ids=x, mask=m)

  os.makedirs(workdir, exist_ok=True)
  ckpt = Checkpoints(os.path.join(workdir, "checkpoints"), keep=1)
  start, state = ckpt.restore(abstract)
  if state is None:
    start, state = 0, nnx.state(build(jax.random.fold_in(jax.random.key(config.seed), 1)))
  B = config.batch_size
  # Each sequence ends at the EOS its last masked position predicts (id 0 may be a real
  # token of a loaded tokenizer, so not `ids > 0`).
  lengths = mask.shape[1] - np.argmax(mask[:, ::-1], 1) + 1
  bucket = np.minimum(-(-lengths // LENGTH_BUCKET) * LENGTH_BUCKET, config.max_len)
  held_ids, held_mask = jnp.asarray(ids[held]), jnp.asarray(mask[held])
  chat = None if start_from is None else start_from.record.get("chat")
  # The bundled model draws ASCII only, as it was trained; a user's traces may hold more.
  ascii = start_from is None and (texts is None or all(t.isascii() for t in texts[0] + texts[1]))
  files = lm_files(cfg, tok, config.counts, ascii=ascii, chat=chat, steps=config.steps)
  if start < config.steps and not epoch_batches(train_rows, bucket, B, config.seed, 0):
    raise HindsightError(
      f"{train_rows.size} training traces make no batch of {B} traces of one length "
      f"({LENGTH_BUCKET}-token buckets): lower --batch-size or give more traces"
    )
  val = float("nan")
  progress = CompileAwareBar(total=config.steps, initial=start, desc="lm train", unit="step",
                             disable=not config.progress)  # fmt: skip

  def say(text: str) -> None:  # what the bar shows, as lines, when it is off
    if not config.progress:
      print(f"lm train: {text}", file=sys.stderr, flush=True)

  tic = time.perf_counter()
  if start < config.steps:
    say(f"steps {start + 1}..{config.steps} on {train_rows.size} traces ({int(held.sum())} "
        f"held out), a checkpoint every {config.eval_every} (the first step compiles)")  # fmt: skip
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
    elapsed = f"{time.perf_counter() - tic:.0f} s"
    if done % config.eval_every == 0 or done == config.steps:
      val = float(eval_loss(state, held_ids, held_mask))
      progress.set_postfix(loss=f"{float(loss):.3f}", val=f"{val:.3f}")
      ckpt.save(done, state, val, files)
      say(f"step {done}/{config.steps}: loss {float(loss):.3f}, held-out loss {val:.3f}, "
          f"checkpoint saved ({elapsed})")  # fmt: skip
    elif done % LOG_EVERY == 0:
      say(f"step {done}/{config.steps}: loss {float(loss):.3f} ({elapsed})")
  progress.close()
  if start >= config.steps:
    val = float(ckpt.manager.metrics(ckpt.steps()[-1])["val_loss"])
  ckpt.close()
  return {"step": config.steps, "val_loss": val, "workdir": os.path.abspath(workdir)}


def load_lm(path: str, max_len: int | None = None) -> LoadedLM:
  """The language model at `path`: the last checkpoint of a `hindsight lm train` workdir, or
  a Hugging Face Qwen2 / Llama 3 folder (`lm.hf.load_hf`, run at context `max_len`)."""
  from hindsight.lm import hf
  from hindsight.model.checkpoints import Checkpoints

  if hf.is_hf_folder(path):
    from hindsight.text.chat_template import read_chat_template

    model, cfg, tok = hf.load_hf(path, max_len)
    name = os.path.basename(os.path.normpath(path))
    record = {"model": name, "backbone": cfg.to_json(), "ascii": False, "counts": [3, 60]}
    chat = read_chat_template(path)
    if chat is not None:
      record["chat"] = chat.to_json()
    return LoadedLM(*nnx.split(model), cfg, tok, record)
  directory = os.path.join(path, "checkpoints")
  if not os.path.isdir(directory):
    raise HindsightError(
      f"{os.path.abspath(path)}: no language model (a `hindsight lm train` workdir or a "
      "Hugging Face folder with config.json)"
    )
  ckpt = Checkpoints(directory, read_only=True)
  try:
    steps = ckpt.steps()
    if not steps:
      raise HindsightError(f"{directory}: no finished checkpoint")
    file = os.path.join(ckpt.step_dir(steps[-1]), LM_FILE)
    try:
      with open(file) as f:
        record = json.load(f)
      cfg = BackboneConfig.from_json(record["backbone"])
      tok = Tokenizer.from_json(record["tokenizer"])
    except (OSError, ValueError, KeyError, TypeError):
      raise HindsightError(
        f"{file}: missing or unreadable (a model of an older hindsight: train it again)"
      ) from None
    record["step"] = int(steps[-1])  # the checkpoint loaded (`steps`: the run's target)
    if max_len:
      cfg = dataclasses.replace(cfg, max_len=int(max_len))
    graphdef, abstract = nnx.split(backbone.abstract(cfg))
    got, restored = ckpt.restore({"model": abstract}, step=steps[-1], partial=True)
    if got is None:
      raise HindsightError(f"{directory}: the last checkpoint could not be restored")
  finally:
    ckpt.close()
  return LoadedLM(graphdef, jax.device_put(restored["model"]), cfg, tok, record)
