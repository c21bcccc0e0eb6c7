"""``rllab --version`` (and with ``-v``, what it runs on: python, torch, transformers, the CPU).

The plain version reads installed distributions' metadata only (nothing heavy is imported); the
summary is the environment part of the provenance record every run writes
(:func:`rllab.records.provenance.environment`; it imports torch to say which CPU kernels it uses).
"""

from __future__ import annotations

import sys


def _version(dist: str) -> str | None:
    import importlib.metadata as md

    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def version_line() -> str:
    from rllab.lab import __version__

    return f"rllab {__version__}"


def summary() -> list[tuple[str, str]]:
    """``(field, value)`` rows from the provenance record a run writes (:func:`rllab.records.provenance.environment`):
    rllab and its git state, python, torch (its CPU kernels, threads, CUDA), transformers, the CPU
    (model, cores, vector ISA), the platform and the installed distributions' hash."""
    from rllab.records import provenance

    env = provenance.environment()
    git = env["code"].get("git")
    code = env["code"]["rllab"] + (f" (git {git['commit'][:10]}" + (", uncommitted edits" if git["dirty"] else "") + ")" if git else "")
    rows = [("rllab", code), ("python", f"{env['python']['version']} {env['python']['implementation']} ({sys.executable})")]
    t = env["machine"]["torch"]
    cuda = t.get("cuda")
    gpu = (f"CUDA {cuda['version']}, {len(cuda['devices'])} × {cuda['devices'][0]}" if cuda and cuda.get("devices") else "no CUDA device")
    rows.append(("torch", f"{_version('torch')} (CPU kernels {t.get('cpu_capability') or '?'}, {t['threads']} threads; {gpu})"))
    rows.append(("transformers", _version("transformers") or "not installed"))
    cpu = env["machine"]["cpu"]
    isa = [name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("amx_tile", "AMX"), ("avx_vnni", "AVX-VNNI")) if flag in cpu["isa"]]
    rows.append(("cpu", f"{cpu['model'] or '?'} ({cpu['cores']} cores, {cpu['machine']}" + (f"; {', '.join(isa)}" if isa else "") + ")"))
    rows.append(("platform", env["machine"]["platform"]))
    rows.append(("environment", f"{env['environment']['distributions']} distributions installed (sha256 {env['environment']['sha256'][:12]})"))
    return rows


def print_version(verbose: bool, out=None) -> None:
    out = out or sys.stdout
    print(version_line(), file=out)
    if verbose:
        rows = summary()
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"  {k:<{width}}  {v}", file=out)
