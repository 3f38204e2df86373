"""How honest Monte Carlo labels are against the truth: false certainty, z-scores, coverage."""

from __future__ import annotations

import numpy as np


def label_honesty(estimate, stderr, truth, bounded, z: float = 1.96) -> dict[str, float]:
  """How honest MC labels are against the truth (flat arrays over real steps).

  false_exact: steps with stderr 0 whose error is above float round-off.
  z_rms: RMS of (estimate - truth) / stderr over the steps whose stderr is the sample one.
  coverage / bounded_coverage: share of those steps / of the steps under the tie bound
  (`bounded`) whose estimate +- z stderr holds the truth.
  """
  err = estimate - truth
  has = np.isfinite(stderr) & (stderr > 0)
  sample, tie = has & ~bounded, has & bounded
  zs = err[sample] / stderr[sample]
  zb = err[tie] / stderr[tie]
  return {
    "steps": int(err.size),
    "false_exact": int(np.sum((stderr == 0) & (np.abs(err) > 1e-4))),
    "z_rms": float(np.sqrt(np.mean(zs**2))) if zs.size else float("nan"),
    "sampled": int(zs.size),
    "coverage": float(np.mean(np.abs(zs) <= z)) if zs.size else float("nan"),
    "bounded": int(zb.size),
    "bounded_coverage": float(np.mean(np.abs(zb) <= z)) if zb.size else float("nan"),
    "exact_share": float(np.mean(stderr == 0)),
  }
