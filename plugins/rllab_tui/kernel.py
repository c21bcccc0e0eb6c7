"""What the TUI uses from outside its own package, gathered in one place.

- From the kernel: the grid builder validates configs as ``rllab run`` does and writes suite
  files, which needs the config loader, the preset list and the TOML writer; rllab's public
  ``__init__`` does not export them (yet).
- From ``rllab_suite``: the TUI is a front end of ``rllab suite``, so it expands suites into cells,
  finds suite directories and computes and writes reports with that plugin's own functions rather
  than a copy of them. ``rllab_suite`` is a required companion of this plugin.

Every such import of this plugin is here and nowhere else.
"""

from rllab.config import COMPONENT_SECTIONS, load_config, parse_value, preset_names  # noqa: F401
from rllab.tomlio import dump_toml  # noqa: F401
from rllab_suite import report  # noqa: F401
from rllab_suite.spec import expand, parse_suite  # noqa: F401
from rllab_suite.suite import MANIFEST, suite_dir_for  # noqa: F401
