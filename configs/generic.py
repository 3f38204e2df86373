"""Credit model on any label dataset made by `hindsight label`.

  hindsight label --env ENV --episodes 1000 --rollouts 32 --out runs/labels/x
  hindsight train --labels runs/labels/x --workdir runs/x
  python -m train.main --config configs/generic.py --workdir runs/x \
      --config.data.labels_dir=runs/labels/x

The dataset decides the encoders: int observations are embedded, float vectors go through an
MLP. The :smoke variant is for tests. `hindsight train` runs this config by default.
"""

from hindsight.default_config import generic_config


def get_config(arg: str = ""):
  return generic_config(arg)
