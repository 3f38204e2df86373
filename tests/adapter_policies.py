"""Behaviour policies for the adapter tests (loaded with --policy adapter_policies:NAME)."""


def mostly_right(observation, rng):
  """CartPole: push right 80% of the time."""
  del observation
  return int(rng.random() < 0.8)


# gymnax policies (JAX functions: --policy adapter_policies:NAME with --env gymnax:ID).


def umbrella_logits(obs, key):
  """UmbrellaChain: logits that take the umbrella (action 1) with probability 0.88."""
  import jax.numpy as jnp

  del obs, key
  return jnp.array([0.0, 2.0])


params = {"p_take": 0.9}


def umbrella_probs(params, obs, key):
  """UmbrellaChain: probabilities from params (action 1 with probability p_take)."""
  import jax.numpy as jnp

  del obs, key
  return jnp.array([1.0 - params["p_take"], params["p_take"]])
