"""Per-tag summaries of a label dataset: what each kind of step earned, and how it looks.

For each tag: number of steps, mean credit with the standard error of that mean across steps
(steps, not branches, are the sampling unit here), mean progress, and the share of each klass.
Overall: success rate and the Spearman rank correlation between progress ("looks good") and
credit ("did work") over all steps.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from hindsight.credit.estimators import KLASS_NAMES


def tag_table(labels) -> dict:
  """Aggregates a Labels dataset. Returns {tag: {...}} plus an "_all" entry."""
  tags, credit, progress, klass = [], [], [], []
  returns, success = [], []
  for ex in labels:
    tags += [t.decode() if isinstance(t, bytes) else str(t) for t in ex["tags"]]
    credit.append(ex["credit"])
    progress.append(ex["progress"])
    klass.append(ex["klass"])
    returns.append(float(ex["return"]))
    success.append(bool(ex["success"]))
  tags = np.asarray(tags)
  credit, progress = np.concatenate(credit), np.concatenate(progress)
  klass = np.concatenate(klass).astype(int)
  table = {}
  for tag in sorted(set(tags.tolist())):
    sel = tags == tag
    c = credit[sel][~np.isnan(credit[sel])]
    table[tag] = dict(
      steps=int(sel.sum()),
      credit=float(c.mean()) if c.size else float("nan"),
      credit_se=float(c.std(ddof=1) / np.sqrt(c.size)) if c.size > 1 else float("nan"),
      progress=float(np.nanmean(progress[sel])),
      klass={name: float(np.mean(klass[sel] == i)) for i, name in enumerate(KLASS_NAMES)},
    )
  ok = ~np.isnan(credit) & ~np.isnan(progress)
  rho = stats.spearmanr(progress[ok], credit[ok]).statistic if ok.sum() > 2 else float("nan")
  table["_all"] = dict(
    episodes=len(returns),
    steps=int(tags.size),
    mean_return=float(np.mean(returns)),
    success_rate=float(np.mean(success)),
    spearman_progress_credit=float(rho),
  )
  return table


def summarize(labels) -> str:
  """A plain-text report of `tag_table`."""
  table = tag_table(labels)
  overall = table.pop("_all")
  meta = labels.metadata
  lines = [
    f"{labels.path}",
    f"env {meta.get('env')}  replacement {meta.get('replacement')}  "
    f"rollouts {meta.get('rollouts')}  exact {meta.get('exact')}  seed {meta.get('seed')}",
    f"{overall['episodes']} episodes, {overall['steps']} steps, mean return "
    f"{overall['mean_return']:.3f}, success rate {overall['success_rate']:.3f}",
    f"Spearman(progress, credit) over steps: {overall['spearman_progress_credit']:.3f}",
    "",
    f"{'tag':<18}{'steps':>8}{'credit':>10}{'+-se':>8}{'progress':>10}   "
    + " ".join(f"{n[:12]:>12}" for n in KLASS_NAMES),
  ]
  for tag, row in table.items():
    shares = " ".join(f"{row['klass'][n]:>12.2f}" for n in KLASS_NAMES)
    lines.append(
      f"{tag:<18}{row['steps']:>8}{row['credit']:>10.3f}{row['credit_se']:>8.3f}"
      f"{row['progress']:>10.3f}   {shares}"
    )
  return "\n".join(lines)
