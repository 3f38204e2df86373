"""Behaviour policies for the adapter tests (loaded with --policy adapter_policies:NAME)."""


def mostly_right(observation, rng):
  """CartPole: push right 80% of the time."""
  del observation
  return int(rng.random() < 0.8)
