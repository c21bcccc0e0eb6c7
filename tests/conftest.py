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


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory):
    """A model cache of the module's own (RLLAB_CACHE): the tiny model is built once per module."""
    old = os.environ.get("RLLAB_CACHE")
    os.environ["RLLAB_CACHE"] = str(tmp_path_factory.mktemp("model-cache"))
    yield
    if old is None:
        os.environ.pop("RLLAB_CACHE", None)
    else:
        os.environ["RLLAB_CACHE"] = old


@pytest.fixture
def fixed_checkout(monkeypatch):
    """The working tree may change while a test runs (edits, commits): provenance sees one git state."""
    from rllab.records import machine

    monkeypatch.setattr(machine, "git_state", lambda where=None: {"commit": "c0ffee", "diff_sha256": "0" * 64, "dirty": False})
