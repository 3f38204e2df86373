"""`hindsight summary DIR`: credit per tag and class counts of a label dataset."""

from __future__ import annotations

NAME = "summary"
HELP = "credit per tag and class counts of a label dataset"


def add_parser(sub):
  summ = sub.add_parser(NAME, help=HELP)
  summ.add_argument("dir", help="a `hindsight label --out` directory")
  return summ


def run(args) -> int:
  from hindsight.data import open_labels
  from hindsight.metrics import summarize

  print(summarize(open_labels(args.dir)))
  return 0
