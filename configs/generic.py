"""Credit model on any label dataset made by `hindsight label`.

  hindsight label --env ENV --episodes 1000 --rollouts 32 --out runs/labels/x
  python -m train.main --config configs/generic.py --workdir runs/x \
      --config.data.labels_dir=runs/labels/x

The dataset decides the encoders: int observations are embedded, float vectors go through an
MLP. The :smoke variant is for tests.
"""

from configs import common


def get_config(arg: str = ""):
  c = common.base_config()
  c.data.labels_dir = ""  # required: set with --config.data.labels_dir=DIR
  return common.with_variant(c, arg)
