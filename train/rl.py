"""Trains policies on a credit source (PPO; seeds vmapped) and measures them on the way:
`hindsight rl` under its checkout name.

  python -m train.rl --config configs/rl_reasoning.py[:smoke] \
      --workdir runs/rl/reasoning/mc_credit --config.source=mc_credit [--config.ppo.updates=200 ...]

The same as `hindsight rl --config rl_reasoning ...` (`hindsight rl --help`). Bad input exits
2 with one line on stderr. Killed, a rerun with the same arguments resumes from the last
evaluation point and ends with the same parameters.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
  from hindsight import cli

  return cli.main(["rl", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
  sys.exit(main())
