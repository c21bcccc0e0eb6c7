"""The kernel entry points the TUI uses, gathered in one place.

The grid builder validates configs as ``rllab run`` does and writes suite files, which needs the
kernel's config loader, preset list and TOML writer; rllab's public ``__init__`` does not export
them (yet). Every such import of this plugin is here and nowhere else.
"""

from rllab.config import COMPONENT_SECTIONS, load_config, parse_value, preset_names  # noqa: F401
from rllab.tomlio import dump_toml  # noqa: F401
