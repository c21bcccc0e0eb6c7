"""Starting models stored once per hash: what `rllab suite` and `rllab provenance --export-start`
both write (``DIR/start-<first 16 hex digits of its sha256>``), each copy checked against its hash."""

from __future__ import annotations

import shutil
from pathlib import Path

from rllab.records import provenance


def export_start(src: Path, sha256: str, directory: Path) -> tuple[Path, bool]:
    """Copy the starting model ``src`` (which hashes to ``sha256``) to ``directory/start-<16 hex
    digits>``, once per hash: ``(its directory, whether it was copied now)``; a copy already there is
    checked against the hash."""
    dest = Path(directory) / f"start-{sha256[:16]}"
    if dest.is_dir():
        provenance.check_start(dest, sha256, setting=f"the start already exported to {dest}")
        return dest, False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    provenance.check_start(tmp, sha256, setting="the exported copy")
    tmp.rename(dest)
    return dest, True
