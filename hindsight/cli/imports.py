"""`hindsight import thought-anchors DIR --out OUT`: another tool's resamples as a label
dataset (docs/text.md)."""

from __future__ import annotations

from hindsight.cli.options import option

NAME = "import"
HELP = "resamples in another tool's layout -> a label dataset"


def add_parser(sub):
  from hindsight.labeling.config import LabelConfig
  from hindsight.text.options import TextOptions

  imp = sub.add_parser(NAME, help=HELP)
  imp.add_argument("layout", choices=("thought-anchors",), help="the layout of DIR")
  imp.add_argument("dir", help="the directory of problem_<n> folders")
  imp.add_argument("--out", required=True, help="output directory")
  imp.add_argument("--replacement", default="policy", choices=("policy", "policy_other"),
                   help="policy: resampling importance; policy_other: counterfactual")  # fmt: skip
  option(imp, TextOptions, "embedding", "what counts as the same chunk: lexical or MODULE:FN")
  option(imp, TextOptions, "similarity", "cosine at or above which a resample is the same chunk")
  option(imp, LabelConfig, "decorative_tolerance", "|credit| under this is decorative")
  option(imp, LabelConfig, "confidence", "level of the klass interval")
  return imp


def run(args) -> int:
  from hindsight.text.similarity import Similarity
  from hindsight.text.thought_anchors import import_thought_anchors

  path = import_thought_anchors(
    args.dir,
    args.out,
    replacement=args.replacement,
    similarity=Similarity(args.embedding, args.similarity),
    tolerance=args.decorative_tolerance,
    confidence=args.confidence,
  )
  print(f"labels: {path}")
  return 0
