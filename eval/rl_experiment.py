"""Every credit source on one environment: does credit-shaped training shorten traces?
`hindsight rl --sources ...` under the name the experiment's tables cite.

  python eval/rl_experiment.py --config configs/rl_reasoning.py [--sources outcome,mc_credit]
      [--out runs/rl/reasoning] [--config.FIELD=VALUE ...]

--sources defaults to every registered source, --out to runs/rl/ENV_NAME. What it writes
(OUT/SOURCE runs, results.json, table.md, curves.png): `hindsight.rl.experiment`.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True, help="an RL config: NAME or FILE.py[:VARIANT]")
  parser.add_argument("--sources", default="all", help="comma-separated (default: all)")
  parser.add_argument("--out", default="", help="default runs/rl/ENV_NAME (':' as '_')")
  args, rest = parser.parse_known_args(argv)
  from hindsight import cli

  workdir = ["--workdir", args.out] if args.out else []
  return cli.main(["rl", "--config", args.config, "--sources", args.sources, *workdir, *rest])


if __name__ == "__main__":
  sys.exit(main())
