"""Per-step credit in verl's and Tunix's advantage registries (`hindsight.integrations`):
against hand-built tensors in the frameworks' shapes (NumPy, as verl is absent here), and
through Tunix's own registry."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hindsight.integrations import (
  TINY,
  credit_advantages,
  step_end_rewards,
  step_token_ends,
  tunix_estimator,
  verl_estimator,
)

# Four responses of 9 tokens (the last one padded after 7): steps and their credit, each
# step's tokens given by hand; response 1 has a step of credit exactly 0.
STEPS = [  # (tokens of each step, credit of each step)
  ([range(0, 3), range(3, 9)], [0.25, -0.5]),
  ([range(0, 2), range(2, 5), range(5, 9)], [0.1, 0.0, 0.3]),
  ([range(0, 9)], [0.7]),
  ([range(0, 4), range(4, 7)], [-0.2, 0.4]),
]
L = 9


def _batch():
  """(token_level_rewards [4, 9] step-end rows, response_mask, the advantage every token
  should get: its own step's credit)."""
  rows, mask, want = [], np.zeros((4, L), bool), np.zeros((4, L))
  for b, (spans, credit) in enumerate(STEPS):
    rows.append(step_end_rewards(credit, [s[-1] for s in spans], L))
    for span, c in zip(spans, credit, strict=True):
      mask[b, list(span)] = True
      want[b, list(span)] = c
  return np.stack(rows), mask, want


def test_step_token_ends_reads_a_tokenizers_offsets():
  # steps "Ab. " (4 chars), "Cd e. " (6), "F." (2); tokens ending at chars 2, 4, 7, 10, 12
  assert step_token_ends([4, 6, 2], [2, 4, 7, 10, 12]) == [1, 3, 4]
  # a step no token ends in shares the previous end
  assert step_token_ends([4, 1, 6], [2, 4, 7, 11]) == [1, 1, 3]


def test_the_verl_estimator_puts_each_steps_credit_on_exactly_its_tokens():
  """verl's call: (token_level_rewards, response_mask, index, config) -> (advantages,
  returns), each token the credit of its own step: the zero-credit step's tokens 0, not the
  next step's; padding 0. Reading a token's step from the previous end instead fails."""
  rewards, mask, want = _batch()
  assert rewards[1, 4] == np.float32(TINY)  # the zero step's end is marked
  index = np.array(["a", "a", "b", "b"], object)
  adv, returns = verl_estimator(token_level_rewards=rewards, response_mask=mask, index=index,
                                config=None)  # fmt: skip
  np.testing.assert_array_equal(adv, want.astype(np.float32))
  np.testing.assert_array_equal(returns, adv)
  assert adv.dtype == np.float32 and adv.shape == (4, L)


def test_the_outcome_source_gets_its_groups_outcome_baseline():
  """source "outcome": R = the row's sum (verl's outcome on the last token), A = R - the mean
  R of the samples sharing the prompt (`index`, here interleaved: a, b, a, b), on every
  response token; divided by the group's std (ddof 1) under verl's norm_adv_by_std_in_grpo.
  Baselining over the whole batch, or over consecutive pairs, fails."""
  from types import SimpleNamespace

  _, mask, _ = _batch()
  R = np.array([1.0, 0.0, 0.0, 1.0])
  rewards = np.zeros((4, L))
  rewards[np.arange(4), [8, 8, 8, 6]] = R  # the outcome on each response's last token
  index = np.array(["a", "b", "a", "b"], object)
  adv, _ = verl_estimator(rewards, mask, index, None, source="outcome")
  want = np.array([0.5, -0.5, -0.5, 0.5])  # R - mean of its group: {0, 2} and {1, 3}
  np.testing.assert_allclose(adv, np.where(mask, want[:, None], 0.0), atol=1e-7)
  grpo = SimpleNamespace(norm_adv_by_std_in_grpo=True)
  adv, _ = verl_estimator(rewards, mask, index, grpo, source="outcome")
  std = np.std([1.0, 0.0], ddof=1)
  np.testing.assert_allclose(adv, np.where(mask, want[:, None] / (std + 1e-6), 0.0), rtol=1e-6)
  with pytest.raises(ValueError, match="source must be one of"):
    credit_advantages(rewards, mask, index, source="vibes")
  # a group of one keeps its R (verl's GRPO: mean 0, std 1 there)
  alone, _ = verl_estimator(rewards, mask, np.array(["a", "b", "a", "c"], object), None,
                            source="outcome")  # fmt: skip
  assert alone[3, 0] == pytest.approx(1.0) and alone[1, 0] == pytest.approx(0.0)


def test_masked_tokens_inside_a_response_get_nothing_and_split_no_step():
  """A response with tokens off the mask between its steps (a tool's output): they get 0,
  and the step after them still gets its own credit; a step wholly off the mask (its end
  marked on a masked token right after the previous step's end) takes no token's credit."""
  rewards = np.zeros((1, 9), np.float32)
  rewards[0, 2], rewards[0, 4], rewards[0, 8] = 0.5, 9.0, -0.25  # 9.0 sits on a masked token
  mask = np.ones((1, 9), bool)
  mask[0, 3:5] = False
  adv = credit_advantages(rewards, mask)
  np.testing.assert_array_equal(adv[0], [0.5, 0.5, 0.5, 0, 0, -0.25, -0.25, -0.25, -0.25])


def _agent_batch():
  """Two agent responses of 16 tokens in the layout of verl's tool agent loop: each step is a
  call (response_mask 1) and the tool's result (0), the last step a final answer, padding 0;
  each step's credit marked on its last token, inside its result, as `step_token_ends` puts
  it on the text of call and result. Returns (token_level_rewards, response_mask, the
  advantage each token should get: its step's credit on its call's tokens, 0 elsewhere)."""
  turns = [  # per response: (call tokens, result tokens, credit) of each step
    [(3, 3, 0.001), (2, 2, 0.048), (2, 1, -0.009), (2, 0, 0.010)],
    [(4, 2, 0.3), (2, 3, 0.0), (3, 0, -0.2)],  # a step of credit exactly 0
  ]
  rewards, mask, want = np.zeros((2, 16), np.float32), np.zeros((2, 16), bool), np.zeros((2, 16))
  for b, steps in enumerate(turns):
    at, ends = 0, []
    for call, result, credit in steps:
      mask[b, at : at + call] = True
      want[b, at : at + call] = credit
      at += call + result
      ends.append(at - 1)
    rewards[b] = step_end_rewards([c for *_, c in steps], ends, 16)
  assert not mask[0, 5] and rewards[0, 5] == np.float32(0.001)  # marked off the mask
  return rewards, mask, want


def test_an_agent_steps_credit_reaches_its_call_through_verls_multi_turn_mask():
  """verl's agent loop masks tool results out of response_mask, and an agent step ends inside
  its result: each step's credit goes to its own call's tokens (the zero-credit step's to 0,
  not the next step's), none to the result's tokens. Reading only marks on the mask gives
  every call the final answer's credit. Tunix's agentic mask has the same layout."""
  import jax.numpy as jnp

  rewards, mask, want = _agent_batch()
  adv, returns = verl_estimator(rewards, mask, np.array(["a", "a"], object), None)
  np.testing.assert_array_equal(adv, want.astype(np.float32))
  np.testing.assert_array_equal(returns, adv)
  assert adv[0, 0] == np.float32(0.001) and adv[1, 6] == 0 and adv[1, 11] == np.float32(-0.2)
  per_token = tunix_estimator(rewards=jnp.ones(2), num_generations=2,
                              step_rewards=jnp.asarray(rewards), completion_mask=mask)  # fmt: skip
  np.testing.assert_array_equal(np.asarray(per_token), want.astype(np.float32))


def test_the_outcome_source_counts_an_outcome_on_a_masked_last_token():
  """verl's agent loop puts the outcome on the response's last token, which is a masked
  tool or user turn when the episode ends on one, and verl's GRPO sums the whole row: so does
  the outcome source. Summing only the masked-in rewards drops that outcome."""
  mask = np.zeros((3, 8), bool)
  mask[:, [0, 1, 4, 5]] = True  # call, result 2..3, call, result 6..7
  rewards = np.zeros((3, 8), np.float32)
  rewards[0, 5] = 1.0  # ends on its call (on the mask)
  rewards[1, 7] = 0.5  # ends on a tool result (off the mask), where its outcome sits
  adv, _ = verl_estimator(rewards, mask, np.array(["a", "a", "a"], object), None,
                          source="outcome")  # fmt: skip
  want = np.array([0.5, 0.0, -0.5])  # R = 1, 0.5, 0 less their mean 0.5
  np.testing.assert_allclose(adv, np.where(mask, want[:, None], 0.0), atol=1e-7)


def test_the_tunix_estimator_through_tunixs_own_registry():
  """Registered in Tunix's registry and fetched by name as `GRPOLearner` fetches its
  estimator: called as the learner calls it (rewards, num_generations), it is Tunix's own
  GRPO advantages (the outcome source's group baseline); given the completions' step-end
  rewards, the per-token credit [B, T] Tunix's GRPO loss takes, each token its step's."""
  import jax.numpy as jnp
  from tunix.rl import algo_core, function_registry

  name = "hindsight_credit_test"
  if name not in function_registry.default_registry.list_functions("advantage_estimator"):
    function_registry.register_advantage_estimator(name)(tunix_estimator)
  estimator = function_registry.get_advantage_estimator(name)
  rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
  got = estimator(rewards=rewards, num_generations=4)
  np.testing.assert_allclose(got, algo_core.compute_advantages(rewards, 4), rtol=1e-6)
  step_rewards, mask, want = _batch()
  per_token = estimator(rewards=rewards[:4], num_generations=2,
                        step_rewards=jnp.asarray(step_rewards), completion_mask=mask)  # fmt: skip
  assert isinstance(per_token, type(jnp.zeros(1))) and per_token.shape == (4, L)
  np.testing.assert_array_equal(np.asarray(per_token), want.astype(np.float32))
  # the outcome source with the step rewards at hand: GRPO's advantage of `rewards` on every
  # completion token (not the step credit's sum)
  outcome = estimator(rewards=rewards[:4], num_generations=2, source="outcome",
                      step_rewards=jnp.asarray(step_rewards), completion_mask=mask)  # fmt: skip
  grpo = algo_core.compute_advantages(rewards[:4], 2)
  np.testing.assert_allclose(np.asarray(outcome), np.where(mask, grpo[:, None], 0.0), rtol=1e-6)


def test_importing_the_integrations_imports_no_framework():
  code = ("import sys, hindsight.integrations; "
          "print(sorted(m for m in ('torch', 'verl', 'tunix') if m in sys.modules))")  # fmt: skip
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout
