"""Host-side draws against the JAX draws they stand in for."""

import jax
import numpy as np
import pytest

from hindsight.draws import distinct_integers


@pytest.mark.parametrize(
  "n,count", [(10**6, 128), (10**6, 1), (5000, 5000), (7, 3), (1, 1), (0, 0)]
)
def test_distinct_integers_are_jaxs_draw_without_replacement(n, count):
  # 10^6: two rounds of sorts with ~100 tied 32-bit keys each, so the tie order is tested.
  for seed in range(3):
    key = jax.random.fold_in(jax.random.key(seed), n)
    want = np.asarray(jax.random.choice(key, n, (count,), replace=False))
    got = distinct_integers(key, n, count)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()
  assert len(set(got.tolist())) == count


def test_a_draw_larger_than_its_population_is_refused():
  with pytest.raises(ValueError, match="count 4, n 3"):
    distinct_integers(jax.random.key(0), 3, 4)
