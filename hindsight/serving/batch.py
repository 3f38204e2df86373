"""`hindsight score`: batch-score a JSONL file or a label dataset into JSONL.

Each output line is the input episode (the export format) plus, per step,
`predicted_credit`, `predicted_std`, `predicted_p_zero` and `predicted_klass` (names), and
for a text model `step_text`, the steps the scores are of (a trace given as `text` is cut by
the chunking rule of the model's labels). The
output is written to a temporary file and renamed when complete: a killed run leaves no
half-written file that looks finished.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np

from hindsight.credit.names import KLASS_NAMES
from hindsight.data.episode import Episode, check_length
from hindsight.data.labels import CHECKSUMS, dataset_dir, episode_to_json, job_dir, open_labels
from hindsight.errors import HindsightError
from hindsight.files import atomic_open
from hindsight.model.predictor import Predictor
from hindsight.progress import CompileAwareBar
from hindsight.serving.config import ScoreConfig
from hindsight.serving.formats import unverifiable_reference

CHUNK = 256  # episodes scored per call


def score_run(cfg: ScoreConfig) -> int:
  """`hindsight score`: every episode of cfg.input scored into cfg.out; the count."""
  return score_file(Predictor.load(cfg.checkpoint, cfg.step), cfg.input, cfg.out,
                    progress=cfg.progress, allow_longer=cfg.allow_longer)  # fmt: skip


def _read_jsonl(path: str) -> Iterator[dict]:
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        yield json.loads(line)
      except ValueError:
        raise HindsightError(f"--input {path}: line {n} is not JSON") from None


def read_episodes(path: str) -> tuple[int | None, Iterator[dict]]:
  """(count if known, episodes) of a JSONL file or a label dataset directory."""
  if os.path.isdir(path):
    if not os.path.isfile(os.path.join(dataset_dir(job_dir(path)), CHECKSUMS)):
      raise HindsightError(f"--input {path}: neither a JSONL file nor a label dataset")
    labels = open_labels(path)
    names = labels.metadata.klass_names
    return len(labels), (episode_to_json(ex, names) for ex in labels)
  if not os.path.isfile(path):
    raise HindsightError(f"--input {path}: no such file")
  return None, _read_jsonl(path)


def score_file(
  predictor: Predictor, path: str, out: str, progress: bool = True, allow_longer: bool = False
) -> int:
  """Scores every episode of `path` into `out` (JSONL); returns the episode count. Episodes
  longer than the model was trained on are refused (naming the first) unless allow_longer."""
  total, episodes = read_episodes(path)
  names = np.asarray(KLASS_NAMES)
  directory = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(directory):
    raise HindsightError(f"out {out}: directory {directory} does not exist")
  count = 0
  with (
    atomic_open(out) as f,
    CompileAwareBar(total=total, desc="score", unit="ep", disable=not progress, delay=0.5) as bar,
  ):
    chunk: list[dict] = []

    def flush():
      nonlocal count
      scores = predictor.score(chunk, allow_longer=allow_longer)
      for ep, sc in zip(chunk, scores, strict=True):
        ep = dict(ep)
        ep["predicted_credit"] = sc["credit"].astype(float).tolist()
        ep["predicted_std"] = sc["std"].astype(float).tolist()
        ep["predicted_p_zero"] = sc["p_zero"].astype(float).tolist()
        ep["predicted_klass"] = names[sc["klass"]].tolist()
        if "steps" in sc:  # a text trace: its steps as the model cut them
          ep["step_text"] = sc["steps"]
        f.write(json.dumps(ep, sort_keys=True) + "\n")
      count += len(chunk)
      bar.update(len(chunk))
      chunk.clear()

    for i, ep in enumerate(episodes):
      where = f"--input {path}: episode {i}"
      refused = unverifiable_reference(ep, predictor.spec, where)
      if refused is not None:
        raise HindsightError(refused)
      parsed = Episode.parse(ep, predictor.spec, where)  # one line, by place
      if not allow_longer:
        check_length(parsed, predictor.spec, where)
      chunk.append(ep)
      if len(chunk) == CHUNK:
        flush()
    if chunk:
      flush()
  return count
