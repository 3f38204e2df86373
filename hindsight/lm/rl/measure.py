"""What every evaluation point of `rl_text` measures on fresh prompts (one completion each,
drawn with keys of the point's own stream):

  success      the verifier's mean outcome
  length       steps per trace (sentences, `text.trace.chunk_text`)
  tokens       generated tokens per trace, EOS included
  tag_share    the share of steps of each sentence class of the text world
               (`worlds.world.sentence_tag`; "other" for a sentence the world never writes)
  decorative   the share of restatements, empty checks and unused searches
  recovered    harmful-but-recovered pairs per trace: a wrong idea later corrected
  drift        sources with a model: their predicted credit on the first eval.reference
               traces against credit resampled from the current policy at eval.rollouts
               (`rl.credit`), per sentence class, with the symbolic trainer's gap and shift
               tests (`rl.measure.drift_tests`); the shift test's firing is the
               `credit_drift` warning (for `prm`: a policy trained on it can be hacked)
"""

from __future__ import annotations

import numpy as np

from hindsight.lm.rl.credit import all_prefixes, trace_fields
from hindsight.lm.rl.rollout import Rollouts
from hindsight.rl.measure import drift_tests
from hindsight.rl.sources.base import Probe
from hindsight.worlds.world import DECORATIVE_TAGS, SENTENCE_TAGS, sentence_tag


def step_tags(rollouts: Rollouts) -> list[list[str]]:
  """The sentence class of every step of every trace ("other" off the text world)."""
  return [[sentence_tag(p.problem, s) if p.problem is not None else "other" for s in c.steps]
          for p, c in zip(rollouts.prompts, rollouts.completions, strict=True)]  # fmt: skip


def recovered_pairs(tags: list[str]) -> int:
  """Wrong ideas later corrected: each correction closes the wrong idea open before it."""
  open_, pairs = 0, 0
  for tag in tags:
    if tag == "wrong_hypothesis":
      open_ += 1
    elif tag == "correction" and open_:
      open_, pairs = open_ - 1, pairs + 1
  return pairs


def trace_measures(rollouts: Rollouts) -> dict:
  """The point's plain measures (module docstring) as floats."""
  tags = step_tags(rollouts)
  flat = [t for trace in tags for t in trace]
  n = max(len(flat), 1)
  share = {t: flat.count(t) / n for t in SENTENCE_TAGS}
  return {
    "success": float(np.mean(rollouts.rewards)),
    "length": float(np.mean([c.num_steps for c in rollouts.completions])),
    "tokens": float(np.mean([len(c.ids) for c in rollouts.completions])),
    "finished": float(np.mean([c.eos for c in rollouts.completions])),
    "tag_share": share,
    "decorative": float(sum(share[t] for t in DECORATIVE_TAGS)),
    "recovered": float(np.mean([recovered_pairs(t) for t in tags])),
  }


def evaluate_point(ctx, source, state, prompts, key, ref_key, index: int, before=None) -> dict:
  """The measures of one seed at one point: `prompts` completed by the policy at `state`
  with `key`; for a source with a model, the reference from `ref_key`. index: the point's
  place in the run (the tests' error budget); before: update 0's `drift.tags`."""
  ro = ctx.rollout(state, prompts, key)
  out = trace_measures(ro)
  warnings = {}
  n_ref = min(int(ctx.config.eval.reference), len(prompts))
  if source.learned and n_ref:
    ref_ro = Rollouts(ro.prompts[:n_ref], ro.completions[:n_ref], ro.rewards[:n_ref])
    pools, spend = ctx.pools(state, ref_ro, all_prefixes(ref_ro), int(ctx.config.eval.rollouts),
                             ref_key)  # fmt: skip
    ref = np.concatenate([trace_fields(pools, i, c.num_steps, ref_ro.rewards[i])["credit"]
                          for i, c in enumerate(ref_ro.completions)])  # fmt: skip
    pred = np.concatenate(source.predict(ref_ro))
    tags = [t for trace in step_tags(ref_ro) for t in trace]
    slices = np.array([SENTENCE_TAGS.index(t) for t in tags])
    e = ctx.config.eval
    probe = Probe(None, source.consequence)
    out["drift"], warnings = drift_tests(pred, ref, slices, SENTENCE_TAGS,
                                         (float(e.tolerance), float(e.alpha), "asymptotic"),
                                         index, before, probe)  # fmt: skip
    out["reference_completions"] = spend.completions
  out["warnings"] = warnings
  return out
