"""Settings shared by every test tier."""

import os

import pytest
from hypothesis import settings

# Property tests check behaviour, not speed: on two shared cores an example can take more
# than Hypothesis's default 200 ms deadline while another process runs, which only flakes.
settings.register_profile("pdserve", deadline=None)
settings.load_profile("pdserve")

# Ray's workers export their metrics every 10 s by default, and a test that counts what a
# cluster did waits until an export period and an engine's flush have passed with nothing
# new (SETTLE_S, tests/integration/prometheus.py).
# Every cluster the tests start (and this process, for Ray's own config) inherits a 3 s
# period instead, which Ray supports down to 1 s; the gauges' time to live follows it
# (twice the period). Set before anything reads Ray's config, which caches it.
os.environ.setdefault("RAY_metrics_report_interval_ms", "3000")

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
