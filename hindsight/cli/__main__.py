"""`python -m hindsight.cli ARGS`: the `hindsight` command."""

import sys

from hindsight.cli import main

sys.exit(main())
