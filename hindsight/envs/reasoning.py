"""`reasoning`: a synthetic agent trace where "looks good" and "did work" come apart by design.

An episode is one task. A latent *competence* c ~ U(0, 1) is drawn at reset, kept in the
state and never shown in the observations. Actions (their tags in brackets):

  0 restate           [restate]           decorative: changes nothing (the null action)
  1 verify            [verify]            decorative: a check that checks nothing
  2 search            [search_unused]     decorative: its result is never read
  3-5 fact_i          [fact]              load-bearing: gathers fact i; the answer needs all 3
  6 write             [write]             a tool call with a side effect: writes the draft
                                          into the state, once, for good; correct only if
                                          all facts are held at that moment
  7 hypothesis        [wrong_hypothesis]  harmful but recoverable: a wrong hypothesis that
                                          lowers the chance of success ...
  8 correct           [correction]        ... unless a later correction repairs it
  9 answer            [answer]            ends the episode; reward 1 with probability
                                          0.9 (correct draft), 0.3 (correct draft under a
                                          wrong hypothesis), 0.05 (anything else)

Facts held before the draft is written are forgotten with probability 0.05 per step each
(context overflow), and the behaviour policy re-gathers missing facts: so a fact step is
partly redundant under the `policy` replacement (the policy would have fetched it later)
but not under `policy_no_repeat` (docs/design.md, section 1), which forbids the continuation that
content class. The horizon (20 steps) makes wasted steps cost something near the end.

The behaviour policy (`ReasoningPolicy`) reads the latent: a competent agent gathers facts
and writes at the right time, makes fewer wrong hypotheses and corrects them more, *and*
restates, verifies and searches more. So decorative steps co-occur with success without
causing it: a progress model that sees only the history learns to like them, while the
interventional credit of those steps, with the latent held fixed, is about zero.

Which tags land where, measured (`hindsight label --env reasoning --episodes 512
--rollouts 64 --seed 0 --replacement R`, then `hindsight summary`; mean credit per step of
the tag, +- its standard error over steps):

  tag               R = policy          R = policy_no_repeat
  fact               0.042 +- 0.001      0.711 +- 0.005   load-bearing; under `policy` mostly
                                                          redundant (the policy re-fetches)
  write              0.036 +- 0.002      0.875 +- 0.003   load-bearing once all facts are held
    (too early)     -0.603 +- 0.012      0.034 +- 0.003   harmful: it locks in a wrong draft
  correction         0.023 +- 0.004      0.582 +- 0.017   load-bearing
  wrong_hypothesis  -0.032 +- 0.004     -0.056 +- 0.005   harmful (recoverable)
  restate           -0.010 +- 0.002     -0.024 +- 0.003   decorative (a step's time, no more)
  verify            -0.006 +- 0.002     -0.016 +- 0.003   decorative
  search_unused     -0.009 +- 0.003     -0.017 +- 0.003   decorative
(Stratified labels, which under `policy` never spend a branch on redrawing a_t; the
`write` rows split the first write by whether all facts were held.)
Per step, most decorative steps' intervals are narrower than the +-0.05 tolerance only with
more rollouts; the per-tag means above are the robust reading.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hindsight import pytree
from hindsight.envs.base import Environment
from hindsight.policies.base import Policy

RESTATE, VERIFY, SEARCH, FACT0, FACT1, FACT2, WRITE, HYPOTHESIS, CORRECT, ANSWER = range(10)
NUM_FACTS = 3
TAG_NAMES = (
  "restate",
  "verify",
  "search_unused",
  "fact",
  "write",
  "wrong_hypothesis",
  "correction",
  "answer",
)
_TAG_OF_ACTION = (0, 1, 2, 3, 3, 3, 4, 5, 6, 7)


@pytree.dataclass
class ReasoningState:
  time: jax.Array  # int32 []
  done: jax.Array  # bool []
  competence: jax.Array  # float32 [] latent, never observed
  facts: jax.Array  # bool [NUM_FACTS] held now
  drafted: jax.Array  # bool [] the draft exists (cannot be unwritten)
  draft_correct: jax.Array  # bool [] all facts were held when it was written
  wrong: jax.Array  # bool [] a wrong hypothesis is active
  decorative: jax.Array  # int32 [] decorative steps taken so far (observable history)
  answered: jax.Array  # bool []
  succeeded: jax.Array  # bool []


@pytree.dataclass
class ReasoningParams:
  forget: jax.Array  # float32 [] per-step probability of losing each held fact
  p_correct: jax.Array  # float32 [] success probability with a correct draft
  p_wrong: jax.Array  # float32 [] ... with a correct draft under a wrong hypothesis
  p_else: jax.Array  # float32 [] ... otherwise


class Reasoning(Environment):
  """See the module docstring."""

  name = "reasoning"
  num_actions = 10
  null_action = RESTATE
  tag_names = TAG_NAMES
  num_step_uniforms = NUM_FACTS + 1  # forgetting per fact, and the answer's outcome
  has_action_classes = True
  success_threshold = 0.5

  def __init__(
    self,
    horizon: int = 20,
    forget: float = 0.05,
    competence=(0.0, 1.0),
    show_competence: bool = False,
  ):
    self.horizon = horizon
    # An oracle for experiments only: the latent c appended to every observation, so a model
    # trained on such labels shows how much of its error is not knowing c (docs/results.md,
    # "What limits the model").
    self.show_competence = show_competence
    self._forget = forget
    # c ~ U(lo, hi): a narrower range shifts the competence mix of the agents (the audit's
    # shifted-policy example: `reasoning:competence_max=0.3` is a weaker agent).
    self._competence = tuple(float(x) for x in competence)

  def default_params(self) -> ReasoningParams:
    return ReasoningParams(
      forget=jnp.float32(self._forget),
      p_correct=jnp.float32(0.9),
      p_wrong=jnp.float32(0.3),
      p_else=jnp.float32(0.05),
    )

  def reset(self, key, params) -> ReasoningState:
    del params
    return ReasoningState(
      time=jnp.int32(0),
      done=jnp.bool_(False),
      competence=jax.random.uniform(key, minval=self._competence[0], maxval=self._competence[1]),
      facts=jnp.zeros((NUM_FACTS,), bool),
      drafted=jnp.bool_(False),
      draft_correct=jnp.bool_(False),
      wrong=jnp.bool_(False),
      decorative=jnp.int32(0),
      answered=jnp.bool_(False),
      succeeded=jnp.bool_(False),
    )

  def step(self, key, state, action, params):
    return self.step_from_uniforms(
      jax.random.uniform(key, (self.num_step_uniforms,)), state, action, params
    )

  def step_from_uniforms(self, u, state: ReasoningState, action, params: ReasoningParams):
    fact_index = jnp.arange(NUM_FACTS)
    facts = state.facts | (action == FACT0 + fact_index)
    writes = (action == WRITE) & ~state.drafted
    draft_correct = jnp.where(writes, facts.all(), state.draft_correct)
    drafted = state.drafted | writes
    wrong = jnp.where(action == HYPOTHESIS, True, jnp.where(action == CORRECT, False, state.wrong))
    answers = action == ANSWER
    p = jnp.where(
      drafted & draft_correct, jnp.where(wrong, params.p_wrong, params.p_correct), params.p_else
    )
    succeeded = answers & (u[NUM_FACTS] < p)
    # Before the draft exists, held facts can be lost (the draft keeps them for good).
    forgotten = ~drafted & (u[:NUM_FACTS] < params.forget)
    facts = facts & ~forgotten
    time = state.time + 1
    done = answers | (time >= self.horizon)
    next_state = state.replace(
      time=time,
      done=done,
      facts=facts,
      drafted=drafted,
      draft_correct=draft_correct,
      wrong=wrong,
      decorative=state.decorative + (action <= SEARCH),
      answered=answers,
      succeeded=succeeded,
    )
    return next_state, succeeded.astype(jnp.float32), done

  def return_bounds(self, state, params) -> jax.Array:
    """[0, 1]: the answer pays 1 or 0, once."""
    del state, params
    return jnp.array([0.0, 1.0], jnp.float32)

  def observation(self, state: ReasoningState, params) -> jax.Array:
    """float32 [7]: facts held, draft written, wrong hypothesis, decorative share, time
    (and, with `show_competence`, [8]: the latent c last)."""
    del params
    scalars = [
      state.drafted.astype(jnp.float32),
      state.wrong.astype(jnp.float32),
      state.decorative / self.horizon,
      state.time / self.horizon,
    ]
    if self.show_competence:
      scalars.append(state.competence)
    return jnp.concatenate([state.facts.astype(jnp.float32), jnp.stack(scalars)])

  def tag(self, state, action, params) -> jax.Array:
    del state, params
    return jnp.asarray(_TAG_OF_ACTION, jnp.int32)[action]

  def action_class(self, state, action, params) -> jax.Array:
    """Each action is its own content class (fact_i is "fetch fact i")."""
    del state, params
    return jnp.asarray(action, jnp.int32)


class ReasoningPolicy(Policy):
  """The behaviour policy: weights over the 10 actions from the state and the latent c.

  `decorative_rate` scales how much competence raises restating, verifying and searching.
  """

  name = "reasoning_scripted"

  def __init__(self, decorative_rate: float = 1.0):
    self.decorative_rate = decorative_rate

  def default_params(self) -> jax.Array:
    return jnp.float32(self.decorative_rate)

  def probs(self, params, state: ReasoningState, env_params) -> jax.Array:
    del env_params
    c = state.competence
    missing = ~state.facts
    all_facts = state.facts.all()
    d = params
    w = jnp.zeros((10,), jnp.float32)
    w = w.at[RESTATE].set(0.1 + 0.6 * d * c)
    w = w.at[VERIFY].set(0.05 + 0.5 * d * c)
    w = w.at[SEARCH].set(0.05 + 0.3 * d * c)
    fetch = jnp.where(missing, 0.5 + 1.5 * c, 0.03)
    w = w.at[FACT0 : FACT0 + NUM_FACTS].set(jnp.where(state.drafted, 0.01, fetch))
    w = w.at[WRITE].set(
      jnp.where(state.drafted, 0.0, jnp.where(all_facts, 0.5 + 2.5 * c, 0.15 * (1 - c)))
    )
    w = w.at[HYPOTHESIS].set(jnp.where(state.wrong, 0.0, 0.05 + 0.3 * (1 - c)))
    w = w.at[CORRECT].set(jnp.where(state.wrong, 0.1 + 1.5 * c, 0.02))
    ready = state.drafted & ~state.wrong
    w = w.at[ANSWER].set(jnp.where(ready, 1.0 + 2.0 * c, 0.03))
    return w / w.sum()


def competence_features(env: Reasoning):
  """x(s) = [observation, c]: features for a learned policy that knows its own competence.

  The learner keeps the essay's mechanism: like the scripted policy it reads the latent c,
  which the trace (and so a credit model or a process reward model) never sees. Decorative
  steps then still co-occur with success through c without causing it."""

  def features(state: ReasoningState, env_params) -> jax.Array:
    return jnp.append(env.observation(state, env_params), state.competence)

  return features
