"""eval/readme_results.py on hand-written reports: every figure of the README's results
section is the reports' own, in its own place, and the check holds a README to the same
figures up to float rounding (as the README promises of another machine) and no further."""

from __future__ import annotations

import json
import re

import pytest

from eval import readme_results

K = 64
# The drift report's signals with figures no two share: a row that read another signal's
# figures, or another metric's, would show it.
SIGNALS = [signal.format(k=K) for signal, _ in readme_results.ROWS]


def _estimate(value, width=0.01):
  return {"value": value, "lo": value - width, "hi": value + width}


def _reports(tmp_path, **drift_changes):
  """RUN/report.json and RUN/drift/report.json as `make demo` leaves them, figures apart."""
  headline = {
    signal: {
      "spearman": _estimate(0.11 + 0.1 * i),
      "mae": _estimate(0.0123 + 0.01 * i, 0.001),
      "within_spearman": _estimate(0.07 + 0.1 * i),
    }
    for i, signal in enumerate(SIGNALS)
  }
  drift = {
    "label_rollouts": K,
    "env": "reasoning",
    "episodes": 512,
    "steps": 4420,
    "reference": {
      "rollouts": 1024,
      "check": {"spearman_ceiling": 0.9, "spearman_between_passes": 0.81},
    },
    "headline": headline,
    "equivalent_rollouts": {"k": {"value": 151.3, "lo": 126.4, "hi": 176.4}},
    "calibration": {"coverage": {"95%": {"value": 0.955, "lo": 0.945, "hi": 0.962}}},
    "per_tag": {
      "contrast": {
        "reference": {"value": -0.48},
        "model (point)": {"value": -0.49},
        "learned PRM": {"value": -0.2},
      }
    },
    **drift_changes,
  }
  train = {
    "episodes": {"train": 12288, "validation": 4096},
    "train": {"steps": 9000},
    "evaluated_checkpoint": 9000,
    "evaluated_by": "last",
  }
  (tmp_path / "drift").mkdir(exist_ok=True)
  (tmp_path / "report.json").write_text(json.dumps(train))
  (tmp_path / "drift" / "report.json").write_text(json.dumps(drift))
  return str(tmp_path), drift


def _text(e, digits):
  return f"{e['value']:.{digits}f} [{e['lo']:.{digits}f}, {e['hi']:.{digits}f}]"


def test_every_figure_of_the_section_is_the_reports_own_in_its_place(tmp_path):
  """Each row of the table holds its own signal's Spearman, MAE and within-episode Spearman
  (the TD row not the PRM's); the first paragraph the episodes (train + validation), K, the
  steps, the held-out episodes and steps and the reference's K; the closing paragraph the
  noise ceiling, the share of it the model reaches, K*, K* / K, the coverage and the
  contrasts."""
  run, drift = _reports(tmp_path)
  rendered = readme_results.render(run, "runs/demo")
  rows = {line.split(" | ")[0][2:]: line for line in rendered.splitlines() if line[:2] == "| "}
  for (signal, name), key in zip(readme_results.ROWS, SIGNALS, strict=True):
    m, bold = drift["headline"][key], key == "model (point)"
    spearman, mae = _text(m["spearman"], 3), _text(m["mae"], 4)
    if bold:
      spearman, mae = (re.sub(r"^(\S+)", r"**\1**", t) for t in (spearman, mae))
    want = f"| {name.format(k=K)} | {spearman} | {mae} | {_text(m['within_spearman'], 3)} |"
    assert rows[name.format(k=K)] == want, signal
  flat = " ".join(rendered.split())
  assert flat.startswith(
    "16,384 `reasoning` episodes labeled at K=64, the credit model trained for 9,000 steps "
    "(cosine decay to the last step, the model scored), then every signal scored on 512 "
    "held-out test episodes (4,420 steps) against a reference credit (the same trajectories "
    "relabeled at K=1,024 with independent keys). 95% bootstrap CIs over episodes; from "
    "`runs/demo/drift/report.json`:"
  )
  model = drift["headline"]["model (point)"]["spearman"]["value"]  # 0.11: 12% of 0.9
  assert f"reaches {model / 0.9:.0%} of what" in flat and "reaches 12% of what" in flat
  assert flat.endswith(
    "The reference's own noise caps any signal near Spearman **0.900** (two independent "
    "passes agree at 0.810), so the model reaches 12% of what an observer of the trace "
    "could. By squared error it is worth **K = 151.3 [126.4, 176.4]** rollouts per step, 2.4 "
    "times its labels' 64, and its 95% intervals cover 0.955 [0.945, 0.962] of the "
    "reference. Decorative steps (verify, restate) minus facts, in standard deviations of "
    "each signal: the reference -0.48, the model -0.49, the learned process reward model "
    "-0.20."
  )


def _page(tmp_path, section):
  page = tmp_path / "README.md"
  page.write_text(f"# A page\n\n<!-- results: runs/demo -->\n{section}\n<!-- /results -->\n")
  return str(page)


def _check(tmp_path, readme_section, **drift_changes):
  """readme_results' exit code checking `readme_section` against reports changed so."""
  run, _ = _reports(tmp_path, **drift_changes)
  return readme_results.main(["--run", run, "--readme", _page(tmp_path, readme_section)])


def test_the_check_passes_the_same_figures_up_to_float_rounding(tmp_path, capsys):
  """A README written from one machine's reports passes against another's that differ by
  float rounding: each value inside the other's interval (0.890 [0.878, 0.898] against
  0.891 [0.880, 0.899], K* 151.3 against 151.1), a figure without an interval by one unit of
  its last digit, a paragraph whose figures' widths moved its line breaks."""
  _, drift = _reports(tmp_path)
  model = drift["headline"]["model (point)"]
  model["spearman"] = {"value": 0.890, "lo": 0.878, "hi": 0.898}
  mine = dict(headline=drift["headline"])
  readme = readme_results.render(_reports(tmp_path, **mine)[0], "runs/demo")
  assert "**0.890** [0.878, 0.898]" in readme and "**K = 151.3 [126.4, 176.4]**" in readme
  assert _check(tmp_path, readme, **mine) == 0
  model["spearman"] = {"value": 0.891, "lo": 0.880, "hi": 0.899}
  check = {"spearman_ceiling": 0.901, "spearman_between_passes": 0.81}
  other = dict(
    headline=drift["headline"],
    equivalent_rollouts={"k": {"value": 151.1, "lo": 126.0, "hi": 176.9}},
    reference={"rollouts": 1024, "check": check},
  )
  assert readme != readme_results.render(_reports(tmp_path, **other)[0], "runs/demo")
  capsys.readouterr()
  assert _check(tmp_path, readme, **other) == 0
  # ... and it says which figures differ and why each still counts as the same
  said = capsys.readouterr().out
  assert "**0.890** [0.878, 0.898] (README) and **0.891** [0.880, 0.899] (reports): each " \
         "inside the other's interval" in said  # fmt: skip
  assert "151.3 [126.4, 176.4] (README) and 151.1 [126.0, 176.9] (reports): each inside" in said
  assert "**0.900** (README) and **0.901** (reports): within float rounding" in said
  assert "[0.945, 0.962] (README)" not in said  # a figure printed alike is not listed
  assert "(3 figures up to rounding or inside their intervals)" in said
  # the closing paragraph rewrapped, as a wider figure would: still the same section
  paragraphs = readme.split("\n\n")
  rewrapped = "\n\n".join([*paragraphs[:-1], " ".join(paragraphs[-1].split())])
  assert rewrapped != readme
  assert _check(tmp_path, rewrapped, **other) == 0
  # the check's own tolerance: one unit of the last digit for a figure without an interval
  assert readme_results.ROUNDING == 1
  FIG = readme_results.FIGURE.fullmatch
  assert readme_results.same_figure(FIG("94%"), FIG("95%")) == readme_results.ROUNDED
  assert not readme_results.same_figure(FIG("94%"), FIG("96%"))
  assert readme_results.same_figure(FIG("-0.49"), FIG("-0.48"))
  assert readme_results.same_figure(FIG("0.5 [n/a, n/a]"), FIG("0.6 [n/a, n/a]"))
  assert not readme_results.same_figure(FIG("0.5 [n/a, n/a]"), FIG("0.7 [n/a, n/a]"))
  assert not readme_results.same_figure(FIG("0.5 [0.4, n/a]"), FIG("0.5 [n/a, n/a]"))
  assert (
    readme_results.same_figure(FIG("**0.7** [0.9, 1.0]"), FIG("**0.7** [0.9, 1.0]"))
    == "the same text"
  )
  assert not readme_results.same_figure(FIG("**0.95**"), FIG("0.95"))
  # each value inside the other's interval, both ways: one inside is not enough
  wide, off = FIG("0.890 [0.880, 0.900]"), FIG("0.905 [0.889, 0.915]")
  assert not readme_results.same_figure(wide, off) and not readme_results.same_figure(off, wide)
  # a figure with an interval is not one without it, whichever the README has
  assert not readme_results.same_figure(FIG("0.5"), FIG("0.5 [0.4, 0.6]"))
  assert not readme_results.same_figure(FIG("0.5 [0.4, 0.6]"), FIG("0.5"))


@pytest.mark.parametrize(
  "old, new",
  [
    ("**0.110** [0.100, 0.120]", "**0.140** [0.130, 0.150]"),  # the model's Spearman
    ("| 0.070 [0.060, 0.080] |", "| 0.095 [0.085, 0.105] |"),  # its within-episode Spearman
    ("0.310 [0.300, 0.320]", "0.510 [0.500, 0.520]"),  # the TD row's Spearman (the PRM's)
    ("0.0323 [0.0313, 0.0333]", "0.0523 [0.0513, 0.0533]"),  # the TD row's MAE (the PRM's)
    ("reaches 12%", "reaches 14%"),  # the share of the ceiling
    ("cover 0.955 [0.945, 0.962]", "cover 0.975 [0.965, 0.982]"),  # coverage
    ("151.3 [126.4, 176.4]", "181.3 [156.4, 206.4]"),  # K*
    ("16,384", "16,385"),  # the labeled episodes
    ("for 9,000 steps", "for 9,001 steps"),
    ("(4,420 steps)", "(4,421 steps)"),
    ("K=1,024", "K=1,000"),
    ("on 512 held-out", "on 500 held-out"),
    ("2.4 times", "2.6 times"),
    ("-0.49,", "-0.52,"),  # the model's contrast
    ("independent keys", "dependent keys"),  # the words too
  ],
)
def test_the_check_fails_a_figure_that_moved(tmp_path, old, new):
  """Each figure the section quotes, moved past its interval (or, without one, by more than
  rounding), fails the check, and so does a changed word."""
  run, _ = _reports(tmp_path)
  readme = readme_results.render(run, "runs/demo")
  assert readme.count(old) == 1, old
  assert _check(tmp_path, readme) == 0
  assert _check(tmp_path, readme.replace(old, new)) == 1


def test_a_line_the_reports_do_not_give_fails(tmp_path):
  run, _ = _reports(tmp_path)
  readme = readme_results.render(run, "runs/demo")
  assert _check(tmp_path, readme + "\n\nA line the reports do not give.") == 1
  assert _check(tmp_path, readme.rsplit("\n\n", 1)[0]) == 1  # the closing paragraph dropped
  # a figure more at a paragraph's end, its words the same
  assert readme.endswith("-0.20.") and _check(tmp_path, readme + "5") == 1
