"""Settings shared by every test tier."""

import pytest
from hypothesis import settings

# Property tests check behaviour, not speed: on two shared cores an example can take more
# than Hypothesis's default 200 ms deadline while another process runs, which only flakes.
settings.register_profile("pdserve", deadline=None)
settings.load_profile("pdserve")

# `make test` runs the suites with clusters of their own on tests/integration only (it
# collects 4x faster than the whole tree): a test so marked elsewhere would never run.
OWN_CLUSTER_MARKS = ("multinode", "faults", "levers", "bench")


def pytest_collection_modifyitems(config, items):
    integration = config.rootpath / "tests" / "integration"
    for item in items:
        marked = [mark for mark in OWN_CLUSTER_MARKS if item.get_closest_marker(mark)]
        if marked and integration not in item.path.parents:
            raise pytest.UsageError(f"{item.nodeid} is marked {marked[0]}: it belongs in "
                             "tests/integration, where `make test` looks for it")
