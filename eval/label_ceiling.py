"""What rank correlation a label dataset allows, before any model is trained.

  python eval/label_ceiling.py runs/demo/labels [more label dirs]

For the finite credit labels y_t with stderr e_t of a dataset it prints:
  exact_zero_share   labels exactly 0 with stderr 0 (ties);
  noisy_copy         Spearman(y, y + e z), z ~ N(0, 1): a second, independent labeling
                     of the same steps would agree about this well (ties stay ties);
  continuous         Spearman(y, y + 1e-3 z): the best a prediction that never ties can do;
  reliability        1 - mean(e^2) / var(y).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from scipy import stats

from hindsight.data import open_labels


def ceiling(labels_dir: str, seed: int = 0) -> dict:
  labels = open_labels(labels_dir)
  y = np.concatenate([ex["credit"] for ex in labels])
  e = np.concatenate([ex["credit_stderr"] for ex in labels])
  ok = np.isfinite(y) & np.isfinite(e)
  y, e = y[ok], e[ok]
  z = np.random.default_rng(seed).normal(size=y.size)
  return {
    "labels": labels_dir,
    "steps": int(y.size),
    "exact_zero_share": round(float(np.mean((y == 0) & (e == 0))), 3),
    "noisy_copy": round(float(stats.spearmanr(y, y + e * z).statistic), 3),
    "continuous": round(float(stats.spearmanr(y, y + 1e-3 * z).statistic), 3),
    "reliability": round(float(1 - np.mean(e**2) / np.var(y)), 3),
  }


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("dirs", nargs="+", help="`hindsight label --out` directories")
  for d in p.parse_args().dirs:
    print(json.dumps(ceiling(d)))


if __name__ == "__main__":
  main()
