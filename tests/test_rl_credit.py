"""RL credit sources against the truth: the update follows the signal, a trained policy is
what results.json says it is, and the unbiased sources' gradient is the exact one."""

from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hindsight.credit.policy_gradient import episode_gradients, exact_gradient, gradient_stats
from hindsight.labeling.rollout import sample_episode
from hindsight.rl.config import base_config, smoke
from hindsight.rl.load import load_policy
from hindsight.rl.ppo import Programs
from hindsight.rl.sources import CreditSource, prepare
from hindsight.rl.task import make_task
from hindsight.rl.trainer import seed_keys, train_and_evaluate


def corridor(source: str, prior: bool = False):
  """key_corridor (a tabular MDP) from a uniform policy, or from its scripted one."""
  c = smoke(base_config())
  c.env, c.source = "key_corridor", source
  c.policy.prior = prior
  c.ppo.updates, c.ppo.episodes, c.ppo.epochs = 8, 32, 4
  c.ppo.learning_rate = 3e-3
  c.ppo.entropy = 0.0
  c.eval.every, c.eval.episodes, c.eval.rollouts = 8, 256, 2
  return c


class _PlusOne(CreditSource):
  """+1 on the steps that took action `aux`, 0 elsewhere."""

  name = "test_plus_one"

  def prepare(self, progress: bool = False) -> None:
    self.aux = jnp.int32(0)

  def signal(self, aux, policy_params, traj, key):
    return jnp.where(traj.mask & (traj.actions == aux), 1.0, 0.0), self.no_steps()


def _mean_probs(task, params, n: int = 64) -> np.ndarray:
  """pi_params(. | s) [A] averaged over the valid steps of n episodes of theta_0."""
  keys = jax.random.split(jax.random.key(7), n)
  theta0 = task.policy.default_params()
  traj = jax.vmap(sample_episode, (None, None, None, None, 0))(
    task.env, task.policy, task.env_params, theta0, keys
  )
  states = jax.tree.map(lambda x: x[:, : task.env.horizon], traj.states)
  probs = jax.vmap(jax.vmap(task.policy.probs, (None, 0, None)), (None, 0, None))(
    params, states, task.env_params
  )
  mask = np.asarray(traj.mask)
  return np.asarray(probs)[mask].mean(0)


def test_a_plus_one_on_an_action_raises_its_probability(monkeypatch):
  """For every action a: one update on +1 at a's steps raises pi(a). An update that ignored
  its source's signal could raise at most some of them, not each in turn."""
  from hindsight.rl.sources import base

  monkeypatch.setattr(base, "_SOURCES", dict(base._SOURCES))
  base.register_source(_PlusOne)
  c = corridor("test_plus_one")
  task = make_task(c)
  programs = Programs(prepare(task, c), c)
  keys = seed_keys(c)
  before = _mean_probs(task, jax.tree.map(lambda x: x[0], programs.init(keys).params))
  for a in range(task.env.num_actions):
    aux = programs.place(jnp.full((int(c.num_seeds),), a, jnp.int32))
    after_ts, _ = programs.chunk(programs.place(programs.init(keys)), aux, 1)
    after = _mean_probs(task, jax.tree.map(lambda x: x[0], after_ts.params))
    assert after[a] > before[a] + 0.01, (a, before, after)


@pytest.fixture(scope="module")
def outcome_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("rl") / "outcome")
  return workdir, train_and_evaluate(corridor("outcome"), workdir)


def test_load_policy_rolled_out_by_hand_matches_results_json(outcome_run):
  workdir, results = outcome_run
  env, policy = load_policy(workdir, seed=0)
  params, theta = env.default_params(), policy.default_params()
  n = 1024
  k_reset, k_act, k_step = jax.random.split(jax.random.key(12345), 3)
  state = jax.vmap(env.reset, (0, None))(jax.random.split(k_reset, n), params)
  probs = jax.jit(jax.vmap(policy.probs, (None, 0, None)))
  step = jax.jit(jax.vmap(env.step, (0, 0, 0, None)))
  returns, done = np.zeros(n), np.zeros(n, bool)
  for t in range(env.horizon):
    p = probs(theta, state, params)
    action = jax.random.categorical(jax.random.fold_in(k_act, t), jnp.log(p))
    new, reward, _ = step(jax.random.split(jax.random.fold_in(k_step, t), n), state, action, params)
    returns += np.where(done, 0.0, np.asarray(reward))
    # an episode that ended keeps its final state
    alive = jnp.asarray(~done)
    state = jax.tree.map(
      lambda a, b, alive=alive: jnp.where(alive.reshape(alive.shape + (1,) * (a.ndim - 1)), a, b),
      new,
      state,
    )
    done = np.asarray(state.done)
  success = np.asarray(jax.vmap(env.success)(state, jnp.asarray(returns, jnp.float32)))
  mine, theirs = float(success.mean()), results["seeds"][0]["success"]
  m = int(corridor("outcome").eval.episodes)
  p = (mine * n + theirs * m) / (n + m)
  se = np.sqrt(p * (1 - p) * (1 / n + 1 / m))
  assert 0.1 < theirs < 0.99  # the trained policy is neither the start nor trivially perfect
  assert abs(mine - theirs) <= 3.5 * se + 1e-9, (mine, theirs, se)
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f)["seeds"][0]["success"] == theirs


def _estimates(source_name: str, n: int = 4096):
  """Per-episode gradient estimates [n, S * A] in logit space of `source_name`'s signal at
  theta_0 on key_corridor (pi_theta_0 = the MDP's own pi), and the exact gradient g*."""
  c = corridor(source_name, prior=True)
  task = make_task(c)
  source = prepare(task, c)
  mdp, theta0 = task.env.mdp, task.policy.default_params()
  keys = jax.random.split(jax.random.key(99), n)
  traj = jax.vmap(sample_episode, (None, None, None, None, 0))(
    task.env, task.policy, task.env_params, theta0, keys
  )
  terms = jax.jit(source.terms)(source.aux, source.init(theta0), theta0, traj, jax.random.key(0))
  adv = terms.advantages
  H = task.env.horizon
  states = np.asarray(jax.vmap(jax.vmap(task.env.state_index))(
    jax.tree.map(lambda x: x[:, :H], traj.states)))  # fmt: skip
  mask, actions = np.asarray(traj.mask), np.asarray(traj.actions)
  g = episode_gradients(states, actions, mask, np.asarray(adv), mdp.pi)
  if "action_values" in terms.data:  # Q-Prop's analytic term, the source's own loss term
    # grad_theta[s, b] sum_a pi(a | s) f(s, a) = pi(b | s) (f(s, b) - E_pi f(s, .))
    f = np.asarray(terms.data["action_values"])  # [n, H, A]
    pi = mdp.pi[states]
    term = pi * (f - (pi * f).sum(-1, keepdims=True)) * mask[..., None]
    extra = np.zeros((n, *mdp.pi.shape))
    np.add.at(extra, (np.repeat(np.arange(n), H), states.reshape(-1)), term.reshape(n * H, -1))
    g = g + extra.reshape(n, -1)
  return g, exact_gradient(mdp)


@pytest.mark.parametrize("source", ["credit_cv", "shaped"])
def test_the_unbiased_sources_gradient_is_the_exact_policy_gradient(source):
  g, g_star = _estimates(source)
  stats = gradient_stats(g, g_star)
  # Unbiased: the distance to g* is what the sampling noise of n episodes explains (the
  # floor), to within 4 dB (a factor 1.6); a source biased by its model would sit above.
  assert stats["bias_db"] < stats["bias_floor_db"] + 4.0, stats
  assert stats["bias_floor_db"] < -10, stats  # n episodes resolve a bias of a third of |g*|


def test_a_biased_source_is_resolved_above_the_floor():
  """The same check fails a source whose learned term is not corrected (anchored adds the
  head's credit on top of the outcome): the test can tell."""
  g, g_star = _estimates("anchored")
  stats = gradient_stats(g, g_star)
  assert stats["bias_db"] > stats["bias_floor_db"] + 6.0, stats


def test_a_refit_moves_the_heads_to_a_new_policys_labels():
  """credit_cv_current's audit refit: on held-out labels of a policy the heads were not
  fitted on, the heads refit on that policy's fresh labels err less than the stale ones."""
  from hindsight.rl.measure import LabeledSampler
  from hindsight.rl.sources import label_config

  c = smoke(base_config())
  c.env, c.source = "reasoning", "credit_cv_current"
  c.head.episodes, c.head.steps, c.refresh.steps = 64, 300, 300
  c.head.refresh_episodes, c.head.refresh_rollouts = 64, 8
  task = make_task(c)
  source = prepare(task, c)
  theta0 = task.policy.default_params()
  leaves, tree = jax.tree.flatten(theta0)
  keys = jax.random.split(jax.random.key(5), len(leaves))
  moved = jax.tree.unflatten(
    tree, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
  )
  episodes, rollouts = source.audit_size()
  sampler = LabeledSampler(task, label_config(c, rollouts))
  fit_keys = jax.random.split(jax.random.key(6), episodes)
  test_keys = jax.random.split(jax.random.key(7), 256)

  def error(state, traj, labels):
    f = np.asarray(source.credit_prediction()(state, traj, None))
    credit, mask = np.asarray(labels["credit"]), np.asarray(traj.mask)
    ok = mask & np.isfinite(credit)
    return float(np.mean((f - credit)[ok] ** 2))

  traj, labels, batch = sampler(moved, fit_keys)
  refit = source.refit(source.aux, traj, labels, batch, seed=3)
  held_traj, held_labels, _ = sampler(moved, test_keys)
  before, after = error(source.aux, held_traj, held_labels), error(refit, held_traj, held_labels)
  # measured: 0.034 -> 0.023 (the labels' variance is 0.032); a refit that kept the old
  # heads, or fitted them on other rows, stays at the first
  assert after < 0.85 * before, (before, after)


@pytest.mark.parametrize("boundary", ["asymptotic", "bounded"])
def test_credit_drift_fires_on_a_moved_gap_not_on_a_model_that_never_fit(boundary):
  """The warning's test (`rl.refresh.shift_test`, on the audit's confidence sequences): a
  model off by 0.3 on one tag from the start does not fire it (the gap test does); the same
  model after the gap on another tag moved by 0.2 does, naming that tag; and it fires
  exactly when the two points' sequences are further apart than the tolerance."""
  from hindsight.metrics.sequential import SliceBounds, slice_sequences
  from hindsight.rl.refresh import gap_test, shift_alpha, shift_test

  names, slices = ("a", "b"), np.repeat([0, 1], 2000)
  ranges = np.array([[-1.0, 1.0], [-1.0, 1.0]])
  noise = np.asarray(jax.random.normal(jax.random.key(0), (3, 4000))) * 0.05
  off = np.where(slices == 0, 0.3, 0.0)
  first, same, moved = noise + np.stack([off, off, off + 0.2 * (slices == 1)])
  sequences = functools.partial(slice_sequences, names=names, ranges=ranges, boundary=boundary)
  before = sequences(first, slices, alpha=shift_alpha(0.05, 0))
  audit = gap_test(same, slices, names, ranges, 0.02, 0.05, 1, boundary)
  assert audit["fired"] and audit["slice"] == "a" and audit["lower"] > 0.02, audit
  now = sequences(same, slices, alpha=shift_alpha(0.05, 1))
  assert not shift_test(now, before, 0.02)["fired"]
  shift = shift_test(sequences(moved, slices, alpha=shift_alpha(0.05, 1)), before, 0.02)
  assert shift["fired"] and shift["slice"] == "b", shift
  assert abs(shift["gap"] - shift["before"] - 0.2) < 0.01, shift
  # the rule, to the digit: apart = max(lo_now - hi_then, lo_then - hi_now) > tolerance
  then = SliceBounds(("a",), np.array([-0.01]), np.array([0.01]), np.array([0.0]), np.array([9]))
  for apart, fires in ((0.02 - 1e-9, False), (0.02 + 1e-9, True)):
    lo = 0.01 + apart
    now = SliceBounds(("a",), np.array([lo]), np.array([lo + 0.02]), np.array([lo + 0.01]),
                      np.array([9]))  # fmt: skip
    assert shift_test(now, then, 0.02)["fired"] is fires, apart


def test_a_return_range_far_wider_than_the_gaps_blinds_only_the_bounded_sequences():
  """Gaps that may lie anywhere in a range 13 wide (key_to_door's apple steps) but spread
  by 0.1: a move of 0.2 at 600 steps, which the asymptotic sequences see, stays inside the
  bounded ones' margin."""
  from hindsight.metrics.sequential import slice_sequences
  from hindsight.rl.refresh import shift_alpha, shift_test

  names, slices = ("apple",), np.zeros(600, int)
  ranges = np.array([[-6.5, 6.5]])
  noise = np.asarray(jax.random.normal(jax.random.key(1), (2, 600))) * 0.1
  fired = {}
  for boundary in ("asymptotic", "bounded"):
    seq = functools.partial(slice_sequences, names=names, ranges=ranges, boundary=boundary)
    before = seq(noise[0], slices, alpha=shift_alpha(0.05, 0))
    fired[boundary] = shift_test(seq(noise[1] + 0.2, slices, alpha=shift_alpha(0.05, 1)),
                                 before, 0.02)["fired"]  # fmt: skip
  assert fired == {"asymptotic": True, "bounded": False}, fired


@pytest.mark.parametrize("boundary", ["asymptotic", "bounded"])
def test_the_drift_tests_are_anytime_valid_over_a_run(boundary):
  """A model whose gaps never move (each tag's mean exactly on the tolerance's edge for the
  gap test, and constant for the shift test) fires neither test at any of a run's 20 points
  in more than alpha of 300 runs: the error budget spent over the points (`spent_alpha`)
  holds over the whole run, not per point, for either sequence (the bounded one whatever
  the draws; the asymptotic one at 150 draws per tag of a two-point distribution)."""
  from hindsight.metrics.sequential import slice_sequences
  from hindsight.rl.refresh import gap_test, shift_alpha, shift_test

  names, slices = ("a", "b"), np.repeat([0, 1], 150)
  ranges = np.array([[-1.0, 1.0], [-1.0, 1.0]])
  alpha, tolerance = 0.1, 0.05
  rng = np.random.default_rng(1)
  gap_fired = shift_fired = 0
  for _ in range(300):
    # gaps in {tolerance - 0.5, tolerance + 0.5}: mean exactly the tolerance, sd 0.5
    draw = lambda: tolerance + 0.5 * rng.choice([-1.0, 1.0], slices.size)  # noqa: E731
    before = slice_sequences(draw(), slices, names, ranges, shift_alpha(alpha, 0),
                             boundary=boundary)  # fmt: skip
    gap = shift = False
    for i in range(1, 21):
      g = draw()
      gap |= gap_test(g, slices, names, ranges, tolerance, alpha, i - 1, boundary)["fired"]
      now = slice_sequences(g, slices, names, ranges, shift_alpha(alpha, i), boundary=boundary)
      shift |= shift_test(now, before, tolerance)["fired"]
    gap_fired += gap
    shift_fired += shift
  # Binomial(300, <= 0.1): above 0.1 + 3 sd (0.152) is not sampling noise.
  assert gap_fired / 300 <= 0.152 and shift_fired / 300 <= 0.152, (gap_fired, shift_fired)


def test_the_experiment_reads_leads_collapses_and_budgets_off_the_curves():
  """warning_lead, collapsed and budget_margins on two hand-written runs: a learned source
  whose model costs 100 env steps before its first update, warned at update 10 with one
  seed falling at 20; and outcome RL, which spends nothing on credit."""
  from hindsight.rl.experiment import budget_margins, collapsed, warning_lead

  def point(update, steps, credit, successes, warned=()):
    seeds = [{"success": x, "warnings": {"credit_drift": "..."} if i in warned else {}}
             for i, x in enumerate(successes)]  # fmt: skip
    return {"update": update, "policy_steps": [steps] * 2, "credit_steps": [credit] * 2,
            "seeds": seeds}  # fmt: skip

  learned = {"curve": [point(0, 0, 100, (0.5, 0.5)), point(10, 50, 100, (0.6, 0.45), (1,)),
                       point(20, 100, 100, (0.7, 0.3), (0, 1))]}  # fmt: skip
  learned["seeds"] = learned["curve"][-1]["seeds"]
  outcome = {"curve": [point(0, 0, 0, (0.5, 0.5)), point(10, 50, 0, (0.8, 0.8)),
                       point(20, 100, 0, (0.9, 0.9))]}  # fmt: skip
  assert warning_lead(learned) == [
    {"warned": 20, "fell": None, "lead": None},
    {"warned": 10, "fell": 20, "lead": 10},  # 0.45 is within 0.1 of 0.5; 0.3 is not
  ]
  assert collapsed(learned) == 1
  # at 100, 150 and 200 env steps outcome RL is at its last point (0.9); the learned run is
  # at 0.5, 0.525 and 0.5
  np.testing.assert_allclose(budget_margins(learned, outcome), [-0.4, -0.375, -0.4])
