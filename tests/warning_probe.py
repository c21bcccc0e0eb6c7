"""Run an ``rllab`` command and record every deprecation warning raised while it runs.

``python -m tests.warning_probe run key=value ...`` runs the CLI in this process with every
``FutureWarning`` / ``DeprecationWarning`` / ``PendingDeprecationWarning`` shown each time
(``simplefilter("always")``) and recorded with the stack it was raised from, then prints one
line ``WARNINGS <json>``: for each warning its category, message, the file and line the warning
names, and ``via`` — the innermost frame of rllab's own code (``rllab/`` or ``plugins/``) on the
stack, the call of rllab's that led to it. Other warnings are shown as usual.
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = (str(ROOT / "rllab") + "/", str(ROOT / "plugins") + "/")
DEPRECATIONS = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)


def record_into(found: list, show=warnings.showwarning):
    """A ``warnings.showwarning`` that appends deprecation warnings to ``found`` and shows the rest."""

    def record(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, DEPRECATIONS):
            return show(message, category, filename, lineno, file, line)
        ours = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(OURS)]
        found.append({
            "category": category.__name__, "message": str(message), "where": f"{filename}:{lineno}",
            "via": f"{ours[-1].filename}:{ours[-1].lineno}" if ours else None,
        })

    return record


def main(argv: list[str]) -> int:
    found: list[dict] = []
    warnings.simplefilter("always")
    warnings.showwarning = record_into(found)
    from rllab.cli import main as rllab_main

    rc = rllab_main(argv)
    print("WARNINGS " + json.dumps(found))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
