"""One label config: the training and RL configs nest a `label` node of LabelConfig's own
fields, read whole; configs and run directories from before the rename keep working."""

from __future__ import annotations

import json

import pytest

from hindsight.config_io import (
  LEGACY_CONFIG_NAMES,
  _flatten,
  apply_overrides,
  check_workdir,
  current_names,
)
from hindsight.default_config import base_config
from hindsight.errors import HindsightError
from hindsight.labeling.config import LabelConfig
from hindsight.rl.config import base_config as rl_base_config


def _old_flat(config) -> dict:
  """config as a run made before the rename recorded it: the old names, and none of the
  LabelConfig fields the label nodes gained."""
  new_to_old = {v: k for k, v in LEGACY_CONFIG_NAMES.items()}
  flat = _flatten(config.to_dict())
  out = {}
  for k, v in flat.items():
    node, _, field = k.rpartition(".")
    if k in new_to_old:
      out[new_to_old[k]] = v
    elif field in LabelConfig().as_dict() and f"{node}.num_rollouts" in flat:
      continue  # gamma, exact, ...: absent from an old config.json
    else:
      out[k] = v
  return json.loads(json.dumps(out))


@pytest.mark.parametrize("make", [base_config, rl_base_config])
def test_a_run_from_before_the_rename_resumes(make, tmp_path):
  config = make()
  (tmp_path / "config.json").write_text(json.dumps(_old_flat(config)))
  check_workdir(config, str(tmp_path))  # same config under its old names: accepted
  assert current_names(_old_flat(config)) == json.loads(json.dumps(_flatten(config.to_dict())))
  # A real difference is still refused, named by today's name.
  node = config.data.label if "data" in config else config.label
  node.num_rollouts = node.num_rollouts + 1
  with pytest.raises(HindsightError, match=r"num_rollouts differ"):
    check_workdir(config, str(tmp_path))


def test_old_override_names_set_the_new_fields_and_the_node_is_read_whole():
  config = apply_overrides(base_config(), ["data.label.rollouts=7", "data.label.gamma=0.9"])
  assert config.data.label.num_rollouts == 7 and "rollouts" not in config.data.label
  label = LabelConfig.from_config(config.data.label)
  assert label == LabelConfig(num_rollouts=7, gamma=0.9)
  rl = apply_overrides(rl_base_config(), ["credit.rollouts=5", "credit.replacement=uniform",
                                          "label.stratify=False"])  # fmt: skip
  assert LabelConfig.from_config(rl.label) == LabelConfig(
    num_rollouts=5, replacement="uniform", stratify=False
  )
  assert LabelConfig.from_config(rl.label, num_rollouts=32).num_rollouts == 32
  with pytest.raises(HindsightError, match="num_rollouts must be >= 2"):
    LabelConfig.from_config(
      apply_overrides(base_config(), ["data.label.num_rollouts=1"]).data.label
    )
