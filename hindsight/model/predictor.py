"""`Predictor`: the one way to use a trained credit model (docs/design.md, section 2).

    predictor = Predictor.load("runs/demo")           # the step the run scored, model only
    scores = predictor.score(episodes)                # in-memory episodes -> per-step arrays
    fn = predictor.credit_fn()                        # pure (state, batch) -> outputs
    out = jax.jit(fn)(predictor.state, batch)         # inside the caller's own jit/vmap/scan

Per step t the model gives a mixture: an exact tie (credit exactly 0) with probability p0_t,
else N(mu_t, s_t^2). The outputs, in label units, float [T] per episode (or [B, T]):
  credit   the point prediction, the mixture's median: 0 where p0_t > 1/2, else mu_t
  mean     the mixture's mean (1 - p0_t) mu_t
  std      the mixture's standard deviation sqrt((1 - p0)(s^2 + mu^2) - mean^2)
  p_zero   p0_t = P(credit exactly 0)
  mu, sigma  the continuous part (calibration uses the whole mixture)
  klass    int over KLASS_NAMES: the model's belief about the true credit, by the labels'
           rule (`credit.estimators.classify`) applied to mean +- z std at the dataset's
           tolerance and confidence: decorative only where the model is that sure |credit|
           is below the tolerance
  klass_head  int, the class head's argmax: what a K-rollout label would be called (its
           classes depend on the labels' K: at K=64 most decorative steps are undetermined)
A checkpoint step directory carries `hindsight_model.json` (model config + DataSpec), so
loading needs neither the training config nor its optimizer. The step's calibration.json
(a scale on sigma fitted on the validation split, `model.calibration`) is applied to the step
it was fitted for.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hindsight.credit.estimators import classify, z_value
from hindsight.credit.names import KLASS_NAMES
from hindsight.data.episode import Episode, check_length
from hindsight.errors import HindsightError
from hindsight.model.batching import episodes_batch
from hindsight.model.calibration import CALIBRATION_FILE, read_sigma_scale
from hindsight.model.checkpoints import Checkpoints
from hindsight.model.credit_model import ModelConfig, encoder_layout
from hindsight.model.programs import model_graph, state_digest
from hindsight.model.spec import DataSpec

MODEL_FILE = "hindsight_model.json"
# 3: the step encoder's record in the DataSpec and its parameters under `obs_encoder`;
# 2: a flat DataSpec and the encoder's parameters at the top level (still read: restored
# through `credit_model.encoder_layout`); 1: the state saved as a (model, optimizer) tuple and
# no MODEL_FILE (refused).
MODEL_FORMAT = 3
PAD_MULTIPLE = 8  # episodes up to 64 steps are padded to a multiple of this, longer ones
# to a power of two: few shapes, so few compiles, and little padding where episodes are short
ROW_BUCKETS = (1, 4, 16, 64)  # rows of a scored batch (the largest is the batch size)
# Most rows x pad^2 attention scores one call computes. Past it the scores no longer fit the
# CPU's cache: 64 rows of 128 steps ran at half the steps/s of 16 rows (eval/bench_serve.py),
# so a larger batch is scored as several calls of the rows that fit.
ATTENTION_BUDGET = 16 * 128 * 128


def rows_per_call(pad: int, batch_size: int = ROW_BUCKETS[-1]) -> int:
  """The rows one call scores at length bucket `pad`: the largest row bucket (at most
  batch_size) whose rows x pad^2 fit ATTENTION_BUDGET, and never fewer than 1."""
  fits = [r for r in ROW_BUCKETS if r <= batch_size and r * pad * pad <= ATTENTION_BUDGET]
  return max(fits, default=1)


def model_files(model_cfg: ModelConfig, spec: DataSpec) -> dict[str, str]:
  """The JSON files a checkpoint step carries so that it alone rebuilds the model."""
  record = {
    "format": MODEL_FORMAT,
    "model_config": dataclasses.asdict(model_cfg),
    "data_spec": json.loads(spec.to_json()),
  }
  return {MODEL_FILE: json.dumps(record, indent=1, sort_keys=True)}


def checkpoint_dir(workdir: str) -> str:
  """The checkpoint directory of a training run, given the run's workdir or the directory."""
  inner = os.path.join(workdir, "checkpoints")
  if os.path.isdir(inner):
    return inner
  if os.path.isdir(workdir) and any(n.isdigit() for n in os.listdir(workdir)):
    return workdir
  raise HindsightError(
    f"{os.path.abspath(workdir)}: no checkpoints (expected {os.path.abspath(inner)})"
  )


def run_step_choice(directory: str) -> str:
  """What step "run" means for the checkpoints in `directory`: the training run's own
  choice, `checkpoint.evaluate` of its config.json ("last" or "best": the step its report
  scored), or "best" for a directory without one."""
  for workdir in (directory, os.path.dirname(os.path.abspath(directory))):
    path = os.path.join(workdir, "config.json")
    if os.path.isfile(os.path.join(workdir, "splits.json")) and os.path.isfile(path):
      try:
        with open(path) as f:
          saved = json.load(f)
      except ValueError:
        raise HindsightError(f"{path} is damaged (not JSON)") from None
      choice = saved.get("checkpoint.evaluate", "best") if isinstance(saved, dict) else None
      if choice not in ("best", "last"):
        raise HindsightError(f"{path}: checkpoint.evaluate is not 'best' or 'last'")
      return choice
  return "best"


def training_run(workdir: str) -> dict:
  """WORKDIR/splits.json of a training run: the label dataset it trained on ("labels") and
  the episode ids of each split."""
  path = os.path.join(workdir, "splits.json")
  if not os.path.isfile(path):
    parent = os.path.dirname(os.path.abspath(workdir))
    if os.path.isfile(os.path.join(parent, "splits.json")):
      raise HindsightError(
        f"{os.path.abspath(workdir)} is the checkpoint directory of the run {parent}: give "
        "the run's directory"
      )
    raise HindsightError(
      f"{os.path.abspath(workdir)}: no splits.json (not a training run's directory, or a run "
      "of an older hindsight: retrain it)"
    )
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError:
    raise HindsightError(f"{path} is damaged (not JSON)") from None


def outputs(model, batch: dict, sigma_scale: float = 1.0) -> dict:
  """The model's raw outputs as the Predictor's named outputs (module docstring), the
  continuous part's spread scaled by `sigma_scale` (`model.calibration`)."""
  parts = _member_parts(model(batch), sigma_scale)
  return _mixture(*(x[None] for x in parts), model.spec)


def ensemble_outputs(graphdef, states, batch: dict, sigma_scales: jax.Array, spec) -> dict:
  """The named outputs of an ensemble of E models (states stacked on a leading axis E,
  sigma_scales float [E]): the equal-weight mixture of the members' mixtures (`_mixture`)."""

  def member(state, scale):
    return _member_parts(nnx.merge(graphdef, state)(batch), scale)

  return _mixture(*jax.vmap(member)(states, sigma_scales), spec)


def _member_parts(out: dict, sigma_scale):
  """(p0, mu, s^2, class probabilities) of one model's raw outputs, [B, T] (probs [B, T, C])."""
  var = jnp.exp(out["log_var"]) * jnp.square(sigma_scale)
  return jax.nn.sigmoid(out["zero_logit"]), out["mu"], var, jax.nn.softmax(out["logits"])


def _mixture(p0s, mus, vars_, probs, spec: DataSpec) -> dict:
  """The named outputs of E members' parts stacked on a leading axis (E = 1: one model).

  p0 = mean_e p0_e; mean = mean_e (1 - p0_e) mu_e; the continuous part's mean mu and variance
  sigma^2 are the moments of the members' continuous parts (weights 1 - p0_e), so sigma
  includes the members' disagreement; credit = 0 where p0 > 1/2, else mu; klass the class of
  mean +- z std by the labels' rule (`credit.estimators.classify`, the DataSpec's tolerance
  and confidence), klass_head the argmax of the mean class probabilities."""
  p0 = p0s.mean(0)
  cont = (1.0 - p0s).mean(0)
  mean = ((1.0 - p0s) * mus).mean(0)
  second = ((1.0 - p0s) * (vars_ + jnp.square(mus))).mean(0)
  if mus.shape[0] == 1:  # one model: its own continuous part, no division
    mu, var = mus[0], vars_[0]
  else:
    safe = jnp.where(cont > 0, cont, 1.0)  # a sure tie (cont = 0): mu and var are moot
    mu = jnp.where(cont > 0, mean / safe, 0.0)
    var = jnp.maximum(jnp.where(cont > 0, second / safe, 0.0) - jnp.square(mu), 0.0)
  std = jnp.sqrt(jnp.maximum(second - jnp.square(mean), 0.0))
  return {
    "credit": jnp.where(p0 > 0.5, 0.0, mu),
    "mean": mean,
    "std": std,
    "p_zero": p0,
    "mu": mu,
    "sigma": jnp.sqrt(var),
    "klass": classify(mean, std, spec.decorative_tolerance, z_value(spec.confidence)),
    "klass_head": jnp.argmax(probs.mean(0), -1).astype(jnp.int32),
  }


class Predictor:
  """A restored credit model (or an ensemble of them, `load_ensemble`): `score` episodes, or
  `credit_fn` inside your own program."""

  def __init__(
    self,
    graphdef,
    state,
    spec: DataSpec,
    model_config: ModelConfig,
    step: int | list[int],
    sigma_scale: float | list[float] = 1.0,
  ):
    self.graphdef, self.state = graphdef, state
    self.spec, self.model_config, self.step = spec, model_config, step
    # post-hoc calibration of sigma (1: none); a list for an ensemble (one per member)
    self.members = len(sigma_scale) if isinstance(sigma_scale, list | tuple) else 0
    self.sigma_scale = [float(x) for x in sigma_scale] if self.members else float(sigma_scale)
    self.digest = state_digest(state)[:16]  # equal digests = the same parameters
    self._score = jax.jit(self.credit_fn())

  @classmethod
  def load(cls, workdir: str, step: int | str = "run", calibrated: bool = True) -> Predictor:
    """The model of `step` ("run": the step the training run scored, its
    `checkpoint.evaluate`; "best": lowest validation loss; "last"; or a step number) of
    the run in `workdir` (or its checkpoint directory), after verifying its manifest; with
    the run's fitted sigma scale for that step (`model.calibration`) unless `calibrated` is
    False."""
    directory = checkpoint_dir(workdir)
    ckpt = Checkpoints(directory, read_only=True)
    try:
      steps = ckpt.steps()
      if not steps:
        raise HindsightError(f"checkpoint {workdir}: no finished checkpoint")
      if step == "run":
        step = run_step_choice(directory)
      if step == "best":
        chosen = ckpt.best_step()
      elif step in ("last", "latest"):
        chosen = steps[-1]
      else:
        try:
          chosen = int(step)
        except ValueError:
          raise HindsightError(f"step {step!r}: expected run, best, last or a number") from None
        if chosen not in steps:
          raise HindsightError(f"step {chosen}: not a kept checkpoint (kept: {steps})")
      path = os.path.join(ckpt.step_dir(chosen), MODEL_FILE)
      if not os.path.isfile(path):
        raise HindsightError(
          f"checkpoint {ckpt.step_dir(chosen)} has no {MODEL_FILE} (saved by an older "
          "hindsight): retrain it"
        )
      try:
        with open(path) as f:
          record = json.load(f)
        model_cfg = ModelConfig(**record["model_config"])
        spec = DataSpec.from_json(json.dumps(record["data_spec"]))
        legacy = int(record.get("format", MODEL_FORMAT)) < 3
      except HindsightError:
        raise  # a record that reads but names what is not here (a step encoder's kind)
      except (ValueError, KeyError, TypeError) as e:
        raise HindsightError(f"{path}: unreadable ({type(e).__name__})") from None
      graphdef, abstract = model_graph(model_cfg, spec)
      sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      abstract = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), abstract
      )
      if legacy:  # saved with the encoder's parameters at the top level
        abstract = encoder_layout(abstract, spec.encoder, legacy=True)
      got, restored = ckpt.restore({"model": abstract}, step=chosen, partial=True)
      if got != chosen:
        raise HindsightError(f"checkpoint step {chosen} could not be restored")
      if legacy:
        restored["model"] = encoder_layout(restored["model"], spec.encoder, legacy=False)
      step_dir = ckpt.step_dir(chosen)
    finally:
      ckpt.close()
    scale = 1.0
    if calibrated:
      # Runs trained before the calibration moved into its step kept it at WORKDIR level
      # (for the step it names): still applied there.
      legacy = os.path.dirname(directory)
      has_own = os.path.isfile(os.path.join(step_dir, CALIBRATION_FILE))
      scale = read_sigma_scale(step_dir if has_own else legacy, chosen)
    return cls(graphdef, restored["model"], spec, model_cfg, chosen, scale)

  @classmethod
  def load_ensemble(
    cls, workdirs: Sequence[str], step: int | str = "run", calibrated: bool = True
  ) -> Predictor:
    """The models of several runs as one predictor (`ensemble_outputs`): members must share
    the model config and the DataSpec (runs of one config and labels, `member` = 0, 1, ...)."""
    members = [cls.load(w, step, calibrated) for w in workdirs]
    first = members[0]
    for w, m in zip(workdirs[1:], members[1:], strict=True):
      if m.model_config != first.model_config or m.spec != first.spec:
        raise HindsightError(
          f"checkpoint {w}: not an ensemble member of {workdirs[0]} (a different model "
          "config or data spec)"
        )
    state = jax.tree.map(lambda *xs: jnp.stack(xs), *[m.state for m in members])
    return cls(
      first.graphdef,
      state,
      first.spec,
      first.model_config,
      [m.step for m in members],
      [m.sigma_scale for m in members],
    )

  def credit_fn(self) -> Callable[[nnx.State, dict], dict]:
    """A pure fn(state, batch) -> outputs (module docstring), [B, T] each; `batch` as made
    by `batch`/`hindsight.model.batching.episodes_batch`. Jit, vmap or scan it freely."""
    graphdef, sigma_scale = self.graphdef, self.sigma_scale
    if self.members:
      scales = jnp.asarray(sigma_scale, jnp.float32)
      spec = self.spec
      return lambda state, batch: ensemble_outputs(graphdef, state, batch, scales, spec)

    def fn(state, batch):
      return outputs(nnx.merge(graphdef, state), batch, sigma_scale)

    return fn

  def batch(
    self, episodes: Sequence[dict], pad: int | None = None, allow_longer: bool = False
  ) -> dict:
    """One padded batch of in-memory episodes (checked: a one-line error names the first
    bad one); pad defaults to the longest episode's length bucket (`pad_length`).
    Episodes longer than the model's max_length are refused unless `allow_longer`."""
    eps = self._parse(episodes, allow_longer)
    if pad is None:
      pad = pad_length(max(len(e) for e in eps))
    return episodes_batch(
      eps, pad, self.spec, allow_longer=allow_longer, shape=self.spec.encoder.shape(eps)
    )

  def _parse(self, episodes: Sequence[dict], allow_longer: bool) -> list[Episode]:
    eps = [Episode.parse(e, self.spec, f"episode {i}") for i, e in enumerate(episodes)]
    if not allow_longer:
      for i, e in enumerate(eps):
        check_length(e, self.spec, f"episode {i}")
    return eps

  def warmup(self, max_steps: int | None = None) -> int:
    """Compiles the program of every (row bucket, length bucket) up to `max_steps` (default
    the model's max_length), so a steady stream of calls never compiles; returns the
    number of programs compiled."""
    pads = sorted({pad_length(n) for n in range(1, (max_steps or self.spec.max_length) + 1)})
    compiled = 0
    for pad in pads:
      for rows in (r for r in ROW_BUCKETS if r <= rows_per_call(pad)):
        for shape in self.spec.encoder.shapes():
          empty = episodes_batch([None] * rows, pad, self.spec, shape=shape)
          jax.block_until_ready(self._score(self.state, empty))
          compiled += 1
    return compiled

  def compiled_programs(self) -> int:
    """How many programs `score` has compiled so far (jit's cache of shapes)."""
    return int(self._score._cache_size())

  def score(
    self,
    episodes: Sequence[dict],
    batch_size: int = ROW_BUCKETS[-1],
    allow_longer: bool = False,
  ) -> list[dict]:
    """Per-step outputs of every episode: [{name: array [T_i]}] in input order.

    episodes: `Episode`s, dicts in the export format, or a label dataset
      (`open_labels(DIR)`), each checked by `Episode.parse`.
    allow_longer: score episodes longer than the model's max_length too (positions past
      it reuse the last position it knows; an out-of-distribution reading). Without it
      they are refused with a one-line error naming the episode.

    Episodes are grouped into length buckets (`pad_length`) and batches of ROW_BUCKETS rows
    (chunks of at most batch_size, and of at most `rows_per_call(pad)`: long episodes go
    fewer to a call), so repeated calls reuse a few compiled programs. Every call is
    dispatched before the first result is read back.
    """
    return self.score_checked(self._parse(episodes, allow_longer), batch_size, allow_longer)

  def score_checked(
    self, eps: Sequence[Episode], batch_size: int = ROW_BUCKETS[-1], allow_longer: bool = False
  ) -> list[dict]:
    """`score` of episodes already checked against this model's spec (`Episode.parse`, and
    `check_length` unless allow_longer): the server parses each request as it arrives, so
    its batches skip a second check."""
    if not eps:
      return []
    lengths = np.array([len(e) for e in eps])
    # The shape of an episode's batch: its length bucket and its step encoder's shape key
    # (a text step's token bucket).
    encoder = self.spec.encoder
    shapes = [(pad_length(n), encoder.shape([e])) for n, e in zip(lengths, eps, strict=True)]
    results: list[dict | None] = [None] * len(eps)
    pending = []
    for pad, shape in sorted(set(shapes), key=lambda s: (s[0], s[1] or 0)):
      ids = np.flatnonzero([s == (pad, shape) for s in shapes])
      step = rows_per_call(pad, batch_size)
      for start in range(0, ids.size, step):
        chunk = ids[start : start + step]
        rows = next((r for r in ROW_BUCKETS if r >= chunk.size), chunk.size)
        batch = episodes_batch(
          [eps[i] for i in chunk] + [None] * (rows - chunk.size),
          pad,
          self.spec,
          allow_longer=allow_longer,
          shape=shape,
        )
        pending.append((chunk, self._score(self.state, batch)))
    for chunk, out in pending:
      out = jax.device_get(out)
      for row, i in enumerate(chunk):
        results[i] = {k: np.asarray(v[row, : lengths[i]]) for k, v in out.items()}
        if eps[i].step_text:  # a text trace: the steps the scores are of, as it was cut
          results[i]["steps"] = list(eps[i].step_text)
    return results

  def describe(self) -> dict:
    return {
      "step": self.step,
      "members": self.members,
      "digest": self.digest,
      "sigma_scale": self.sigma_scale,
      "klass_names": list(KLASS_NAMES),
    }


def checkpoint_workdirs(checkpoint: str) -> list[str]:
  """`--checkpoint` as the programs take it: one run's workdir, or several separated by
  commas (an ensemble's members)."""
  return [w for w in checkpoint.split(",") if w]


def load_predictor(checkpoint: str, step: int | str = "run", calibrated: bool = True):
  """The Predictor of a `--checkpoint` (`checkpoint_workdirs`): one run's model, or the
  ensemble of several (`Predictor.load_ensemble`)."""
  workdirs = checkpoint_workdirs(checkpoint)
  if len(workdirs) > 1:
    return Predictor.load_ensemble(workdirs, step, calibrated)
  return Predictor.load(checkpoint, step, calibrated)


def pad_length(n: int) -> int:
  """The length bucket of an n-step episode: a multiple of PAD_MULTIPLE up to 64 steps,
  else the next power of two."""
  n = max(int(n), 1)
  if n <= 64:
    return int(math.ceil(n / PAD_MULTIPLE) * PAD_MULTIPLE)
  return 1 << math.ceil(math.log2(n))
