"""The kernel entry points a suite drives, gathered in one place.

A suite does what ``rllab run`` does — read a config, run it, resume it — so it needs the
kernel's config loader, trainer and run-directory helpers, which rllab's public ``__init__`` does
not export (yet). Every such import of this plugin is here and nowhere else.
"""

from rllab.checkpoint import latest as latest_checkpoint  # noqa: F401
from rllab.config import COMPONENT_SECTIONS, load_config, parse_overrides  # noqa: F401
from rllab.runs import resume_run  # noqa: F401
from rllab.trainer import Trainer, run_experiment  # noqa: F401
