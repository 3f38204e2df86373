"""Per-tag summaries of a label dataset: what each kind of step earned, and how it looks.

For each tag: number of steps, mean credit with the standard error of that mean across steps
(steps, not branches, are the sampling unit here), mean progress, and the share of each klass.
Overall: success rate and the Spearman rank correlation between progress ("looks good") and
credit ("did work") over all steps.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from hindsight.credit.names import KLASS_NAMES
from hindsight.data.labels import as_text
from hindsight.metrics.credit_fit import correlation


def tag_table(labels) -> dict:
  """Aggregates a Labels dataset. Returns {tag: {...}} plus an "_all" entry."""
  tags, credit, progress, klass, stderr, bounded = [], [], [], [], [], []
  returns, success = [], []
  for ex in labels:
    tags += [as_text(t) for t in ex["tags"]]
    credit.append(ex["credit"])
    progress.append(ex["progress"])
    klass.append(ex["klass"])
    stderr.append(ex["credit_stderr"])
    bounded.append(ex["credit_bounded"] if "credit_bounded" in ex else np.zeros(len(ex["klass"])))
    returns.append(float(ex["return"]))
    success.append(bool(ex["success"]))
  tags = np.asarray(tags)
  credit, progress = np.concatenate(credit), np.concatenate(progress)
  klass = np.concatenate(klass).astype(int)
  stderr, bounded = np.concatenate(stderr), np.concatenate(bounded).astype(bool)
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
  # NaN where either side is constant (scipy would warn and give NaN).
  rho = correlation(stats.spearmanr, progress[ok], credit[ok]) if ok.sum() > 2 else float("nan")
  table["_all"] = dict(
    episodes=len(returns),
    steps=int(tags.size),
    mean_return=float(np.mean(returns)),
    success_rate=float(np.mean(success)),
    spearman_progress_credit=float(rho),
    exact_share=float(np.mean(stderr == 0)),
    bounded_share=float(np.mean(bounded)),
  )
  return table


def summarize(labels) -> str:
  """A plain-text report of `tag_table`."""
  table = tag_table(labels)
  overall = table.pop("_all")
  meta = labels.metadata
  lines = [
    f"{labels.path}",
    f"env {meta.env}  replacement {meta.replacement}  "
    f"rollouts {meta.rollouts}  exact {meta.exact}  seed {meta.seed}",
    f"{overall['episodes']} episodes, {overall['steps']} steps, mean return "
    f"{overall['mean_return']:.3f}, success rate {overall['success_rate']:.3f}",
    f"Spearman(progress, credit) over steps: {overall['spearman_progress_credit']:.3f}",
    f"credit stderr: exact (0) on {overall['exact_share']:.1%} of steps, the tie bound on "
    f"{overall['bounded_share']:.1%}, a sample stderr on the rest",
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
  agents = agent_table(labels)
  if agents:
    lines += ["", "agent-level credit (coalition rollouts; mean over episodes +- se):"]
    lines.append(
      f"{'agent':<16}{'shapley':>10}{'+-se':>8}{'95% CI':>18}{'within-ep se':>14}"
      f"{'step credit':>13}"
    )
    z = stats.norm.ppf(0.975)
    for name, row in agents["agents"].items():
      lo, hi = row["shapley"] - z * row["shapley_se"], row["shapley"] + z * row["shapley_se"]
      lines.append(
        f"{name:<16}{row['shapley']:>10.3f}{row['shapley_se']:>8.3f}"
        f"{f'[{lo:.3f}, {hi:.3f}]':>18}{row['within_episode_se']:>14.3f}{row['step_credit']:>13.3f}"
      )
    if not agents["interactions"]:
      lines.append("(sampled Shapley values: no pairwise interactions)")
    else:
      lines.append("pairwise Shapley interaction index (mean over episodes +- se):")
    for pair, (mean, se) in agents["interactions"].items():
      lines.append(f"  {pair:<30}{mean:>8.3f} +- {se:.3f}")
  return "\n".join(lines)


def agent_table(labels) -> dict:
  """Agent-level summary of a multi-agent dataset ({} if it has no agent fields).

  agents: {name: shapley (mean over episodes), shapley_se (across episodes),
           within_episode_se (mean rollout stderr of one episode's value),
           step_credit (mean step-level credit of the agent's own turns)};
  interactions: {"a x b": (mean, se)} for every pair of agents ({} for sampled Shapley
  values, which come without them).
  """
  names = list(labels.metadata.agent_names)
  if not names:
    return {}
  phi, phi_se, inter, credit, agent = [], [], [], [], []
  for ex in labels:
    phi.append(ex["agent_shapley"])
    phi_se.append(ex["agent_shapley_stderr"])
    if "agent_interaction" in ex:
      inter.append(ex["agent_interaction"])
    credit.append(ex["credit"])
    agent.append(ex["agent"])
  phi, phi_se, inter = np.asarray(phi), np.asarray(phi_se), np.asarray(inter)
  credit, agent = np.concatenate(credit), np.concatenate(agent)
  root = np.sqrt(len(phi))
  rows = {}
  for i, name in enumerate(names):
    own = credit[(agent == i) & ~np.isnan(credit)]
    rows[name] = dict(
      shapley=float(phi[:, i].mean()),
      shapley_se=float(phi[:, i].std(ddof=1) / root) if len(phi) > 1 else float("nan"),
      within_episode_se=float(phi_se[:, i].mean()),
      step_credit=float(own.mean()) if own.size else float("nan"),
    )
  pairs = {}
  if len(inter):  # sampled Shapley values come without interactions
    for i in range(len(names)):
      for j in range(i + 1, len(names)):
        x = inter[:, i, j]
        se = float(x.std(ddof=1) / root) if len(x) > 1 else float("nan")
        pairs[f"{names[i]} x {names[j]}"] = (float(x.mean()), se)
  return {"agents": rows, "interactions": pairs}
