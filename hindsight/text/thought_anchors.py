"""Resamples users already have, in the thought-anchors layout, as a hindsight label dataset
(no completion is requested).

The layout (Bogdan, Macar et al. 2025; one directory per problem):

  DIR/problem_<n>/base_solution.json   {prompt, solution, full_cot, answer, is_correct}
  DIR/problem_<n>/chunks.json          {source_text, solution_text, chunks}
  DIR/problem_<n>/chunk_<i>/solutions.json
      [{chunk_removed, prefix_without_chunk, chunk_resampled, rollout, full_cot, answer,
        is_correct}, ...]   continuations of the prefix before chunk i, chunk i resampled

So chunk_<i>'s resamples are the pool of the prefix with i chunks (hindsight.text.estimate):
the keep arm of step i is chunk_<i+1>'s pool (the base solution's is_correct after the last
chunk), and its replace arm is chunk_<i>'s own pool under `policy` (their resampling
importance, acc(i+1) - acc(i)) or the resamples whose new chunk has cosine < the threshold to
the removed one under `policy_other` (their counterfactual importance; the similarity is
hindsight's, `--embedding`, not their sentence encoder unless it is named). Resamples without
an `is_correct` (a failed generation) are left out and counted.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from hindsight.data import labels as label_io
from hindsight.data.metadata import LabelMetadata
from hindsight.errors import HindsightError, make_dir, note
from hindsight.text.estimate import SUCCESS_THRESHOLD, text_step_fields
from hindsight.text.similarity import Similarity

IMPORT_REPLACEMENTS = ("policy", "policy_other")
_PROBLEM = re.compile(r"problem_(\d+)$")


def _read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except OSError as e:
    raise HindsightError(f"{path}: cannot read it ({e.strerror or e})") from None
  except ValueError as e:
    raise HindsightError(f"{path}: not JSON ({e})") from None


def _field(record, name: str, path: str):
  if not isinstance(record, dict) or name not in record:
    raise HindsightError(f"{path}: no `{name}` field")
  return record[name]


def problem_dirs(root: str) -> list[str]:
  """The problem_<n> directories of `root`, by n."""
  if not os.path.isdir(root):
    raise HindsightError(f"{root}: no such directory")
  found = [(int(m.group(1)), d) for d in os.listdir(root) if (m := _PROBLEM.match(d))]
  if not found:
    raise HindsightError(f"{root}: no problem_<n> directories (the thought-anchors layout)")
  return [os.path.join(root, d) for _, d in sorted(found)]


def read_problem(path: str, replacement: str, similarity: Similarity):
  """(prompt, chunks, base outcome, pools [T] of outcomes, replace arms [T], dropped)."""
  base_path = os.path.join(path, "base_solution.json")
  base = _read_json(base_path)
  prompt = str(_field(base, "prompt", base_path))
  outcome = float(bool(_field(base, "is_correct", base_path)))
  chunks_path = os.path.join(path, "chunks.json")
  chunks = [str(c) for c in _field(_read_json(chunks_path), "chunks", chunks_path)]
  if not chunks:
    raise HindsightError(f"{chunks_path}: `chunks` is empty")
  pools, replace, dropped = [], [], 0
  for i, chunk in enumerate(chunks):
    sol_path = os.path.join(path, f"chunk_{i}", "solutions.json")
    solutions = _read_json(sol_path)
    if not isinstance(solutions, list):
      raise HindsightError(f"{sol_path}: expected a list of resamples")
    kept = [s for s in solutions if isinstance(s, dict) and s.get("is_correct") is not None]
    dropped += len(solutions) - len(kept)
    pools.append(np.array([float(bool(s["is_correct"])) for s in kept]))
    if replacement == "policy":
      replace.append(pools[-1])
    else:
      new = [str(s.get("chunk_resampled", "")) for s in kept]
      other = ~similarity.same(chunk, new) if new else np.zeros(0, bool)
      replace.append(pools[-1][other])
  return prompt, chunks, outcome, pools, replace, dropped


def import_thought_anchors(
  root: str,
  out_dir: str,
  *,
  replacement: str = "policy",
  similarity: Similarity | None = None,
  tolerance: float = 0.05,
  confidence: float = 0.95,
) -> str:
  """Writes the label dataset of every problem under `root` to `out_dir`; its dataset dir."""
  if replacement not in IMPORT_REPLACEMENTS:
    raise HindsightError(
      f"replacement {replacement}: thought-anchors resamples give "
      f"{' and '.join(IMPORT_REPLACEMENTS)} only"
    )
  similarity = similarity or Similarity()
  described = {"import": "thought-anchors", "root": os.path.abspath(root),
               "replacement": replacement, "embedding": similarity.spec,
               "similarity": similarity.threshold, "decorative_tolerance": tolerance,
               "confidence": confidence}  # fmt: skip
  if label_io.is_complete(out_dir):
    previous = label_io.open_labels(out_dir).metadata.job_description
    if previous != described:
      raise HindsightError(f"out {out_dir} already holds another dataset; choose another --out")
    return label_io.dataset_dir(out_dir)
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise HindsightError(f"out {out_dir} is not empty and holds no finished import")
  rows, dropped, total, largest = [], 0, 0, 0
  for episode, path in enumerate(problem_dirs(root)):
    prompt, chunks, outcome, pools, replace, lost = read_problem(path, replacement, similarity)
    dropped += lost
    total += sum(len(p) for p in pools)
    largest = max(largest, *(len(p) for p in pools))
    fields = text_step_fields([*pools[1:], np.array([outcome])], pools, replace, outcome,
                              tolerance=tolerance, confidence=confidence)  # fmt: skip
    T = len(chunks)
    fields.update(
      episode=episode,
      actions=np.full(T, -1, np.int32),
      observations=(np.arange(T, dtype=np.float32) / T)[:, None],
      tags=["step"] * T,
      step_text=chunks,
      prompt=prompt,
      trace_id=os.path.basename(path),
    )
    rows.append(fields)
  if dropped:
    note(f"{root}: {dropped} resamples without `is_correct` left out")
  metadata = LabelMetadata(
    job=json.dumps(described, sort_keys=True),
    env="text:thought-anchors",
    env_name="text",
    policy="thought-anchors resamples",
    replacement=replacement,
    rollouts=largest,
    exact=False,
    seed=0,
    gamma=1.0,
    horizon=max(int(r["length"]) for r in rows),
    num_actions=0,
    null_action=-1,
    success_threshold=SUCCESS_THRESHOLD,
    success_from_return=True,
    decorative_tolerance=tolerance,
    confidence=confidence,
    stratify=True,
    tag_names=("step",),
    completions=total,
  )
  features = label_io.build_features((1,), np.float32, False, texts=True)
  make_dir(out_dir, "--out")
  examples = (label_io.make_example(_cut(r)) for r in rows)
  return label_io.write_dataset(out_dir, features, metadata, examples)


def _cut(fields: dict) -> dict:
  """One trace's fields as `make_example` takes them (the dataset's names only)."""
  keep = {"episode", "length", "return", "success", "tags", *label_io.EXAMPLE_STEP_ARRAYS,
          *label_io.TEXT_FIELDS}  # fmt: skip
  return {k: v for k, v in fields.items() if k in keep}
