"""The code, interpreter, libraries and machine a process runs on: the part of a provenance record
(:mod:`rllab.records.provenance`) that two machines running one config can differ in."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def git_state(where: str | os.PathLike | None = None) -> dict | None:
    """``{"commit", "diff_sha256", "dirty"}`` of the git checkout rllab runs from, else None."""
    root = Path(where) if where is not None else Path(__file__).resolve().parents[2]  # rllab/records/machine.py → the checkout
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, timeout=20, check=True).stdout
        diff = subprocess.run(["git", "-C", str(root), "diff", "HEAD", "--binary"], capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": sha.decode().strip(), "diff_sha256": hashlib.sha256(diff).hexdigest(), "dirty": bool(diff)}


def imported_libraries() -> dict[str, str]:
    """``{distribution: version}`` of every installed distribution one of whose top-level modules
    is imported in this process."""
    import importlib.metadata as md

    owners = md.packages_distributions()
    tops = {name.partition(".")[0] for name in list(sys.modules)}
    out = {}
    for top in sorted(tops):
        for dist in owners.get(top, ()):
            try:
                out[dist] = md.version(dist)
            except md.PackageNotFoundError:
                continue
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def environment_hash() -> tuple[str, int]:
    """One sha256 over every installed distribution's ``name==version`` (sorted), and their count."""
    import importlib.metadata as md

    rows = sorted({f"{(d.metadata['Name'] or '?').lower()}=={d.version}" for d in md.distributions()})
    return hashlib.sha256("\n".join(rows).encode()).hexdigest(), len(rows)


ISA_FLAGS = ("sse4_2", "fma", "f16c", "avx", "avx2", "avx_vnni", "amx")
"""/proc/cpuinfo flags recorded (and every flag starting with ``avx512`` or ``amx``)."""


def cpu_info() -> dict:
    """The CPU model, its vector ISA flags, the machine type and the number of cores."""
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if model is not None and flags:
                    break
    except OSError:
        pass
    if model is None or not flags:
        try:  # py-cpuinfo, where installed (macOS, Windows)
            import cpuinfo  # type: ignore[import-not-found]

            got = cpuinfo.get_cpu_info()
            model = model or got.get("brand_raw")
            flags = flags or set(got.get("flags", ()))
        except Exception:  # noqa: BLE001 — optional, and slow or absent on some systems
            pass
    isa = sorted(f for f in flags if f in ISA_FLAGS or f.startswith(("avx512", "amx")))
    return {"model": model or platform.processor() or None, "machine": platform.machine(), "isa": isa, "cores": os.cpu_count()}


def torch_info() -> dict:
    """torch's CPU kernel family, thread counts and determinism switches; CUDA, its devices and the
    driver when present."""
    import torch

    out: dict[str, Any] = {
        "cpu_capability": _call(lambda: torch.backends.cpu.get_cpu_capability()),
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "thread_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS") if k in os.environ},
    }
    if torch.cuda.is_available():
        out["cuda"] = {
            "version": torch.version.cuda,
            "cudnn": _call(lambda: torch.backends.cudnn.version()),
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "capability": [list(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())],
            "driver": _nvidia_driver(),
        }
    return out


def _call(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 — a field an older torch lacks is left empty
        return None


def _nvidia_driver() -> str | None:
    try:
        got = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, timeout=20, check=True)
        return got.stdout.decode().strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def environment() -> dict:
    """The code, interpreter, libraries and machine this process runs on (:func:`collect` without
    the run's own hashes); a suite result records it once."""
    from rllab.lab import __version__

    env_sha, env_count = environment_hash()
    return {
        "code": {"rllab": __version__, "git": git_state()},
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "libraries": imported_libraries(),
        "environment": {"sha256": env_sha, "distributions": env_count},
        "machine": {"cpu": cpu_info(), "torch": torch_info(), "platform": platform.platform(), "host": platform.node()},
    }
