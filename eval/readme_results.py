"""The README's results section, regenerated from the reports of the command it names.

  python eval/readme_results.py                  # check README.md against runs/demo
  python eval/readme_results.py --write          # rewrite the section from runs/demo
  python eval/readme_results.py --run DIR --readme PAGE   # another run, another page

`make demo` writes RUN/report.json (the training run) and RUN/drift/report.json (`hindsight
eval`). Every figure between the README's markers

  <!-- results: RUN -->  ...  <!-- /results -->

is rendered here from those two files and nothing else: the labels' size and K, the steps
trained and the step scored, the drift table (Spearman, MAE, within-episode Spearman with
their 95% bootstrap intervals), the reference's noise ceiling, the model's equivalent
rollouts K*, its coverage and the decorative-versus-fact contrast. Without `--write` it
checks (`--check`, the default): it prints each figure whose text differs but counts as the
same, and why, and exits 1 with the first figure or word that differs, so a README that no
longer matches its command fails (tests/test_drift_harness.py runs it on the :smoke run).

The check holds the README to the same figures up to float rounding, as the README promises
of another machine, and no further (`same_figure`):

  an estimate  `v [lo, hi]`: each value inside the other's interval (0.890 [0.878, 0.898]
               and 0.891 [0.880, 0.899] agree, 0.905 [0.893, 0.913] does not); with a bound
               n/a (a run too small to bound it), as a figure without an interval
  a count      an integer (episodes, steps, K): exactly
  any other    a figure without an interval (the noise ceiling, "reaches 94%", "2.4 times",
               the contrasts): within ROUNDING units of its last printed digit

and every word between the figures exactly, prose compared with its line breaks ignored (a
figure's width may move a break), the table line by line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap

from hindsight.drift.render import estimate_text

BEGIN = re.compile(r"<!-- results: (?P<run>[^ ]+) -->\n")
END = "<!-- /results -->"
WIDTH = 92  # the README's line width
# How far a figure without an interval may move, in units of its last printed digit: a value
# that moves by float rounding can cross the boundary where its last digit rounds up.
ROUNDING = 1
_NUMBER = r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?"
# A figure: a number (bold in the model's row) or n/a, with its interval where it has one.
FIGURE = re.compile(
  rf"(?P<value>\*\*(?:{_NUMBER}|n/a)\*\*|{_NUMBER}|n/a)"
  rf"(?: \[(?P<lo>{_NUMBER}|n/a), (?P<hi>{_NUMBER}|n/a)\])?"
)
# (who, the drift report's signal) whose decorative-minus-fact contrast the section quotes
CONTRASTS = (
  ("the reference", "reference"),
  ("the model", "model (point)"),
  ("the learned process reward model", "learned PRM"),
)

# (drift report signal, README row name), in the README's order; a signal the report lacks
# (a run without baselines) has no row.
ROWS = (
  ("model (point)", "**credit model** (one forward pass)"),
  ("training labels (MC, K={k})", "its training labels (MC, K={k})"),
  ("TD advantage", "learned value baseline (TD advantage)"),
  ("MC progress (soft)", "MC progress, soft (Math-Shepherd)"),
  ("learned PRM", "learned PRM, P(success \\| history) increments"),
  ("RUDDER (return decomposition)", "RUDDER-style return decomposition"),
  ("MC phi_hard (Math-Shepherd hard)", "MC progress, hard (Math-Shepherd)"),
  ("outcome R", "outcome R at every step"),
)


def _estimate(e: dict, digits: int, bold: bool = False) -> str:
  """`value [lo, hi]` as the drift report writes it (`estimate_text`: n/a for what is
  undefined, e.g. K*'s upper bound), the value bold if asked."""
  text = estimate_text(e, digits)
  if not bold or text == "n/a":
    return text
  value, _, interval = text.partition(" ")
  return f"**{value}** {interval}"


def read_reports(run: str) -> tuple[dict, dict]:
  """(RUN/report.json, RUN/drift/report.json); a one-line error for a missing one."""
  reports = []
  for path in (os.path.join(run, "report.json"), os.path.join(run, "drift", "report.json")):
    if not os.path.isfile(path):
      raise SystemExit(f"readme_results: {path} is missing (run `make demo` first)")
    with open(path) as f:
      reports.append(json.load(f))
  return reports[0], reports[1]


def render(run: str, name: str | None = None) -> str:
  """The section's text (between the markers) from RUN's two reports, which it names as
  `name` (default: RUN)."""
  train, drift = read_reports(run)
  k = int(drift["label_rollouts"])
  episodes = sum(int(n) for n in train["episodes"].values())
  steps, scored = int(train["train"]["steps"]), int(train["evaluated_checkpoint"])
  schedule = (
    f"for {steps:,} steps (cosine decay to the last step, the model scored)"
    if scored == steps
    else f"for {steps:,} steps (scored: step {scored:,}, by {train['evaluated_by']})"
  )
  ref = drift["reference"]
  lines = [
    f"{episodes:,} `{drift['env']}` episodes labeled at K={k}, the credit model trained "
    f"{schedule}, then every signal scored on {drift['episodes']:,} held-out test episodes "
    f"({drift['steps']:,} steps) against a reference credit (the same trajectories relabeled "
    f"at K={ref['rollouts']:,} with independent keys). 95% bootstrap CIs over episodes; from "
    f"`{name or run}/drift/report.json`:",
    "",
    "| signal | Spearman | MAE | within-episode Spearman |",
    "|---|---|---|---|",
  ]
  headline = drift["headline"]
  for signal, name in ROWS:
    signal, name = signal.format(k=k), name.format(k=k)
    if signal not in headline:
      continue
    m, bold = headline[signal], signal == "model (point)"
    lines.append(
      f"| {name} | {_estimate(m['spearman'], 3, bold)} | {_estimate(m['mae'], 4, bold)} | "
      f"{_estimate(m['within_spearman'], 3)} |"
    )
  lines += ["", " ".join(_closing_sentences(drift, k))]
  prose = lambda line: line and not line.startswith("|")  # noqa: E731
  return "\n".join(_wrap(line) if prose(line) else line for line in lines)


def _closing_sentences(drift: dict, k: int) -> list[str]:
  """The paragraph under the table: the noise ceiling, K* and coverage, and the
  decorative-minus-fact contrasts, each where the report has it."""
  model = drift["headline"]["model (point)"]["spearman"]["value"]
  check, e = drift["reference"].get("check") or {}, drift.get("equivalent_rollouts") or {}
  sentences = []
  if "spearman_ceiling" in check:
    ceiling = check["spearman_ceiling"]
    sentences.append(
      f"The reference's own noise caps any signal near Spearman **{ceiling:.3f}** (two "
      f"independent passes agree at {check['spearman_between_passes']:.3f}), so the model "
      f"reaches {model / ceiling:.0%} of what an observer of the trace could."
    )
  if e and not e.get("undefined") and e["k"].get("value") is not None:
    coverage = drift["calibration"]["coverage"]["95%"]
    sentences.append(
      f"By squared error it is worth **K = {_estimate(e['k'], 1)}** rollouts per step, "
      f"{e['k']['value'] / k:.1f} times its labels' {k}, and its 95% intervals cover "
      f"{_estimate(coverage, 3)} of the reference."
    )
  elif e:
    sentences.append(f"Its equivalent rollouts K* are undefined here ({e.get('undefined')}).")
  contrast = drift.get("per_tag", {}).get("contrast", {})
  named = [(who, contrast[key]["value"]) for who, key in CONTRASTS if key in contrast]
  if named:
    sentences.append(
      "Decorative steps (verify, restate) minus facts, in standard deviations of each "
      "signal: " + ", ".join(f"{who} {value:+.2f}" for who, value in named) + "."
    )
  return sentences


def _wrap(paragraph: str) -> str:
  return textwrap.fill(paragraph, WIDTH, break_long_words=False, break_on_hyphens=False)


def section(readme: str) -> tuple[str, int, int]:
  """(the run the README's section names, start, end of its text) in `readme`."""
  begin = BEGIN.search(readme)
  end = readme.find(END, begin.end()) if begin else -1
  if begin is None or end < 0:
    raise SystemExit(f"readme_results: no '<!-- results: RUN -->' ... '{END}' section")
  return begin["run"], begin.end(), end


def _number(text: str) -> float:
  return float(text.replace(",", "").rstrip("%"))


def _unit(text: str) -> float:
  """One unit of `text`'s last printed digit."""
  _, dot, decimals = text.rstrip("%").partition(".")
  return 10.0 ** -len(decimals) if dot else 1.0


# Why two figures count as the same (`same_figure`), as `check` reports it.
EXACT = "the same text"
ROUNDED = "within float rounding"
INSIDE = "each inside the other's interval"


def same_figure(have: re.Match, want: re.Match) -> str | None:
  """Why two figures (`FIGURE` matches) are the same up to float rounding (module docstring):
  EXACT, ROUNDED or INSIDE; None when they are not."""
  if have[0] == want[0]:  # a point estimate may lie outside its own bootstrap interval
    return EXACT
  a, b = have["value"], want["value"]
  if a.startswith("**") != b.startswith("**"):
    return None
  a, b = a.strip("*"), b.strip("*")
  if "n/a" in (a, b) or (have["lo"] is None) != (want["lo"] is None):
    return None
  if have["lo"] is None:
    if "." not in a + b and "%" not in a + b:  # a count
      return EXACT if a == b else None
    near = abs(_number(a) - _number(b)) <= ROUNDING * max(_unit(a), _unit(b)) * (1 + 1e-9)
    return ROUNDED if near else None
  bounds = (have["lo"], have["hi"], want["lo"], want["hi"])
  if "n/a" in bounds:  # no interval to hold it to: every defined number to rounding
    pairs = [(a, b), (have["lo"], want["lo"]), (have["hi"], want["hi"])]
    near = all(
      (x == "n/a") == (y == "n/a")
      and (x == "n/a" or abs(_number(x) - _number(y)) <= ROUNDING * _unit(x) * (1 + 1e-9))
      for x, y in pairs
    )
    return ROUNDED if near else None
  lo_a, hi_a, lo_b, hi_b = map(_number, bounds)
  return INSIDE if lo_b <= _number(a) <= hi_b and lo_a <= _number(b) <= hi_a else None


def _pieces(block: str) -> list:
  """A block's words (str, whitespace collapsed) and figures (`FIGURE` matches), in order."""
  text = " ".join(block.split())
  out, at = [], 0
  for m in FIGURE.finditer(text):
    out += [text[at : m.start()], m]
    at = m.end()
  return [*out, text[at:]]


def _blocks(text: str) -> list[str]:
  """The section's table lines one by one and its prose paragraphs whole."""
  blocks = []
  for paragraph in text.strip("\n").split("\n\n"):
    lines = paragraph.splitlines()
    blocks += lines if lines and lines[0].startswith("|") else [paragraph]
  return blocks


def check(readme: str, rendered: str) -> tuple[str | None, list[str]]:
  """(None when the README's section is `rendered` up to float rounding (module docstring),
  else the first figure or words that differ, and where; one line for each figure whose
  text differs but counts as the same, saying why)."""
  _, start, end = section(readme)
  have, want = _blocks(readme[start:end]), _blocks(rendered)
  accepted = []
  for a, b in zip(have, want, strict=False):
    pa, pb, before = _pieces(a), _pieces(b), ""
    for x, y in zip(pa, pb, strict=False):
      figures = isinstance(x, re.Match) and isinstance(y, re.Match)
      why = same_figure(x, y) if figures else (EXACT if x == y else None)
      if why is None:
        x, y = (v[0] if isinstance(v, re.Match) else repr(v) for v in (x, y))
        problem = f"after '...{before[-60:]}' the section has\n  {x}\nbut the reports give\n  {y}"
        return problem, accepted
      if why != EXACT:
        accepted.append(f"{x[0]} (README) and {y[0]} (reports): {why}")
      before += x if isinstance(x, str) else x[0]
    if len(pa) != len(pb):
      return (
        f"the section's\n  {' '.join(a.split())}\nhas other figures than the reports'",
        accepted,
      )
  if len(have) != len(want):
    return (
      f"the section has {len(have)} lines and paragraphs, the reports give {len(want)}",
      accepted,
    )
  return None, accepted


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--run", help="the run's directory (default: the one the section names)")
  parser.add_argument("--readme", default="README.md", help="the page to check")
  how = parser.add_mutually_exclusive_group()
  how.add_argument("--check", action="store_true", help="check the section (the default)")
  how.add_argument("--write", action="store_true", help="rewrite the section instead")
  args = parser.parse_args(argv)
  with open(args.readme) as f:
    readme = f.read()
  named, start, end = section(readme)
  rendered = render(args.run or named, named)
  if args.write:
    with open(args.readme, "w") as f:
      f.write(readme[:start] + rendered + "\n" + readme[end:])
    print(f"{args.readme}: results section written from {args.run or named}")
    return 0
  problem, accepted = check(readme, rendered)
  for line in accepted:
    print(f"  {line}")
  if problem is not None:
    print(f"readme_results: {args.readme} does not match its reports: {problem}", file=sys.stderr)
    return 1
  how = f" ({len(accepted)} figures up to rounding or inside their intervals)" if accepted else ""
  print(f"{args.readme}: the results section matches {args.run or named}'s reports{how}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
