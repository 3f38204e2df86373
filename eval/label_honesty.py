"""Are the labels honest? Monte Carlo credit against the exact DP on MDPs built to break it.

  python eval/label_honesty.py                        # stratified labels (the default)
  python eval/label_honesty.py --unstratified         # the plain estimator, for comparison
  python eval/label_honesty.py --episodes 200 --rollouts 16,32,64,128

Scenarios (hindsight.envs): `peaked` (a random MDP whose policy puts 0.96 on one action per
state, Gaussian rewards), `sparse` (the same with 0/1 rewards, so branch differences tie),
`rare` (a key corridor the policy finishes 1.35% of the time). For each replacement and K it
labels the episodes, takes the exact credit of the same episodes from the labeler's
dynamic-programming mode, and prints (hindsight.metrics.label_honesty):
  false0    steps whose stderr is 0 while the credit is wrong (must be 0)
  z_rms     RMS z-score of the steps with a sample stderr (n: how many), ideally ~1
  cover     share of those whose 95% interval holds the truth
  tie_cover share of the steps under the tie bound whose interval holds the truth (n)
"""

from __future__ import annotations

import argparse

import jax.numpy as jnp

from hindsight.envs import TabularEnv, peaked_mdp, rare_success_mdp
from hindsight.labeling import LabelConfig, Labeler, to_numpy
from hindsight.metrics import label_honesty
from hindsight.policies import TabularPolicy

SCENARIOS = {
  "peaked": lambda: peaked_mdp(1),
  "sparse": lambda: peaked_mdp(1, sparse=True),
  "rare": rare_success_mdp,
}


def honesty_row(mdp, replacement: str, rollouts: int, episodes: int, stratify: bool) -> dict:
  env, policy = TabularEnv(mdp), TabularPolicy(mdp.pi)
  idx = jnp.arange(episodes)

  def label(**kw):
    config = LabelConfig(replacement=replacement, **kw)
    return to_numpy(Labeler(env, policy, config).sample_and_label(0, idx))

  traj, mc = label(num_rollouts=rollouts, stratify=stratify)
  _, exact = label(num_rollouts=2, exact=True)  # the same episodes: their keys match
  m = traj.mask
  return label_honesty(
    mc["credit"][m], mc["credit_stderr"][m], exact["credit"][m], mc["credit_bounded"][m]
  )


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--episodes", type=int, default=200, help="episodes per row (default 200)")
  p.add_argument("--rollouts", default="16,32,64,128", help="K values (default 16,32,64,128)")
  p.add_argument("--scenarios", default=",".join(SCENARIOS), help="subset of " + str(SCENARIOS))
  p.add_argument("--unstratified", action="store_true", help="the plain estimator")
  args = p.parse_args(argv)
  try:
    ks = [int(k) for k in args.rollouts.split(",")]
    names = args.scenarios.split(",")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or args.episodes < 1 or min(ks) < 2:
      raise ValueError
  except ValueError:
    p.error("--rollouts takes K >= 2 separated by commas, --scenarios names from the list")
  estimator = "plain" if args.unstratified else "stratified"
  print(f"credit labels ({estimator}) against the exact DP, {args.episodes} episodes per row")
  print(
    f"{'scenario':<8} {'q':<8} {'K':>4} {'steps':>6} {'false0':>7} "
    f"{'z_rms':>6} {'(n)':>6} {'cover':>6} {'tie_cover':>10} {'(n)':>6}"
  )
  for name in names:
    mdp = SCENARIOS[name]()
    for replacement in ("policy", "uniform"):
      for k in ks:
        r = honesty_row(mdp, replacement, k, args.episodes, not args.unstratified)
        print(
          f"{name:<8} {replacement:<8} {k:>4} {r['steps']:>6} {r['false_exact']:>7} "
          f"{r['z_rms']:>6.2f} {r['sampled']:>6} {r['coverage']:>6.3f} "
          f"{r['bounded_coverage']:>10.3f} {r['bounded']:>6}",
          flush=True,
        )


if __name__ == "__main__":
  main()
