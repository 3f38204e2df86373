"""Coalition math against textbook games, brute force over orders, and the Shapley axioms."""

import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_one_line_error, run_cli

from hindsight.cli import main
from hindsight.credit import (
  coma_advantage,
  dividends,
  interaction,
  pair_terms,
  shapley,
  shapley_sampled,
)
from hindsight.credit.coalition import memberships_to_index
from hindsight.errors import HindsightError


def game(n, fn):
  """values [2^n] from fn(frozenset of members)."""
  return np.array(
    [fn(frozenset(i for i in range(n) if m >> i & 1)) for m in range(1 << n)], np.float32
  )


def brute_force_shapley(values, n):
  """Average marginal contribution over all n! orders."""
  phi = np.zeros(n)
  for order in itertools.permutations(range(n)):
    mask = 0
    for i in order:
      phi[i] += values[mask | 1 << i] - values[mask]
      mask |= 1 << i
  return phi / math.factorial(n)


def test_textbook_games():
  # Glove game: agent 0 holds a left glove, 1 and 2 right ones; a pair is worth 1.
  glove = game(3, lambda s: float(0 in s and (1 in s or 2 in s)))
  np.testing.assert_allclose(shapley(glove), [2 / 3, 1 / 6, 1 / 6], atol=1e-6)
  # Airport game: a runway as long as the longest plane needs: cost = max need.
  airport = game(3, lambda s: max([1.0, 2.0, 3.0][i] for i in s) if s else 0.0)
  np.testing.assert_allclose(shapley(airport), [1 / 3, 1 / 3 + 1 / 2, 1 / 3 + 1 / 2 + 1], atol=1e-6)
  # Unanimity game on T = {0, 2} of 4 agents: 1 if T is present.
  unanimity = game(4, lambda s: float({0, 2} <= s))
  np.testing.assert_allclose(shapley(unanimity), [0.5, 0, 0.5, 0], atol=1e-6)
  d = np.asarray(dividends(unanimity))
  assert d[0b0101] == pytest.approx(1.0) and np.abs(np.delete(d, 0b0101)).max() < 1e-6
  inter = np.asarray(interaction(unanimity))
  assert inter[0, 2] == pytest.approx(1.0) and inter[0, 1] == pytest.approx(0.0, abs=1e-6)
  terms = np.asarray(pair_terms(unanimity))
  assert terms[0, 2] == 1.0 and terms[2, 0] == 1.0 and terms[0, 1] == 0.0


@pytest.mark.parametrize("n", [2, 3, 5, 6])
def test_exact_matches_brute_force_and_dividends_invert(n):
  rng = np.random.default_rng(n)
  values = rng.normal(size=1 << n).astype(np.float32)
  np.testing.assert_allclose(shapley(values), brute_force_shapley(values, n), atol=1e-5)
  d = np.asarray(dividends(values))
  # Moebius inversion: v(S) = sum of the dividends of S's subsets.
  for m in range(1 << n):
    subsets = [t for t in range(1 << n) if t & m == t]
    assert d[subsets].sum() == pytest.approx(values[m], abs=1e-4)
  # Interaction index from dividends (Grabisch): I_ij = sum_{T >= {i,j}} d(T) / (|T| - 1).
  inter = np.asarray(interaction(values))
  sizes = np.array([bin(t).count("1") for t in range(1 << n)])
  for i, j in itertools.combinations(range(n), 2):
    both = [t for t in range(1 << n) if t >> i & 1 and t >> j & 1]
    expect = sum(d[t] / (sizes[t] - 1) for t in both)
    assert inter[i, j] == pytest.approx(expect, abs=1e-4)
    assert inter[j, i] == pytest.approx(inter[i, j], abs=1e-5)


def test_axioms_on_random_games():
  rng = np.random.default_rng(0)
  for n in range(2, 8):
    v = rng.normal(size=1 << n).astype(np.float32)
    w = rng.normal(size=1 << n).astype(np.float32)
    phi = np.asarray(shapley(v))
    # Efficiency.
    assert phi.sum() == pytest.approx(v[-1] - v[0], abs=1e-4)
    # Additivity.
    np.testing.assert_allclose(shapley(v + w), phi + np.asarray(shapley(w)), atol=1e-4)
    # Null player: agent 0 adds nothing anywhere.
    null = v.copy()
    null[1::2] = null[0::2]
    assert abs(float(shapley(null)[0])) < 1e-5
    # Symmetry: a game that depends on agents 0 and 1 only through "how many of them".
    sym = v.copy()
    for m in range(1 << n):
      if (m & 1) and not (m & 2):
        sym[m] = sym[m ^ 0b11]
    s = np.asarray(shapley(sym))
    assert s[0] == pytest.approx(s[1], abs=1e-5)


def test_vmapped_and_jitted_agree():
  rng = np.random.default_rng(1)
  batch = rng.normal(size=(5, 16)).astype(np.float32)
  batched = jax.jit(jax.vmap(shapley))(batch)
  for b in range(5):
    np.testing.assert_allclose(batched[b], shapley(batch[b]), atol=1e-5)


def test_sampled_intervals_cover_exact_values_at_their_nominal_rate():
  n = 8
  rng = np.random.default_rng(2)
  values = jnp.asarray(rng.normal(size=1 << n) + 3 * rng.random(1 << n), jnp.float32)
  exact = np.asarray(shapley(values))

  def value_fn(members):
    return values[memberships_to_index(members)]

  covered, trials = 0, 0
  keys = jax.random.split(jax.random.key(0), 100)
  for key in keys:
    mean, se = shapley_sampled(value_fn, n, 32, key)
    covered += int(np.sum(np.abs(np.asarray(mean) - exact) < 1.96 * np.asarray(se)))
    trials += n
  rate = covered / trials
  # 800 intervals at 95% nominal; a t-ish small-sample shortfall (16 pairs) is expected.
  assert 0.88 < rate < 0.99, rate
  # Efficiency holds for every sampled estimate exactly (each order telescopes).
  mean, _ = shapley_sampled(value_fn, n, 16, keys[0])
  assert float(mean.sum()) == pytest.approx(float(values[-1] - values[0]), abs=1e-4)
  with pytest.raises(HindsightError, match="even"):
    shapley_sampled(value_fn, n, 7, keys[0])


def test_coma_advantage():
  q = jnp.array([1.0, 3.0, 0.0])
  pi = jnp.array([0.5, 0.25, 0.25])
  assert float(coma_advantage(q, pi, 1)) == pytest.approx(3.0 - 1.25)
  assert float(jnp.sum(pi * jax.vmap(lambda a: coma_advantage(q, pi, a))(jnp.arange(3)))) == (
    pytest.approx(0.0)
  )


def test_coalition_cli(tmp_path, capsys):
  path = tmp_path / "glove.npy"
  np.save(path, game(3, lambda s: float(0 in s and (1 in s or 2 in s))))
  assert main(["coalition", "--values", str(path)]) == 0
  out = json.loads(capsys.readouterr().out)
  np.testing.assert_allclose(out["shapley"], [2 / 3, 1 / 6, 1 / 6], atol=1e-5)
  assert out["dividends"] == {"0,1": 1.0, "0,2": 1.0, "0,1,2": -1.0}
  assert out["interaction"][1][2] == pytest.approx(-0.5)
  bad = tmp_path / "bad.npy"
  np.save(bad, np.ones(6))
  cases = [(np.ones(6), "length 2^n"), (np.array([0.0, np.nan]), "not finite")]
  for values, fragment in cases:
    np.save(bad, values)
    assert main(["coalition", "--values", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
  # The real command, end to end: a missing file is one line and exit 2.
  assert_one_line_error(run_cli("coalition", "--values", tmp_path / "none.npy"), "none.npy")
