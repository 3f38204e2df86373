"""The step encoder: how the credit model reads what each step of an episode shows.

A step encoder is one observation kind (discrete ids, float vectors, text) behind one
protocol, in three parts:

  record   a frozen dataclass of what it learned from the training split (the number of
           ids; the features' mean and std; the tokenizer): the `encoder` of a checkpoint's
           DataSpec (`to_json` / `from_json`), so a checkpoint alone rebuilds it;
  host     what it reads of an `Episode` and how: its episode format (`episode_format`, a
           `data.formats` name), the checks of its input with one-line errors, and the
           padded arrays of a batch (`features`, NumPy);
  device   the nnx module that maps a batch to one vector per step, [B, T, W] (`module`).

`CreditModel` and the drift harness's history models take the encoder from the DataSpec, and
nothing else in the package asks what kind the data is. An encoder whose module starts from
pretrained weights (the LM backbone, `hindsight.lm.credit_encoder`) may also define
`initial_params()`: the nnx.State of its module's `backbone`, which training puts in place of
the random initialisation. A new kind is one module with a class
that meets `StepEncoder` and a `register_encoder` call (docs/training.md, "Your own step
encoder").
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from hindsight import plugins


@runtime_checkable
class StepEncoder(Protocol):
  """One observation kind (module docstring). Instances are the record: frozen and equal
  when they would encode alike.

  kind: the registry's name of the kind (`register_encoder`), stored with the record.
  episode_format: the format of its episodes given as JSON (`data.formats`; "arrays" is
    the export format, which `Episode.parse` reads itself).
  legacy_params: for checkpoints saved before encoders were modules (format 2): each of
    the model's old top-level parameter names -> the path of the same parameters inside
    the encoder's module.
  """

  kind: ClassVar[str]
  episode_format: ClassVar[str]
  legacy_params: ClassVar[Mapping[str, tuple]]

  # -- choosing and fitting it, on the training split (host) ------------------------------
  @classmethod
  def matches(cls, example: Mapping[str, Any]) -> bool:
    """Whether a decoded label-dataset example is of this kind."""
    ...

  @classmethod
  def fit(cls, examples: Sequence[Mapping[str, Any]], options: Mapping[str, Any]) -> StepEncoder:
    """The record fitted on the training split's decoded examples; `options` are the
    training config's choices for it (a text tokenizer's kind and vocabulary)."""
    ...

  # -- its record in a checkpoint ---------------------------------------------------------
  def to_json(self) -> dict[str, Any]:
    """The record as JSON types (without `kind`, which the DataSpec adds)."""
    ...

  @classmethod
  def from_json(cls, record: Mapping[str, Any]) -> StepEncoder:
    """The record `to_json` wrote."""
    ...

  def describe(self) -> str:
    """What it reads, in a few words for messages (`vector observations [7]`)."""
    ...

  @property
  def signature(self) -> tuple:
    """What its inputs must be: models whose encoders share it read the same episodes
    (a fine-tune's labels, a served model's reload)."""
    ...

  # -- host: reading episodes -------------------------------------------------------------
  def check_observations(self, observations: np.ndarray, n: int, where: str) -> np.ndarray:
    """An export-format episode's observations of n steps, checked (a one-line
    HindsightError naming `where`) and as the model reads them."""
    ...

  def reads_observation(self, dtype, shape: tuple[int, ...]) -> bool:
    """Whether an environment whose observation has this dtype and shape fits it."""
    ...

  def shape(self, episodes: Sequence[Any]) -> Hashable:
    """The shape key of a batch of these episodes beyond its rows and steps (a text step's
    token bucket), or None: batches of one key share a compiled program."""
    ...

  def shapes(self) -> list[Hashable]:
    """Every shape key a scored batch may have (what `Predictor.warmup` compiles)."""
    ...

  def features(self, episodes: Sequence[Any], pad: int, shape: Hashable = None) -> dict:
    """The batch fields its module reads, NumPy [B, T, ...] over episodes padded to `pad`
    steps (None rows: padding) at shape key `shape` (None: the training shape)."""
    ...

  # -- device ---------------------------------------------------------------------------
  def module(self, width: int, *, rngs, hidden: int | None = None):
    """The nnx module: batch (its `features` fields) -> float [B, T, width]. `hidden`: the
    width of a hidden layer where the kind has one (None: a single linear map). A kind with
    a large module of its own (a language model's backbone) may also take `dtype`, the
    credit model's compute dtype (`model.compute_dtype`), and compute in it."""
    ...


class ArrayObservations:
  """What the kinds that read the export format's `observations` array (discrete, vector)
  share: a batch has no shape beyond its rows and steps, and its feature is the
  observations, padded (`padded_observations`)."""

  def shape(self, episodes) -> None:
    del episodes

  def shapes(self) -> list:
    return [None]


class TextObservations:
  """What the kinds that read each step's text share (the text step encoder, a language
  model's backbone): no observations array, and no environment whose observations they read."""

  def check_observations(self, observations: np.ndarray, n: int, where: str) -> np.ndarray:
    del observations, n
    from hindsight.errors import HindsightError

    raise HindsightError(f"{where}: a text model reads each step's text, not observations")

  def reads_observation(self, dtype, shape: tuple[int, ...]) -> bool:
    del dtype, shape
    return False


def padded_observations(
  episodes: Sequence[Any], pad: int, trailing: tuple[int, ...], dtype, transform=None
) -> np.ndarray:
  """[B, pad, *trailing] of dtype: each episode's first `pad` observations (`transform`ed
  where given), zeros after its end and on None rows."""
  out = np.zeros((len(episodes), pad, *trailing), dtype)
  for row, ep in enumerate(episodes):
    if ep is not None:
      n = min(len(ep), pad)
      obs = ep.observations[:n]
      out[row, :n] = obs if transform is None else transform(obs)
  return out


_ENCODERS: plugins.Registry = plugins.Registry()  # kind -> encoder class


def register_encoder(cls: type) -> type:
  """Class decorator: adds a step encoder to the registry under `cls.kind`. A dataset's kind
  is detected in registration order (`detect_encoder`); a kind registered later that reads
  the same data is chosen by name (the training config's `data.encoder`)."""
  _ENCODERS[cls.kind] = cls
  return cls


def encoder_class(kind: str) -> type:
  """The encoder registered as `kind` (loading the plug-in of that name if needed); a
  one-line error naming the known ones."""
  from hindsight.errors import HindsightError

  cls = _ENCODERS.lookup(kind)
  if cls is None:
    raise HindsightError(
      f"step encoder '{kind}' is unknown (known: {', '.join(_ENCODERS)}); a checkpoint of a "
      "kind a plug-in adds needs that plug-in installed"
    )
  return cls


def detect_encoder(example: Mapping[str, Any]) -> type | None:
  """The encoder class whose kind a decoded dataset example is (the first registered that
  matches), or None."""
  for cls in _ENCODERS.values():
    if cls.matches(example):
      return cls
  return None


def registered_encoders() -> tuple[str, ...]:
  return tuple(_ENCODERS)
