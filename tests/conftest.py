import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see rllab/__init__.py

import pytest  # noqa: E402
import torch  # noqa: E402

# Keep unit tests deterministic and light on the shared 2-core machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def lab():
    import rllab

    return rllab.Lab()


WARM_STARTS = "tiny-qwen2-*"  # rllab.models.tiny's cache entries: a directory per key, complete once its record is written


def _copy_warm_starts(src, dst) -> None:
    """Copy the complete warm starts in ``src`` that ``dst`` lacks (each via a temporary sibling,
    renamed into place, as the cache itself writes them); nothing else in a cache is copied."""
    import shutil

    from rllab.models.tiny import METRICS_FILE

    for built in src.glob(WARM_STARTS):
        target = dst / built.name
        if not (built / METRICS_FILE).is_file() or target.exists():
            continue
        part = dst / f".copy-{built.name}"
        shutil.copytree(built, part)
        part.rename(target)


@pytest.fixture(scope="session")
def warm_start_store(tmp_path_factory):
    """The warm starts the modules' caches have built, each kept once for the session."""
    return tmp_path_factory.mktemp("warm-starts")


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory, warm_start_store):
    """A model cache of the module's own (RLLAB_CACHE). It starts with a copy of the warm starts
    earlier modules built (the cache is keyed by content: the same configs give the same model),
    and the ones this module builds are kept for the later modules; nothing else (hash memos,
    plugin listings) is shared."""
    old = os.environ.get("RLLAB_CACHE")
    cache = tmp_path_factory.mktemp("model-cache")
    _copy_warm_starts(warm_start_store, cache)
    os.environ["RLLAB_CACHE"] = str(cache)
    yield
    if old is None:
        os.environ.pop("RLLAB_CACHE", None)
    else:
        os.environ["RLLAB_CACHE"] = old
    _copy_warm_starts(cache, warm_start_store)


@pytest.fixture
def fixed_checkout(monkeypatch):
    """The working tree may change while a test runs (edits, commits): provenance sees one git state."""
    from rllab.records import machine

    monkeypatch.setattr(machine, "git_state", lambda where=None: {"commit": "c0ffee", "diff_sha256": "0" * 64, "dirty": False})
