"""The error budget spent over a run's repeated tests (`metrics.sequential.spent_alpha`) and
the budgets the training alarm (`lm.rl.alarm.alarm_test`) and the drift tests
(`rl.refresh`) hand their confidence sequences, read at every look of a run."""

from __future__ import annotations

import numpy as np
import pytest

from hindsight.metrics import sequential
from hindsight.metrics.sequential import spent_alpha

ALPHA = 0.05


def test_spent_alpha_is_its_closed_form_and_sums_to_alpha():
  """The i-th test's share is alpha / ((i + 1)(i + 2)): the first n sum to alpha n / (n + 1),
  rising at every look, below alpha at every finite n and reaching it in the limit."""
  shares = np.array([spent_alpha(ALPHA, i) for i in range(1000)])
  i = np.arange(1000)
  np.testing.assert_allclose(shares, ALPHA / ((i + 1) * (i + 2)), rtol=1e-12)
  total = np.cumsum(shares)
  np.testing.assert_allclose(total, ALPHA * (i + 1) / (i + 2), rtol=1e-12)
  assert np.all(np.diff(total) > 0) and np.all(total < ALPHA)
  assert spent_alpha(ALPHA, 0) == pytest.approx(ALPHA / 2)
  assert total[-1] == pytest.approx(ALPHA, rel=1.1e-3)  # alpha n / (n + 1) at n = 1000


def _recording(monkeypatch, module):
  """Every alpha `module`'s calls of `slice_sequences` pass, in order (the real function
  still runs)."""
  seen = []

  def record(*args, **kwargs):
    seen.append(kwargs["alpha"] if "alpha" in kwargs else args[4])
    return sequential.slice_sequences(*args, **kwargs)

  monkeypatch.setattr(module, "slice_sequences", record)
  return seen


def test_the_training_alarm_spends_its_budget_over_the_run(monkeypatch):
  """Over a run of 40 updates (baseline B = 3, window W = 2), the baseline's sequences get
  alpha / 2 at every test and the i-th window test alpha / 2 / ((i + 1)(i + 2)): the windows'
  spending after n tests is alpha / 2 n / (n + 1), rising at every look, so the run's total
  stays below alpha and reaches it only in the limit. A window budget of alpha / 2 at every
  test would spend alpha / 2 per look."""
  from hindsight.lm.rl import alarm

  seen = _recording(monkeypatch, alarm)
  rng = np.random.default_rng(0)
  names = ("a", "b")
  records = [
    {"gap": rng.normal(0, 0.1, 24).tolist(), "tag": [names[j % 2] for j in range(24)]}
    for _ in range(40)
  ]
  baseline, window = 3, 2
  tested = []
  for u in range(len(records)):
    if alarm.alarm_test(records[: u + 1], names, baseline, window, 0.5, ALPHA) is not None:
      tested.append(u)
  assert tested == list(range(baseline + window - 1, 40))
  before, now = np.array(seen[0::2]), np.array(seen[1::2])  # each test: baseline, then window
  n = len(tested)
  assert len(before) == len(now) == n
  np.testing.assert_allclose(before, ALPHA / 2)
  i = np.arange(n)
  np.testing.assert_allclose(now, ALPHA / 2 / ((i + 1) * (i + 2)), rtol=1e-12)
  spent = ALPHA / 2 + np.cumsum(now)
  np.testing.assert_allclose(spent, ALPHA / 2 + ALPHA / 2 * (i + 1) / (i + 2), rtol=1e-12)
  assert np.all(np.diff(spent) > 0) and np.all(spent < ALPHA)
  assert spent[-1] == pytest.approx(ALPHA * (1 - 1 / (2 * (n + 1))))


def test_the_drift_tests_spend_their_budget_over_the_points(monkeypatch):
  """`rl.refresh`: the gap test's i-th read gets alpha / ((i + 1)(i + 2)) (alpha n / (n + 1)
  after n reads); the shift test's update-0 sequences alpha / 2 and its later points' the
  other half spent the same way."""
  from hindsight.rl import refresh

  seen = _recording(monkeypatch, refresh)
  rng = np.random.default_rng(1)
  gaps, slices = rng.normal(0, 0.1, 40), np.arange(40) % 2
  for index in range(12):
    refresh.gap_test(gaps, slices, ("a", "b"), None, 0.5, ALPHA, index)
  i = np.arange(12)
  np.testing.assert_allclose(seen, ALPHA / ((i + 1) * (i + 2)), rtol=1e-12)
  np.testing.assert_allclose(np.cumsum(seen), ALPHA * (i + 1) / (i + 2), rtol=1e-12)
  shift = np.array([refresh.shift_alpha(ALPHA, k) for k in range(13)])
  assert shift[0] == ALPHA / 2
  np.testing.assert_allclose(shift[1:], ALPHA / 2 / ((i + 1) * (i + 2)), rtol=1e-12)
  np.testing.assert_allclose(np.cumsum(shift)[1:], ALPHA / 2 + ALPHA / 2 * (i + 1) / (i + 2))
  assert np.all(np.cumsum(shift) < ALPHA)


def test_each_drift_point_hands_its_tests_their_share(monkeypatch):
  """`rl.measure.drift_tests` at the index-th point of a run: its gap test's sequences get
  alpha / ((i + 1)(i + 2)), and the per-tag sequences the shift test holds against update 0's
  `shift_alpha` (alpha / 2 at update 0, the other half spent over the later points)."""
  from types import SimpleNamespace

  from hindsight.rl import measure, refresh

  gap_alphas, tag_alphas = _recording(monkeypatch, refresh), _recording(monkeypatch, measure)
  rng = np.random.default_rng(2)
  pred, ref, slices = rng.normal(0, 1, 60), rng.normal(0, 1, 60), np.arange(60) % 2
  probe, before = SimpleNamespace(warns=True, consequence="refresh"), None
  for index in range(8):
    out, _ = measure.drift_tests(pred, ref, slices, ("a", "b"), (0.5, ALPHA, "asymptotic"),
                                 index, before, probe)  # fmt: skip
    before = before or out["tags"]
    assert ("shift" in out) == (index > 0)
  i = np.arange(8)
  np.testing.assert_allclose(gap_alphas, ALPHA / ((i + 1) * (i + 2)), rtol=1e-12)
  np.testing.assert_allclose(tag_alphas, [ALPHA / 2, *(ALPHA / 2 / (i[1:] * (i[1:] + 1)))])
