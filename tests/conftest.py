import os

import pytest
import torch
from trainutil import thread_fixture


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


# Opt-in (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny models, one thread.
one_thread = thread_fixture()


def mirror_or_skip():
    """The data mirror folder, or skip the test with a visible reason."""
    mirror = os.environ.get("AIAYN_DATA_MIRROR")
    if not mirror:
        pytest.skip("AIAYN_DATA_MIRROR is not set (real-data test; `make test` sets it when ../shared/data exists)")
    return mirror
