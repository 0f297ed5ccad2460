import atexit
import os
import shutil
import tempfile

import pytest
import torch

# Token stores and tokenizers are cached in the data cache (aiayn/data/store.py): a test session
# gets its own, removed at exit, so that tests never fill the user's ~/.cache/aiayn. Datasets are
# copied into it from the data mirror when a test needs them.
if not os.environ.get("AIAYN_CACHE"):
    os.environ["AIAYN_CACHE"] = tempfile.mkdtemp(prefix="aiayn-test-cache-")
    atexit.register(shutil.rmtree, os.environ["AIAYN_CACHE"], ignore_errors=True)


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
