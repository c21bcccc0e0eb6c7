"""``rllab --version`` (and with ``-v``, what it runs on: python, torch, transformers, the CPU).

The plain version reads installed distributions' metadata only (nothing heavy is imported); the
summary imports torch to say which CPU kernels and accelerator it uses.
"""

from __future__ import annotations

import os
import platform
import sys


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _git() -> str | None:
    """The commit (``+ edits`` when the checkout has uncommitted changes) rllab runs from, if a git checkout."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.decode().strip() + (" + uncommitted edits" if dirty.stdout.strip() else "")


def version_line() -> str:
    from rllab.lab import __version__

    return f"rllab {__version__}"


def summary() -> list[tuple[str, str]]:
    """``(field, value)`` rows: rllab (and its git commit), python, torch (its CPU kernels, CUDA),
    transformers, the CPU and its cores."""
    rows = [("rllab", version_line().split()[1] + (f" (git {g})" if (g := _git()) else "")),
            ("python", f"{platform.python_version()} ({sys.executable})")]
    try:
        import torch

        kernels = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()
        cuda = (f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
                if torch.cuda.is_available() else "no CUDA device")
        rows.append(("torch", f"{torch.__version__} (CPU kernels {kernels}, {torch.get_num_threads()} threads; {cuda})"))
    except ImportError:
        rows.append(("torch", "not installed: pip install torch"))
    rows.append(("transformers", _version("transformers") or "not installed"))
    rows.append(("cpu", f"{_cpu_model() or '?'} ({os.cpu_count()} cores, {platform.machine()})"))
    rows.append(("platform", platform.platform()))
    return rows


def print_version(verbose: bool, out=None) -> None:
    out = out or sys.stdout
    print(version_line(), file=out)
    if verbose:
        rows = summary()
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"  {k:<{width}}  {v}", file=out)
