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
from hindsight.labeling.trajectories import trajectory_batch
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


def _outcome_config():
  """Four seeds of outcome RL on small noisy batches at a high learning rate, so that the
  seeds' policies end far apart (exact returns 0.77 to 1.00): a policy of the wrong seed
  cannot pass for the right one."""
  c = corridor("outcome")
  c.num_seeds, c.ppo.learning_rate, c.ppo.episodes, c.ppo.minibatches = 4, 3e-2, 8, 2
  c.eval.episodes = 1024
  return c


@pytest.fixture(scope="module")
def outcome_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("rl") / "outcome")
  return workdir, train_and_evaluate(_outcome_config(), workdir)


def _exact_return(env, policy) -> float:
  """E[return] of `policy` on a tabular env by backward induction over its MDP's arrays (an
  oracle apart from the project's rollouts): V_t(s) = sum_a pi_t(a | s) (r(s, a) + sum_s'
  P(s' | s, a) V_{t+1}(s')), with V = 0 at terminal states and at the horizon."""
  from hindsight.envs.tabular import TabularState

  mdp, params = env.mdp, env.default_params()
  S = mdp.num_states
  value = np.zeros(S)
  probs = jax.vmap(policy.probs, (None, 0, None))
  for t in reversed(range(mdp.horizon)):
    states = TabularState(s=jnp.arange(S), time=jnp.full(S, t, jnp.int32),
                          done=jnp.zeros(S, bool))  # fmt: skip
    pi = np.asarray(probs(policy.default_params(), states, params), np.float64)
    value = (pi * (mdp.r + mdp.P @ np.where(mdp.terminal, 0.0, value))).sum(-1)
  return float(mdp.mu0 @ value)


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
  m = int(_outcome_config().eval.episodes)
  p = (mine * n + theirs * m) / (n + m)
  se = np.sqrt(p * (1 - p) * (1 / n + 1 / m))
  assert 0.1 < theirs < 0.99  # the trained policy is neither the start nor trivially perfect
  assert abs(mine - theirs) <= 3.5 * se + 1e-9, (mine, theirs, se)
  with open(os.path.join(workdir, "results.json")) as f:
    assert json.load(f)["seeds"][0]["success"] == theirs
  # Every seed's loaded policy has, exactly, the return results.json measured for that
  # seed; and the seeds' policies are far enough apart that each seed's measurement refutes
  # another seed's policy (a load_policy that returned seed i + 1's fails here).
  exact = [_exact_return(*load_policy(workdir, seed=i)) for i in range(4)]
  measured = [s["return"] for s in results["seeds"]]  # rewards in {0, 1}: a success rate
  ses = [max(np.sqrt(x * (1 - x) / m), 1 / m) for x in exact]
  for i in range(4):
    assert abs(exact[i] - measured[i]) <= 3.5 * ses[i], (i, exact, measured)
  assert any(abs(exact[(i + 1) % 4] - measured[i]) > 3.5 * ses[i] for i in range(4)), exact


def _estimates(source_name: str, n: int = 4096, settings=(), adapt=None):
  """Per-episode gradient estimates [n, S * A] in logit space of `source_name`'s signal at
  theta_0 on key_corridor (pi_theta_0 = the MDP's own pi), and the exact gradient g*.
  settings: (field, value) pairs of the config; adapt(source, traj) -> A [n, H] or None:
  another signal read off the prepared source (None: its own)."""
  c = corridor(source_name, prior=True)
  for field, value in settings:
    node, _, name = field.partition(".")
    c[node][name] = value
  task = make_task(c)
  source = prepare(task, c)
  mdp, theta0 = task.env.mdp, task.policy.default_params()
  keys = jax.random.split(jax.random.key(99), n)
  traj = jax.vmap(sample_episode, (None, None, None, None, 0))(
    task.env, task.policy, task.env_params, theta0, keys
  )
  own = adapt(source, traj) if adapt is not None else None
  terms = jax.jit(source.terms)(source.aux, source.init(theta0), theta0, traj, jax.random.key(0))
  adv = terms.advantages if own is None else own
  H = task.env.horizon
  states = np.asarray(jax.vmap(jax.vmap(task.env.state_index))(
    jax.tree.map(lambda x: x[:, :H], traj.states)))  # fmt: skip
  mask, actions = np.asarray(traj.mask), np.asarray(traj.actions)
  g = episode_gradients(states, actions, mask, np.asarray(adv), mdp.pi)
  if "action_values" in terms.data:  # Q-Prop's analytic term: the source's own loss term
    g = g + _loss_term_gradients(c, task, source, traj, terms, states, mdp)
  return g, exact_gradient(mdp)


def _loss_term_gradients(c, task, source, traj, terms, states, mdp) -> np.ndarray:
  """Per episode [n, S * A]: the tabular-logit gradient ascent direction of the source's
  own loss term (`CreditSource.loss` at scale 1, the advantages unnormalised), after
  checking that the update's loss (`ppo.Programs._loss`) adds exactly that term: with zero
  advantages, ratio 1 and no entropy bonus, its value is the term's, so a dropped or
  flipped term fails here, not only a wrong formula."""
  n, H = states.shape
  mask = np.asarray(traj.mask)
  state = source.init(task.policy.default_params())
  batch = {"mask": traj.mask, **terms.data}
  # The loss averages over valid steps: count x its gradient is the per-step sum.
  logits = jnp.where(mdp.pi[states] > 0, jnp.log(jnp.asarray(mdp.pi[states])), -1e9)
  per_step = jax.grad(lambda x: source.loss(state, x, batch, 1.0))(logits) * -mask.sum()
  out = np.zeros((n, *mdp.pi.shape))
  np.add.at(out, (np.repeat(np.arange(n), H), states.reshape(-1)),
            np.asarray(per_step).reshape(n * H, -1))  # fmt: skip
  programs, theta0 = Programs(source, c), task.policy.default_params()
  rows = np.arange(64)
  sub = jax.tree.map(lambda x: x[rows], traj)
  h_states = jax.tree.map(lambda x: x[:, :H], sub.states)
  own_logits = task.per_step(task.policy.logits, theta0, h_states)
  logp = jnp.take_along_axis(jax.nn.log_softmax(own_logits), sub.actions[..., None], -1)[..., 0]
  data = {"states": h_states, "actions": sub.actions, "mask": sub.mask,
          "advantages": jnp.zeros(sub.mask.shape), "old_logp": logp,
          **jax.tree.map(lambda x: x[rows], terms.data)}  # fmt: skip
  assert float(c.ppo.entropy) == 0.0
  whole = programs._loss((theta0, state[0]), data, state[1], jnp.ones(()))
  term = source.loss(state, own_logits, data, jnp.ones(()))
  assert abs(float(term)) > 1e-4 and float(whole) == pytest.approx(float(term), rel=1e-5)
  return out.reshape(n, -1)


# shaped's PRM trained enough that p_t moves with the step (the smoke PRM is nearly
# constant, so any use of it would look unbiased).
_PRM = (("credit.model_episodes", 512), ("credit.model_steps", 400))


@pytest.mark.parametrize("source", ["credit_cv", "shaped"])
def test_the_unbiased_sources_gradient_is_the_exact_policy_gradient(source):
  g, g_star = _estimates(source, settings=_PRM if source == "shaped" else ())
  stats = gradient_stats(g, g_star)
  # Unbiased: the distance to g* is what the sampling noise of n episodes explains (the
  # floor), to within 4 dB (a factor 1.6); a source biased by its model would sit above.
  assert stats["bias_db"] < stats["bias_floor_db"] + 4.0, stats
  assert stats["bias_floor_db"] < -10, stats  # n episodes resolve a bias of a third of |g*|


def test_shaping_with_the_steps_own_prm_value_is_resolved_above_the_floor():
  """The negative control of `shaped`: R - p_t, whose p_t = PRM(h_<=t) reads a_t, is no
  baseline, and with the PRM the test trains the check resolves its bias."""

  def own_value(source, traj):
    p = jax.nn.sigmoid(source.logits(source.aux, traj))
    return jnp.where(traj.mask, traj.rewards.sum(-1)[:, None] - p, 0.0)

  g, g_star = _estimates("shaped", settings=_PRM, adapt=own_value)
  stats = gradient_stats(g, g_star)
  assert stats["bias_db"] > stats["bias_floor_db"] + 6.0, stats


def test_a_biased_source_is_resolved_above_the_floor():
  """The same check fails a source whose learned term is not corrected (anchored adds the
  head's credit on top of the outcome): the test can tell."""
  g, g_star = _estimates("anchored")
  stats = gradient_stats(g, g_star)
  assert stats["bias_db"] > stats["bias_floor_db"] + 6.0, stats


# pp_credit at a budget whose 1 / p weights the test's 4,096 episodes resolve, its model
# trained enough to rank (a model of 20 steps is near constant, which would make any
# estimator that leans on it look unbiased by accident).
_PP = (("pp.rho", 0.3), ("pp.p_min", 0.05), ("pp.initial_episodes", 256),
       ("credit.model_steps", 300))  # fmt: skip


def _plus_one(source, traj):
  """The model replaced by one that says +1 everywhere, std 1 (with lam fixed at 1)."""
  ones = jnp.ones(traj.mask.shape)
  source.model_outputs = lambda aux, traj, batch: (ones, ones)


@pytest.mark.parametrize("model", ["trained", "zero", "plus_one"])
def test_pp_credit_is_the_exact_policy_gradient_whatever_its_model(model):
  """A_t = lam f_t + (z_t / p_t)(D_t - lam f_t) is unbiased for the trained model, for none
  (f = 0: sparse MC credit) and for one that is wrong everywhere (f = +1 at lam = 1): each
  within the sampling floor of g*; the trained model's f alone (z ignored) is not."""
  settings = {
    "trained": _PP,
    "zero": (*_PP, ("pp.initial_episodes", 0)),
    "plus_one": (*_PP, ("pp.lam", 1.0)),
  }[model]
  # f = +1 at lam = 1 adds (1 / p - 1)^2 of variance per step: twice the episodes keep
  # the floor as low as the others'
  plus_one = model == "plus_one"
  g, g_star = _estimates("pp_credit", n=8192 if plus_one else 4096, settings=settings,
                         adapt=_plus_one if plus_one else None)  # fmt: skip
  stats = gradient_stats(g, g_star)
  assert stats["bias_db"] < stats["bias_floor_db"] + 4.0, stats
  assert stats["bias_floor_db"] < -10, stats


def test_pp_credits_model_alone_is_resolved_above_the_floor():
  """The negative control: the same trained model's f_t as the signal (every z_t ignored)
  is `learned`'s estimator, biased by the model's error, and the test sees it."""

  def model_alone(source, traj):
    f = source.credit_prediction()(source.aux, traj, trajectory_batch(source.task.env, traj))
    return jnp.where(traj.mask, f, 0.0)

  g, g_star = _estimates("pp_credit", settings=_PP, adapt=model_alone)
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
  credit, mask = np.asarray(held_labels["credit"]), np.asarray(held_traj.mask)
  zero = float(np.mean(credit[mask & np.isfinite(credit)] ** 2))  # the error of predicting 0
  # measured: 0.034 -> 0.023 (the labels' variance is 0.032); a refit that kept the old
  # heads stays at the first, and one fitted on rows whose labels were shuffled against
  # their features does no better than predicting 0
  assert after < 0.85 * before, (before, after)
  assert after < 0.85 * zero, (after, zero)


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


def test_the_head_sources_combine_outcome_and_heads_in_their_own_direction():
  """anchored adds +beta f to the outcome (a flipped sign would subtract it); credit_gated
  takes f where the heads agree (sigma <= gate) and the outcome where they do not;
  credit_cv subtracts f."""
  from hindsight.rl.sources.action_values import Anchored, CreditCv, CreditGated

  c = smoke(base_config())
  c.head.beta, c.head.gate = 0.5, 0.05
  task = make_task(c)
  outcome, f = jnp.array([[1.0, 1.0]]), jnp.array([[0.2, -0.4]])
  agree, disagree = jnp.array([[0.01, 0.01]]), jnp.array([[0.2, 0.2]])
  anchored = Anchored(task, c).advantage(outcome, f, agree)
  np.testing.assert_allclose(anchored, [[1.1, 0.8]], rtol=1e-6)
  gated = CreditGated(task, c)
  np.testing.assert_allclose(gated.advantage(outcome, f, agree), f)
  np.testing.assert_allclose(gated.advantage(outcome, f, disagree), outcome)
  mixed = gated.advantage(outcome, f, jnp.array([[0.01, 0.2]]))
  np.testing.assert_allclose(mixed, [[0.2, 1.0]])
  np.testing.assert_allclose(CreditCv(task, c).advantage(outcome, f, agree), [[0.8, 1.4]])


def test_learned_trusts_kl_term_is_its_weight_times_the_kl_to_theta_0():
  """learned_trust's loss term is credit.trust_kl x the mean over valid steps of
  KL(pi_theta || pi_theta_0), computed here apart from it, and the update's loss adds it: 0
  at theta_0, positive and linear in the weight away from it."""
  from scipy.special import rel_entr

  from hindsight.rl.sources.learned import LearnedTrust

  c = smoke(base_config())
  c.source, c.credit.trust_kl = "learned_trust", 0.3
  task = make_task(c)
  source = LearnedTrust(task, c)  # the term reads no model: no prepare needed
  theta0 = task.policy.default_params()
  state = source.init(theta0)
  keys = jax.random.split(jax.random.key(3), 8)
  traj = jax.vmap(sample_episode, (None, None, None, None, 0))(
    task.env, task.policy, task.env_params, theta0, keys
  )
  H = task.env.horizon
  states = jax.tree.map(lambda x: x[:, :H], traj.states)
  batch = {"states": states, "mask": traj.mask}
  anchor = task.per_step(task.policy.logits, theta0, states)
  assert abs(float(source.loss(state, anchor, batch, 1.0))) < 1e-6
  moved = anchor + jax.random.normal(jax.random.key(4), anchor.shape)
  p, q = (np.asarray(jax.nn.softmax(x), np.float64) for x in (moved, anchor))
  kl = rel_entr(p, q).sum(-1)  # p log(p / q), 0 where p = 0 (illegal actions)
  mask = np.asarray(traj.mask)
  expected = 0.3 * kl[mask].mean()
  term = float(source.loss(state, moved, batch, 1.0))
  assert expected > 0.01 and term == pytest.approx(expected, rel=1e-4)
  c.credit.trust_kl = 0.6
  assert float(LearnedTrust(task, c).loss(state, moved, batch, 1.0)) == pytest.approx(2 * term)


class _Counting(CreditSource):
  """A source whose model state is a counter: between chunks it returns counter + 1, and
  every update records the counter it ran with."""

  name = "test_counting"
  seen: list

  def prepare(self, progress: bool = False) -> None:
    self.aux, self.seen = jnp.int32(0), []

  def terms(self, aux, state, policy_params, traj, key):
    from hindsight.rl.sources import Terms

    zero = jnp.zeros(traj.mask.shape)
    return Terms(zero, self.no_steps(), record={"aux": jnp.broadcast_to(aux, (2,))})

  def between_chunks(self, aux, policy_params, seed_key, update, seed, record=None):
    self.seen.append((update, int(aux), sorted(set(np.asarray(record["aux"]).ravel().tolist()))))
    return aux + 1, None


def test_the_trainer_runs_each_chunk_with_the_state_the_last_one_left(monkeypatch, tmp_path):
  """A state returned by `between_chunks` runs the next chunk's updates (its records say
  which state each update had), for every seed."""
  from hindsight.rl.sources import base

  monkeypatch.setattr(base, "_SOURCES", dict(base._SOURCES))
  base.register_source(_Counting)
  made = []
  original = _Counting.prepare

  def remember(self, progress=False):
    original(self, progress)
    made.append(self)

  monkeypatch.setattr(_Counting, "prepare", remember)
  c = corridor("test_counting")
  c.ppo.updates, c.eval.every, c.eval.episodes = 6, 2, 8
  train_and_evaluate(c, str(tmp_path / "run"))
  seen = made[0].seen
  # 3 chunks x 2 seeds: the chunk ending at update u ran with the state u / 2 - 1
  assert [(u, a) for u, a, _ in seen] == [(u, u // 2 - 1) for u in (2, 2, 4, 4, 6, 6)]
  assert all(r == [a] for _, a, r in seen), seen
