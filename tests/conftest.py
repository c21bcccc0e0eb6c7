import os

import pytest
import torch

# Keep unit tests deterministic and light on the shared 2-core machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def lab():
    import rllab

    return rllab.Lab()
