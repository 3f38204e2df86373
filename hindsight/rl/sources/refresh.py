"""Sources whose model is kept current while the policy it describes learns
(`learned_current`, `credit_cv_current`): `Refreshing`, mixed into a source with a model.

Between update chunks (`CreditSource.between_chunks`), each seed audits its own model: fresh
episodes of the current policy are labeled (`audit_size`: refresh.episodes at K =
refresh.rollouts unless the source says otherwise; charged to the run) and the model's gaps
to them are tested per tag (`rl.refresh`); when the test fires the model is fitted again from
its current parameters on the audited labels (`refit`), and its new state replaces the old one
in the running update (an argument of the compiled chunk: nothing recompiles).
"""

from __future__ import annotations

import jax
import numpy as np
from ml_collections import ConfigDict

from hindsight.errors import HindsightError
from hindsight.rl.measure import LabeledSampler, point_keys
from hindsight.rl.refresh import bounded_ranges, gap_test, tag_slices
from hindsight.rl.sources.base import (
  ConfigNode,
  CreditSource,
  credit_arm_steps,
  label_config,
  register_config_node,
)

AUDIT_STREAM = 3  # the audits' keys: fold_in(seed key, 3), then the update (rl.measure)


def _refresh_config() -> ConfigDict:
  """learned_current, credit_cv_current: audits at every evaluation point."""
  c = ConfigDict()
  c.episodes = 32  # fresh episodes of the current policy labeled per audit
  c.rollouts = 16  # their K (each audit's test: eval.tolerance and eval.alpha)
  c.steps = 300  # fine-tuning steps when the alarm fires (from the current model)
  return c


def _check_refresh(c: ConfigDict) -> None:
  if c.refresh.rollouts < 2:
    raise HindsightError("refresh.rollouts must be >= 2")


register_config_node(
  ConfigNode(
    "refresh",
    _refresh_config,
    smoke={"episodes": 8, "rollouts": 4, "steps": 5},
    check=_check_refresh,
  )
)


class Refreshing(CreditSource):
  """Mixed into a source with a model (`credit_prediction`): audited and refit between
  update chunks (module docstring). The source supplies `refit`."""

  def audit_size(self) -> tuple[int, int]:
    """(episodes, K) of each audit: refresh.episodes at refresh.rollouts unless the source
    says otherwise."""
    return int(self.config.refresh.episodes), int(self.config.refresh.rollouts)

  def refit(self, model_state, traj, labels, batch, seed: int):
    """The model state fitted again, from `model_state`, on an audit's fresh episodes of
    the current policy: `traj`, their `labels` and `batch` (the two as
    `labeling.trajectories.trajectory_batch`). Runs on the host between update chunks."""
    raise NotImplementedError(f"source '{self.name}' cannot be refit")

  def between_chunks(self, aux, policy_params, seed_key, update: int, seed: int, record=None):
    """The audit of one seed's model after `update` updates and, when it fires, its refit:
    (the refit state or None, {fired, slice, gap, env_steps (charged), fine_tuned})."""
    del record
    episodes, rollouts = self.audit_size()
    if getattr(self, "_auditor", None) is None:
      self._auditor = LabeledSampler(self.task, label_config(self.config, rollouts))
      self._score = jax.jit(self.credit_prediction())
    keys = point_keys(seed_key, AUDIT_STREAM, update, episodes)
    traj, labels, batch = jax.device_get(self._auditor(policy_params, keys))
    mask = np.asarray(traj.mask)
    credit = np.asarray(labels["credit"])
    ok = mask & np.isfinite(credit)
    pred = np.asarray(self._score(aux, traj, batch))
    slices, names = tag_slices(self.task.env, labels)
    cfg = self.config.eval
    env_steps = int(mask.sum() + credit_arm_steps(np.asarray(labels["arm_steps"])))
    ranges, testable = bounded_ranges(str(cfg.boundary), self._auditor.labeler, traj, pred[ok],
                                      ok, slices[ok], len(names))  # fmt: skip
    if not testable:  # no return range: no test, no refit
      return None, {"fired": False, "undefined": "no return range", "env_steps": env_steps,
                    "fine_tuned": False}  # fmt: skip
    # The audits after every chunk are the run's repeated tests: the i-th spends its share.
    index = update // int(self.config.eval.every) - 1
    record = gap_test((pred - credit)[ok], slices[ok], names, ranges, float(cfg.tolerance),
                      float(cfg.alpha), index, str(cfg.boundary))  # fmt: skip
    record.pop("tags")
    record["env_steps"] = env_steps
    new = self.refit(aux, traj, labels, batch, seed) if record["fired"] else None
    record["fine_tuned"] = record["fired"]
    return new, record
