"""Trains policies on a credit source (PPO; seeds vmapped) and measures them on the way.

  python -m train.rl --config configs/rl_reasoning.py[:smoke] \
      --workdir runs/rl/reasoning/mc_credit --config.source=mc_credit [--config.ppo.updates=200 ...]

Bad input exits 2 with one line on stderr. Killed, a rerun with the same arguments resumes
from the last evaluation point and ends with the same parameters.
"""

from __future__ import annotations

import argparse
import sys

from hindsight.devices import use_all_cpu_cores

EPILOG = """\
configs: rl_reasoning, rl_key_to_door, rl_cartpole (configs/rl_NAME.py[:smoke]).
sources (--config.source=...): {sources}; docs/rl.md defines each.
overrides: --config.FIELD=VALUE sets any field of hindsight/rl/config.py (commented there).
"""


def main(argv: list[str] | None = None) -> int:
  use_all_cpu_cores()  # before JAX starts (the registry of sources imports it): the
  # labeler's rollouts use every core
  from hindsight.rl.sources import registered_sources

  parser = argparse.ArgumentParser(
    prog="train.rl",
    description=__doc__.splitlines()[0],
    epilog=EPILOG.format(sources=", ".join(registered_sources())),
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument("--config", required=True, help="configs/rl_NAME.py or ...:smoke")
  parser.add_argument("--workdir", required=True, help="checkpoints, TensorBoard, results.json")
  args, rest = parser.parse_known_args(argv)
  from hindsight.cli_options import config_overrides

  overrides = config_overrides(rest, "train.rl")
  if overrides is None:
    return 2
  from hindsight.compile_cache import enable_compilation_cache
  from hindsight.errors import report_errors

  enable_compilation_cache()

  def run() -> int:
    from hindsight.config_io import load_config
    from hindsight.rl.trainer import train_and_evaluate

    results = train_and_evaluate(load_config(args.config, overrides), args.workdir)
    seeds = results["seeds"]
    success = sum(s["success"] for s in seeds) / len(seeds)
    length = sum(s["length"] for s in seeds) / len(seeds)
    print(
      f"{results['source']} on {results['env']}: after {results['updates']} updates, success "
      f"{success:.3f}, length {length:.2f} (mean of {len(seeds)} seeds); "
      f"{args.workdir}/results.json"
    )
    return 0

  return report_errors("train.rl", run)


if __name__ == "__main__":
  sys.exit(main())
