"""The drift report's numbers (report.json); `drift.render` writes them as a page and plots.

Every CI is a 95% percentile bootstrap over episodes (`hindsight.metrics.drift`).
Per-tag means are in units of each signal's own standard deviation over all steps, centred
on its mean over all steps ("z": how far above the average step a tag sits), so
signals of different scales (an outcome, a probability increment, a credit) compare: the
question is which steps a signal ranks above which, and by how much.
"""

from __future__ import annotations

import jax
import numpy as np
from scipy import stats

from hindsight.credit.names import KLASS_NAMES
from hindsight.metrics import drift as dm
from hindsight.model.programs import program_flops

# The contrast the background essay asks about: decorative steps that look like work vs the
# facts that are the work (reasoning tags; other environments skip it).
LOOKS_GOOD = ("verify", "restate")
DOES_WORK = ("fact",)


def _signals(main, k_label: int) -> dict[str, str]:
  """{row name: column} of the signals present, in table order."""
  cols = main.cols
  rows = {"model (point)": "model_credit", "model (mixture mean)": "model_mean"}
  if "versus_credit" in cols:  # `hindsight eval --versus RUN`
    rows["other model (point)"] = "versus_credit"
  if "label_credit" in cols:
    rows[f"training labels (MC, K={k_label})"] = "label_credit"
  rows["outcome R"] = "outcome"
  src = "label" if "label_progress" in cols else "ref"
  rows["MC progress (soft)"] = f"{src}_progress"
  rows["MC phi_hard (Math-Shepherd hard)"] = f"{src}_phi_hard"
  for name, col in (("learned PRM", "prm"), ("TD advantage", "td_advantage")):
    if col in cols:
      rows[name] = col
  if "rudder" in cols:
    rows["RUDDER (return decomposition)"] = "rudder"
  rows.update(main.rows)  # a backend's own (`EpisodeSet.add_row`)
  return rows


def _valid(cols: dict, names) -> np.ndarray:
  ok = np.isfinite(cols["ref_credit"])
  for n in names:
    ok &= np.isfinite(np.asarray(cols[n], float))
  return ok


def build_report(
  cfg,
  predictor,
  main,
  shift_sets,
  k_label,
  k_ref,
  score_seconds,
  k_star_of_every_signal: bool = False,
  top_k: int = 0,
) -> dict:
  """Every number of report.json (module docstring) over the steps where the reference and
  every signal are defined. k_star_of_every_signal: also the equivalent rollouts of every
  signal but the labels and MC progress (`k_star`); top_k > 0: each signal's top-k recall
  over episodes of more than k steps (`top_recall`)."""
  cols = main.cols
  rows = _signals(main, k_label)
  ok = _valid(cols, rows.values())
  ref = cols["ref_credit"][ok]
  episode = cols["episode"][ok]
  signals = {name: np.asarray(cols[c], float)[ok] for name, c in rows.items()}
  n_boot, seed = cfg.bootstrap, cfg.seed
  out: dict = {"steps": int(ok.sum()), "episodes": len(main.episodes), "signals": rows}
  # The signals in the order tables show them (report.json's objects have sorted keys).
  out["signal_order"] = list(rows)
  out["headline"] = _as_dicts(dm.metric_table(signals, ref, episode, n_boot, seed))
  steps = dm.EpisodeSteps(episode)

  # Calibration of the model's mixture against the reference (its own noise added).
  ref_se = cols["ref_credit_stderr"][ok]
  sigma = np.sqrt(np.square(cols["model_sigma"][ok]) + np.square(ref_se))
  u = dm.pit(ref, cols["model_p_zero"][ok], cols["model_mu"][ok], sigma, seed)
  cov = dm.bootstrap(
    steps.num_episodes, lambda idx: dm.coverage(u[steps.gather(idx)]), n_boot, seed
  )
  out["calibration"] = {
    "coverage": {
      f"{int(level * 100)}%": dm.Estimate(*map(float, (cov[0][i], cov[1][i], cov[2][i]))).as_dict()
      for i, level in enumerate(dm.COVERAGE_LEVELS)
    },
    "reliability": {
      "levels": list(dm.RELIABILITY_LEVELS),
      "observed": dm.coverage(u, dm.RELIABILITY_LEVELS).tolist(),
    },
  }

  # Classes.
  n_cls = len(KLASS_NAMES)
  ref_k = cols["ref_klass"][ok].astype(int)
  out["classes"] = {
    "names": list(KLASS_NAMES),
    "model_vs_reference": dm.confusion(cols["model_klass"][ok], ref_k, n_cls).tolist(),
  }
  if "label_klass" in cols:
    out["classes"]["labels_vs_reference"] = dm.confusion(
      cols["label_klass"][ok], ref_k, n_cls
    ).tolist()

  # Equivalent rollouts.
  if "label_credit" in cols:
    model_e2 = np.square(signals["model (point)"] - ref)
    label_e2 = np.square(cols["label_credit"][ok] - ref)
    # The reference's noise to subtract: its sample variance; a tie-bounded step's stderr is
    # a conservative bound, not a noise level (its branches all tied), so it counts 0.
    ref_var = np.where(cols["ref_credit_bounded"][ok].astype(bool), 0.0, np.square(ref_se))

    def k_star_of(e2):
      def stat(idx):
        sel = steps.gather(idx)
        return [dm.equivalent_rollouts(e2[sel], label_e2[sel], ref_var[sel], k_label)]

      return dm.bootstrap(steps.num_episodes, stat, n_boot, seed)

    v, lo, hi, _ = k_star_of(model_e2)
    per_step_env = float(np.sum(main.rollout_steps)) / max(int(main.mask.sum()), 1) / k_ref
    out["equivalent_rollouts"] = {
      "k": dm.Estimate(float(v[0]), float(lo[0]), float(hi[0])).as_dict(),
      "undefined": dm.k_star_undefined(model_e2, label_e2, ref_var),
      "label_rollouts": k_label,
      "env_steps_per_step_per_rollout": per_step_env,  # all 3 arms (keep, replace, phi)
      "env_steps_per_step": per_step_env * float(v[0]) if np.isfinite(v[0]) else None,
      "model_seconds_per_step": score_seconds
      / max(int(sum(s.mask.sum() for s in [main, *shift_sets])), 1),
      "model_flops_per_step": _flops_per_step(predictor, main),
    }

    if k_star_of_every_signal:
      # Every signal's K* but the labels' (K_L by definition) and MC progress (a different
      # quantity): an observer of the trace, say, is a ceiling for the model's.
      out["k_star"] = {}
      for name, x in signals.items():
        if rows[name] in ("label_credit",) or rows[name].endswith("_progress"):
          continue
        v, lo, hi, _ = k_star_of(np.square(x - ref))
        out["k_star"][name] = dm.Estimate(float(v[0]), float(lo[0]), float(hi[0])).as_dict()

  if top_k:
    out["top_recall"] = {"k": top_k} | {
      name: dm.top_k_recall(x, ref, episode, top_k) for name, x in signals.items()
    }
  out["slices"] = _slices(main, shift_sets, ok, n_boot, seed)
  out["per_tag"] = _per_tag(cols, rows, ok, steps, n_boot, seed)
  out["tag_means"] = _tag_means(cols, rows, ok, steps, n_boot, seed)
  return out


def _as_dicts(table: dict) -> dict:
  return {k: {m: e.as_dict() for m, e in v.items()} for k, v in table.items()}


def _flops_per_step(predictor, main) -> float | None:
  """XLA's FLOP count of one forward pass over a batch of the set / its valid steps."""
  batch = predictor.batch(main.episodes[:64], allow_longer=True)
  flops = program_flops(jax.jit(predictor.credit_fn()), predictor.state, batch)
  return None if flops is None else flops / max(int(batch["mask"].sum()), 1)


def _slices(main, shift_sets, ok, n_boot, seed) -> list[dict]:
  """Model Spearman and MAE per slice, and the change from the whole set, with CIs."""
  cols = {k: v[ok] for k, v in main.cols.items()}  # the steps with a defined reference
  pred, ref = cols["model_credit"], cols["ref_credit"]
  steps = dm.EpisodeSteps(cols["episode"])
  rel = cols["t"] / np.maximum(cols["length"] - 1, 1)
  median_len = np.median(main.lengths)
  slices = {f"tag {t}": cols["tag"] == t for t in sorted(set(cols["tag"].tolist()))}
  slices |= {
    "position: first third": rel < 1 / 3,
    "position: middle third": (rel >= 1 / 3) & (rel < 2 / 3),
    "position: last third": rel >= 2 / 3,
  }
  if main.lengths.min() < main.lengths.max():  # one length (a fixed horizon): no slice
    slices[f"length <= {median_len:g}"] = cols["length"] <= median_len
    slices[f"length > {median_len:g}"] = cols["length"] > median_len
  slices |= {
    "outcome: success": cols["success"].astype(bool),
    "outcome: failure": ~cols["success"].astype(bool),
  }

  def both(p, r):
    sp = dm.correlation(stats.spearmanr, p, r)
    return [sp, float(np.mean(np.abs(p - r)))] if p.size else [np.nan, np.nan]

  # One bootstrap for every slice: each resample scores the whole set once, and every
  # slice's change from it reuses that (the resamples are the seed's, as in every table).
  slices = {name: member for name, member in slices.items() if member.sum() >= 5}
  members = list(slices.values())

  def stat(idx):
    sel = steps.gather(idx)
    whole = both(pred[sel], ref[sel])
    out = list(whole)
    for member in members:
      part = sel[member[sel]]
      here = both(pred[part], ref[part])
      out += [*here, here[0] - whole[0], here[1] - whole[1]]
    return out

  v, lo, hi, dist = dm.bootstrap(steps.num_episodes, stat, n_boot, seed)
  rows = []
  for i, (name, member) in enumerate(slices.items()):
    part = slice(2 + 4 * i, 6 + 4 * i)
    rows.append(_slice_row(name, int(member.sum()), v[part], lo[part], hi[part]))
  if not shift_sets:
    return rows
  whole, whole_dist = v[:2], dist[:, :2]
  for s in shift_sets:
    sc = s.cols
    s_ok = np.isfinite(sc["ref_credit"])
    s_steps = dm.EpisodeSteps(sc["episode"][s_ok])
    p, r = sc["model_credit"][s_ok], sc["ref_credit"][s_ok]

    def shifted(idx, p=p, r=r, s_steps=s_steps):
      sel = s_steps.gather(idx)
      return both(p[sel], r[sel])

    v, lo, hi, dist = dm.bootstrap(s_steps.num_episodes, shifted, n_boot, seed + 1)
    delta = dist - whole_dist  # independent sets: resample each, subtract
    d_lo, d_hi = np.nanpercentile(delta, 2.5, axis=0), np.nanpercentile(delta, 97.5, axis=0)
    rows.append(
      _slice_row(
        f"shift: {s.name}",
        int(s_ok.sum()),
        np.concatenate([v, v - whole]),
        np.concatenate([lo, d_lo]),
        np.concatenate([hi, d_hi]),
      )
    )
  return rows


def _slice_row(name, n, v, lo, hi) -> dict:
  est = lambda i: dm.Estimate(float(v[i]), float(lo[i]), float(hi[i])).as_dict()  # noqa: E731
  return {
    "slice": name,
    "steps": n,
    "spearman": est(0),
    "mae": est(1),
    "spearman_change": est(2),
    "mae_change": est(3),
  }


def _tag_groups(cols, ok):
  """(tags [N], sorted tag names, tag id [N], means): means(x, sel) is the mean of x [N] per
  tag over the steps sel (a bootstrap resample's indices), NaN for a tag absent from it."""
  tags = cols["tag"][ok]
  names = sorted(set(tags.tolist()))
  tag_id = np.searchsorted(np.asarray(names, dtype=object), tags)

  def means(x, sel):
    counts = np.bincount(tag_id[sel], minlength=len(names))
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.bincount(tag_id[sel], weights=x[sel], minlength=len(names)) / counts

  return tags, names, tag_id, means


def _per_tag(cols, rows, ok, steps, n_boot, seed) -> dict:
  """{signal: {tag: z-mean Estimate}, "_contrast": {signal: Estimate}} (module docstring)."""
  tags, names, _, means = _tag_groups(cols, ok)
  good, work = np.isin(tags, LOOKS_GOOD), np.isin(tags, DOES_WORK)
  series = {"reference": cols["ref_credit"][ok]}
  series |= {name: np.asarray(cols[c], float)[ok] for name, c in rows.items()}
  contrast = all(any(t in names for t in group) for group in (LOOKS_GOOD, DOES_WORK))
  out: dict = {"tags": names, "signals": {}, "contrast": {}}
  for name, x in series.items():
    z = (x - float(np.mean(x))) / max(float(np.std(x)), 1e-12)

    def stat(idx, z=z):
      sel = steps.gather(idx)
      by_tag = means(z, sel)
      if not contrast:
        return by_tag
      gap = np.mean(z[sel][good[sel]]) - np.mean(z[sel][work[sel]])
      return np.append(by_tag, gap)

    v, lo, hi, _ = dm.bootstrap(steps.num_episodes, stat, n_boot, seed)
    out["signals"][name] = {
      t: dm.Estimate(float(v[i]), float(lo[i]), float(hi[i])).as_dict() for i, t in enumerate(names)
    }
    if contrast:
      out["contrast"][name] = dm.Estimate(float(v[-1]), float(lo[-1]), float(hi[-1])).as_dict()
  return out


def _tag_means(cols, rows, ok, steps, n_boot, seed) -> dict:
  """Per tag, in credit units: the reference's mean credit, and for the model (point) and the
  training labels their mean and their gap to the reference's (paired, same steps), with
  bootstrap CIs. relative = |gap| / |reference mean|: the issue's "within 3%" reading.
  {tag: {"steps", "reference": Estimate, SIGNAL: {"mean", "gap": Estimate, "relative"}}}."""
  _, names, tag_id, means = _tag_groups(cols, ok)
  ref = cols["ref_credit"][ok]
  series = {"model (point)": cols["model_credit"][ok]}
  if "label_credit" in cols:
    series[next(n for n in rows if n.startswith("training labels"))] = cols["label_credit"][ok]
  counts = np.bincount(tag_id, minlength=len(names))

  def stat(idx):
    sel = steps.gather(idx)
    parts = [means(ref, sel)]
    for x in series.values():
      parts += [means(x, sel), means(x - ref, sel)]
    return np.concatenate(parts)

  v, lo, hi, _ = dm.bootstrap(steps.num_episodes, stat, n_boot, seed)
  n = len(names)
  est = lambda j, i: dm.Estimate(*map(float, (v[j * n + i], lo[j * n + i], hi[j * n + i])))  # noqa: E731
  out = {}
  for i, tag in enumerate(names):
    ref_mean = est(0, i)
    row = {"steps": int(counts[i]), "reference": ref_mean.as_dict()}
    for k, name in enumerate(series):
      gap = est(2 + 2 * k, i)
      row[name] = {
        "mean": est(1 + 2 * k, i).as_dict(),
        "gap": gap.as_dict(),
        # None where the reference's mean is 0 (no relative reading)
        "relative": abs(gap.value) / abs(ref_mean.value) if ref_mean.value else None,
      }
    out[tag] = row
  return out
