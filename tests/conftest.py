import os

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """Tiny models: one thread is faster, and far faster on a loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mirror_or_skip():
    """The data mirror folder, or skip the test with a visible reason."""
    mirror = os.environ.get("AIAYN_DATA_MIRROR")
    if not mirror:
        pytest.skip("AIAYN_DATA_MIRROR is not set (real-data test; `make test` sets it when ../shared/data exists)")
    return mirror
