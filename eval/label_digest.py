"""A SHA-256 of the labels of every environment family: the check that a refactor left labels
bitwise as they were.

  python eval/label_digest.py [--families tabular,reasoning,...] [--out DIR]

Each family labels a small job through `hindsight.run_label_job` (the path `hindsight label`
takes) and hashes every field of every example, in order, with the job's metadata (text
paths relative to the run's folder). Run it before and after a
change and compare the lines; any difference in any label, trajectory or metadata field
changes the family's digest.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import tempfile

import numpy as np

import hindsight
from hindsight.text.options import TextOptions

# family -> (env spec, LabelJob keyword arguments beyond env, episodes and config).
JOBS = {
  "tabular": ("key_corridor", {}),
  "tabular_exact": ("key_corridor", {"exact": True}),
  "key_to_door": ("key_to_door", {}),
  "reasoning": ("reasoning", {"replacement": "policy_other"}),
  "team": ("team", {}),
  "gymnax": ("gymnax:MemoryChain-bsuite", {"return_range": (-1.0, 1.0)}),
  "gymnasium": ("gymnasium:CartPole-v1", {"horizon": 12, "replacement": "uniform"}),
  "dm_env": ("dm_env:bsuite.environments.catch:Catch", {}),
  "text": (None, {}),
}
CONFIG_FIELDS = ("replacement", "exact")


def _digest(labels, root: str) -> str:
  h = hashlib.sha256()
  # The metadata as stored; its paths are under the run's own folder: hashed relative to it.
  stored = dict(labels.info.metadata)
  h.update(json.dumps(stored, sort_keys=True, default=str).replace(root, "").encode())
  for example in labels:
    for name in sorted(example):
      value = np.asarray(example[name])
      h.update(name.encode())
      h.update(str(value.dtype).encode() + str(value.shape).encode())
      h.update(value.tobytes() if value.dtype != object else repr(value.tolist()).encode())
  return h.hexdigest()


def _job(family: str, root: str, stack: contextlib.ExitStack) -> hindsight.LabelJob:
  spec, kw = JOBS[family]
  config = {k: kw.pop(k) for k in CONFIG_FIELDS if k in kw}
  K = 1 if config.get("exact") else 4
  if family == "text":
    from hindsight.text.trace import write_traces
    from hindsight.worlds import world
    from hindsight.worlds.server import running_world

    url = stack.enter_context(running_world())
    path = os.path.join(root, "prompts.jsonl")
    write_traces(path, world.prompt_traces(0, 6))
    spec = f"text:{path}"
    kw["options"] = TextOptions(endpoint=url, model=world.MODEL_NAME)
  return hindsight.LabelJob(
    env=spec, episodes=6, config=hindsight.LabelConfig(num_rollouts=K, **config), seed=3, **kw
  )


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--families", default=",".join(JOBS), help="comma-separated, of " + ",".join(JOBS))
  p.add_argument("--out", default="", help="keep the datasets here (default: a temporary dir)")
  args = p.parse_args()
  with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
    root = args.out or tmp
    os.makedirs(root, exist_ok=True)
    for family in args.families.split(","):
      job = _job(family, root, stack)
      out = hindsight.run_label_job(job, os.path.join(root, family), progress=False)
      print(f"{family:14s} {_digest(hindsight.open_labels(out), root)}", flush=True)


if __name__ == "__main__":
  main()
