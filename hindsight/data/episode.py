"""The episode: one value type for a trajectory as the credit model, the harness, the
audit, `hindsight score` and the server read it.

An `Episode` holds T valid steps (no padding) of what an observer of the trace sees:

  observations  int32 [T] (discrete ids) or float32 [T, D]
  actions       int32 [T]
  rewards       float32 [T]
  success       bool: did the episode succeed, as its environment defines it
                (`Environment.success`, computed once where the trajectory was sampled)
  tags          T names of what each step did (analysis only; may be empty)
  agent         int32 [T] who acted (multi-agent environments), or None
  step_text     T strings, the text of each step (text traces; empty otherwise)
  prompt        what the model was given before step 0 (text traces; "" otherwise)
  trace_id      the trace's name (text traces; "" otherwise), for messages about it
  read_tokens   the tokens the model reads of a text trace, counted when it was checked (a
                server's usage; None otherwise, and never exported)

and, when it comes from a label dataset, its labels (None otherwise):

  credit, credit_stderr, progress   float32 [T]
  klass                             int32 [T] (`credit.estimators.KLASS_NAMES`)
  credit_bounded                    bool [T]: the stderr is the tie bound, not a noise level
  credit_sample_stderr              float32 [T]: the credit's plain sample stderr, its noise
                                    level (None: labels written before it)
  labeled                           bool [T]: which steps carry labels (an audit's dataset)
  agent_shapley, agent_shapley_stderr  float32 [n] per agent

Where episodes come from:
  `Episode.from_example`      a decoded label-dataset example (`open_labels(DIR)[i]`);
  `Episode.parse`             the export format (JSON lines, HTTP bodies, plain dicts),
                              checked against a model's spec with one-line errors; a model
                              whose step encoder reads another format gets the parser its
                              plug-in registered (`data.formats`: the text trace format);
  `labeling.trajectories.episodes_from_trajectories`   sampled `Trajectory`s.
`Episode.to_json` writes the export format back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from hindsight.credit.names import KLASS_NAMES
from hindsight.data.formats import ARRAYS, format_parser
from hindsight.data.labels import as_text
from hindsight.errors import HindsightError

# Per-step label fields an Episode may carry, float32 [T].
LABEL_FIELDS = ("credit", "credit_stderr", "progress")


class ObservationReader(Protocol):
  """What `Episode.parse` asks of a model's step encoder (`model.encoders.StepEncoder`)."""

  episode_format: str

  def check_observations(self, observations: np.ndarray, n: int, where: str) -> np.ndarray: ...


class EpisodeSpec(Protocol):
  """What `Episode.parse` and `check_length` read of a model's spec (`model.spec.DataSpec`)."""

  encoder: ObservationReader
  num_actions: int
  num_agents: int
  max_length: int
  success_threshold: float
  success_from_return: bool


@dataclasses.dataclass(frozen=True, eq=False)
class Episode:
  """One episode of T steps (module docstring: fields and shapes)."""

  observations: np.ndarray
  actions: np.ndarray
  rewards: np.ndarray
  success: bool
  tags: tuple[str, ...] = ()
  agent: np.ndarray | None = None
  credit: np.ndarray | None = None
  credit_stderr: np.ndarray | None = None
  progress: np.ndarray | None = None
  klass: np.ndarray | None = None
  credit_bounded: np.ndarray | None = None
  credit_sample_stderr: np.ndarray | None = None
  labeled: np.ndarray | None = None
  agent_shapley: np.ndarray | None = None
  agent_shapley_stderr: np.ndarray | None = None
  step_text: tuple[str, ...] = ()
  prompt: str = ""
  trace_id: str = ""
  # the tokens the model reads of a text trace (counted when it was checked; not exported)
  read_tokens: int | None = None

  def __len__(self) -> int:
    return int(self.actions.shape[0])

  @property
  def has_labels(self) -> bool:
    return self.credit is not None

  @property
  def episode_return(self) -> float:
    """R = sum_t r_t (undiscounted)."""
    return float(np.sum(self.rewards, dtype=np.float64))

  @classmethod
  def from_example(cls, ex: dict[str, Any]) -> Episode:
    """A decoded label-dataset example (`hindsight.data.labels`' features) -> Episode."""
    T = len(ex["actions"])

    def optional(name, dtype):
      return np.asarray(ex[name], dtype) if name in ex else None

    return cls(
      observations=np.asarray(ex["observations"]),
      actions=np.asarray(ex["actions"], np.int32),
      rewards=np.asarray(ex["rewards"], np.float32),
      success=bool(ex["success"]),
      tags=_parse_tags(ex["tags"], T, "example"),
      agent=optional("agent", np.int32),
      credit=np.asarray(ex["credit"], np.float32),
      credit_stderr=np.asarray(ex["credit_stderr"], np.float32),
      progress=np.asarray(ex["progress"], np.float32),
      klass=np.asarray(ex["klass"], np.int32),
      credit_bounded=np.asarray(ex.get("credit_bounded", np.zeros(T)), bool),
      credit_sample_stderr=optional("credit_sample_stderr", np.float32),
      labeled=optional("labeled", bool),
      agent_shapley=optional("agent_shapley", np.float32),
      agent_shapley_stderr=optional("agent_shapley_stderr", np.float32),
      step_text=tuple(as_text(x) for x in ex.get("step_text", ())),
      prompt=as_text(ex.get("prompt", "")),
      trace_id=as_text(ex.get("trace_id", "")),
    )

  @classmethod
  def parse(cls, episode: Any, spec: EpisodeSpec, where: str = "episode") -> Episode:
    """An episode in the export format (observations, actions, rewards, optional success,
    agent, tags and label fields, as lists or arrays; or an Episode) checked against a
    model's `spec`, its observations by the model's step encoder. Bad input raises a
    one-line HindsightError naming `where` and the field. A missing `success` is derived
    from the rewards only where the model's environment defines success as a return level
    (`DataSpec.success_from_return`). A model whose encoder reads another episode format
    parses with that format's registered parser (`data.formats`)."""
    if isinstance(episode, Episode):
      episode = episode.to_arrays()
    if spec.encoder.episode_format != ARRAYS:
      return format_parser(spec.encoder.episode_format)(episode, spec, where)
    if not isinstance(episode, dict):
      raise HindsightError(f"{where}: expected an object with observations, actions, rewards")
    for name in ("observations", "actions", "rewards"):
      if name not in episode:
        raise HindsightError(f"{where}: missing field '{name}'")
    try:
      actions = np.asarray(episode["actions"])
      with np.errstate(over="ignore"):  # a huge reward becomes inf, refused below
        rewards = np.asarray(episode["rewards"], np.float32)
      obs = np.asarray(episode["observations"])
    except (TypeError, ValueError, OverflowError):
      raise HindsightError(f"{where}: observations, actions and rewards must be arrays") from None
    n = actions.shape[0] if actions.ndim == 1 else -1
    if n < 1:
      raise HindsightError(f"{where}: 'actions' must be a non-empty list of ints")
    if not np.issubdtype(actions.dtype, np.integer):
      raise HindsightError(f"{where}: 'actions' must be ints, got {actions.dtype}")
    if actions.min() < 0 or actions.max() >= spec.num_actions:
      raise HindsightError(f"{where}: an action is outside [0, {spec.num_actions})")
    if rewards.shape != (n,) or not np.all(np.isfinite(rewards)):
      raise HindsightError(f"{where}: 'rewards' must be {n} finite numbers, one per action")
    obs = spec.encoder.check_observations(obs, n, where)
    out: dict[str, Any] = {"observations": obs, "actions": actions.astype(np.int32)}
    out["rewards"] = rewards
    out["success"] = _parse_success(episode.get("success"), rewards, spec, where)
    if episode.get("tags") is not None:
      out["tags"] = _parse_tags(episode["tags"], n, where)
    out.update(parse_labels(episode, n, where))
    if spec.num_agents:
      out["agent"] = _parse_agent(episode.get("agent"), n, spec.num_agents, where)
    return cls(**out)

  def to_arrays(self) -> dict[str, Any]:
    """The fields that are set, as a dict of arrays (None fields and no tags left out)."""
    out = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name == "read_tokens":
        continue
      if f.name in ("tags", "step_text", "prompt", "trace_id"):
        if value:
          out[f.name] = value if isinstance(value, str) else list(value)
      elif value is not None:
        out[f.name] = value
    return out

  def to_json(self) -> dict[str, Any]:
    """The export format: plain JSON types, classes by name, NaN as null."""
    out: dict[str, Any] = {}
    for name, value in self.to_arrays().items():
      if name == "klass":
        out[name] = [KLASS_NAMES[int(k)] for k in value]
      elif isinstance(value, np.ndarray):
        out[name] = [None if isinstance(v, float) and v != v else v for v in value.tolist()]
      else:
        out[name] = value
    return out


def _parse_success(success, rewards: np.ndarray, spec: EpisodeSpec, where: str) -> bool:
  if success is None:
    if not spec.success_from_return:
      raise HindsightError(
        f"{where}: missing field 'success' (this model's environment does not define success "
        "by the return, so it cannot be derived from the rewards)"
      )
    return bool(rewards.sum() > spec.success_threshold)
  if not isinstance(success, bool | int | float | np.bool_ | np.number):
    raise HindsightError(f"{where}: 'success' must be true or false")
  return bool(success)


def _parse_tags(tags, n: int, where: str) -> tuple[str, ...]:
  if isinstance(tags, str | bytes) or not hasattr(tags, "__len__") or len(tags) != n:
    raise HindsightError(f"{where}: 'tags' must be {n} names, one per action")
  return tuple(as_text(t) for t in tags)


def parse_labels(episode: dict, n: int, where: str) -> dict[str, np.ndarray]:
  """The label fields an exported episode of n steps carries (LABEL_FIELDS, float32 [n], and
  klass), checked; a one-line HindsightError naming `where` and the field."""
  out = {}
  for name in LABEL_FIELDS:
    if episode.get(name) is not None:
      try:
        out[name] = np.asarray(episode[name], np.float32).reshape(n)
      except (TypeError, ValueError):
        raise HindsightError(f"{where}: '{name}' must be {n} numbers") from None
  if episode.get("klass") is not None:
    out["klass"] = parse_klass(episode["klass"], n, where)
  return out


def parse_klass(klass, n: int, where: str) -> np.ndarray:
  klass = np.asarray(klass)
  if klass.dtype.kind in "US":  # the export format names classes
    unknown = set(klass.tolist()) - set(KLASS_NAMES)
    if unknown:
      raise HindsightError(f"{where}: unknown klass {sorted(unknown)[0]!r}")
    klass = np.array([KLASS_NAMES.index(k) for k in klass.tolist()])
  if klass.shape != (n,) or not np.issubdtype(klass.dtype, np.integer):
    raise HindsightError(f"{where}: 'klass' must be {n} class names or ids")
  return klass.astype(np.int32)


def _parse_agent(agent, n: int, num_agents: int, where: str) -> np.ndarray:
  try:
    agent = np.asarray(np.arange(n) % num_agents if agent is None else agent)
  except (TypeError, ValueError):
    agent = np.zeros(0)
  ok = agent.shape == (n,) and np.issubdtype(agent.dtype, np.integer)
  if not ok or agent.min() < 0 or agent.max() >= num_agents:
    raise HindsightError(f"{where}: 'agent' must be {n} ids in [0, {num_agents})")
  return agent.astype(np.int32)


def check_length(episode: Episode, spec: EpisodeSpec, where: str = "episode") -> None:
  """A one-line HindsightError when the episode is longer than the longest the model was
  trained on (`spec.max_length`): positions past it would be clamped to the last one it
  knows and n / T_max would pass 1, so its numbers would look like any others. Callers that
  mean to score such episodes (an out-of-distribution slice) opt in with allow_longer."""
  if len(episode) > spec.max_length:
    raise HindsightError(
      f"{where}: {len(episode)} steps, longer than the {spec.max_length} the model was trained "
      "on (allow_longer=True, or --allow-longer, scores it anyway)"
    )
