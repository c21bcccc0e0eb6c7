"""``python -m rllab``: the ``rllab`` command (also under ``torchrun ... -m rllab run ...``)."""

import sys

from rllab.cli import main

sys.exit(main())
