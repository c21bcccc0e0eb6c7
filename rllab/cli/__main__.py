"""``python -m rllab.cli``: the ``rllab`` command."""

import sys

from rllab.cli import main

sys.exit(main())
