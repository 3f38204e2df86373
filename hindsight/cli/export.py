"""`hindsight export DIR --format jsonl`: a label dataset as one JSON object per episode."""

from __future__ import annotations

import json
import sys

NAME = "export"
HELP = "print a label dataset"


def add_parser(sub):
  exp = sub.add_parser(NAME, help=HELP)
  exp.add_argument("dir", help="a `hindsight label --out` directory")
  exp.add_argument("--format", default="jsonl", choices=("jsonl",), help="output format")
  return exp


def run(args) -> int:
  from hindsight.data import episode_to_json, open_labels

  labels = open_labels(args.dir)
  klass_names = labels.metadata.klass_names
  for example in labels:
    line = json.dumps(episode_to_json(example, klass_names), sort_keys=True, allow_nan=False)
    sys.stdout.write(line + "\n")
  return 0
