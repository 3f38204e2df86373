"""`hindsight coalition --values FILE.npy`: Shapley values, interactions and dividends of a
coalition game v [2^n] (indexed by bitmask), as JSON."""

from __future__ import annotations

import json

NAME = "coalition"
HELP = "Shapley values, interactions, dividends of a game"


def add_parser(sub):
  coal = sub.add_parser(NAME, help=HELP)
  coal.add_argument(
    "--values", required=True, help=".npy of v(S), length 2^n, index = bitmask of agents"
  )
  return coal


def run(args) -> int:
  import numpy as np

  from hindsight.credit import coalition
  from hindsight.errors import HindsightError

  try:
    values = np.load(args.values, allow_pickle=False)
  except OSError as e:
    raise HindsightError(f"--values {args.values}: cannot read it ({e.strerror or e})") from None
  except ValueError:  # numpy's words for a text or pickle file are about pickles
    raise HindsightError(
      f"--values {args.values}: not a .npy array file (write one with numpy.save)"
    ) from None
  if values.ndim != 1 or not np.issubdtype(values.dtype, np.number):
    raise HindsightError(f"--values {args.values}: expected a 1-D numeric array, got "
                         f"{values.dtype} {values.shape}")  # fmt: skip
  if not np.all(np.isfinite(values)):
    bad = int(np.flatnonzero(~np.isfinite(values))[0])
    raise HindsightError(f"--values {args.values}: v[{bad}] = {values[bad]} is not finite")
  n = coalition.num_agents(values)
  if n > 20:
    raise HindsightError(f"--values {args.values}: more than 20 agents; use shapley_sampled")
  d = np.asarray(coalition.dividends(values))

  def rounded(x):  # float32 results, printed to the precision they carry
    return np.asarray(x, np.float64).round(5).tolist()

  out = {
    "agents": n,
    "shapley": rounded(coalition.shapley(values)),
    "interaction": rounded(coalition.interaction(values)),
    "pair_terms": rounded(coalition.pair_terms(values)),
    # Non-zero dividends by coalition, members listed: {"0,2": d({0, 2}), ...}.
    "dividends": {
      ",".join(str(i) for i in range(n) if m >> i & 1) or "{}": round(float(d[m]), 5)
      for m in range(1 << n)
      if abs(d[m]) > 1e-9
    },
  }
  # One line per key, compact values: valid JSON that reads like the labeling docs' sample.
  print("{" + ",\n ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in out.items()) + "}")
  return 0
