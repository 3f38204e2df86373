"""`lm.rl.models.OnlineHead`'s ring buffer: after any sequence of `add`s it holds the last
`capacity` labels ever added, label j in row j mod capacity, whatever a scatter does with two
writes to one row."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.lm.rl.models import CreditHead, OnlineHead

WIDTH = 3


def _head() -> CreditHead:
  """A head whose parameters `add` never reads: only its input width matters here."""
  return CreditHead({"w": np.zeros(1)}, {"mean": np.zeros(WIDTH), "std": np.ones(WIDTH)})


def _labels(start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Labels start .. start + n - 1: y = j, every input feature j."""
  y = np.arange(start, start + n, dtype=np.float32)
  return np.repeat(y[:, None], WIDTH, 1), y


def _want(total: int, capacity: int) -> np.ndarray:
  """The buffer's y after labels 0 .. total - 1: the last `capacity`, label j in row j mod
  capacity (rows never written 0)."""
  want = np.zeros(capacity, np.float32)
  for j in range(max(0, total - capacity), total):
    want[j % capacity] = j
  return want


class _FirstWins:
  """A buffer whose scatter keeps the first of two writes to one row (XLA leaves the choice
  unspecified; a GPU may keep either): `a.at[rows].set(values)` as `jax.Array`'s."""

  def __init__(self, a):
    self.a = np.asarray(a)

  @property
  def at(self):
    return self

  def __getitem__(self, rows):
    return _Set(self.a, np.asarray(rows))


class _Set:
  def __init__(self, a, rows):
    self.a, self.rows = a, rows

  def set(self, values):
    out, values = self.a.copy(), np.asarray(values)
    for i in reversed(range(len(self.rows))):  # the first write lands last
      out[self.rows[i]] = values[i]
    return _FirstWins(out)


@pytest.mark.parametrize("sizes", [(11,), (4, 9), (2, 3, 17, 1), (5, 5, 5), (10,), (3, 20, 2)])
def test_the_buffer_holds_the_last_labels_in_order(sizes):
  """Batches of labels, some longer than the buffer (capacity 5): the count is every label
  added, and the buffer the last five, each input with its own label, in its ring row."""
  capacity, added = 5, 0
  ring = OnlineHead(_head(), capacity)
  for n in sizes:
    ring.add(*_labels(added, n))
    added += n
    assert int(ring.state["count"]) == added
    y, x = np.asarray(ring.state["y"]), np.asarray(ring.state["x"])
    np.testing.assert_array_equal(y, _want(added, capacity))
    np.testing.assert_array_equal(x, np.repeat(y[:, None], WIDTH, 1))
  assert ring.state["y"].dtype == jnp.float32 and ring.state["x"].shape == (capacity, WIDTH)


@pytest.mark.parametrize("sizes", [(12,), (3, 8), (2, 13, 1)])
def test_a_batch_longer_than_the_buffer_writes_no_row_twice(sizes):
  """A scatter that keeps the first of two writes to one row: the buffer still holds the last
  labels, since `add` writes each row at most once (writing all twelve labels of a batch into
  five rows leaves labels 5 .. 9 in them, not 7 .. 11)."""
  capacity, added = 5, 0
  state = {"params": {"w": jnp.zeros(1)}, "x": _FirstWins(np.zeros((capacity, WIDTH))),
           "y": _FirstWins(np.zeros(capacity)), "count": jnp.zeros((), jnp.int32),
           "lam": jnp.zeros((), jnp.float32)}  # fmt: skip
  ring = OnlineHead(_head(), capacity, state)
  for n in sizes:
    ring.add(*_labels(added, n))
    added += n
    np.testing.assert_array_equal(ring.state["y"].a, _want(added, capacity))
    np.testing.assert_array_equal(ring.state["x"].a[:, 0], _want(added, capacity))
  assert int(ring.state["count"]) == added
