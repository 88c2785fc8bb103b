"""Reading pdserve's metrics as Prometheus scrapes them, for tests."""

from __future__ import annotations

import time
from collections import defaultdict

import httpx
import ray
from prometheus_client.parser import text_string_to_metric_families

from cluster.metrics import settle_s
from tests.integration.conftest import wait_for

# A counter unchanged for longer has nothing counted before still on its way, at the
# export period of Ray's workers (tests/conftest.py shortens it).
SETTLE_S = settle_s(ray._config.metrics_report_interval_ms() / 1000)

# pdserve's own labels; Ray adds per-process ones (WorkerId, ...), over which samples sum.
PDSERVE_LABELS = ("model", "version", "pool", "outcome", "source", "action", "stage",
                  "reason", "le", "path", "result", "kind")


def scrape(url: str, keep: tuple[str, ...] = PDSERVE_LABELS) -> dict[str, dict[tuple, float]]:
    """pdserve samples summed over the labels not in ``keep`` (by default Ray's per-process
    ones): name -> {sorted labels: value}."""
    text = httpx.get(url, timeout=30).text
    sums: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("ray_pdserve_"):
                continue
            labels = tuple(sorted((k, v) for k, v in sample.labels.items()
                                  if k in keep))
            sums[sample.name][labels] += sample.value
    return sums


def total(sums, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry all of ``labels``."""
    wanted = set(labels.items())
    return sum(value for key, value in sums.get(name, {}).items() if wanted <= set(key))


def settled_scrape(url: str, *names: str, deadline_s: float = 90,
                   **labels: str) -> dict[str, dict[tuple, float]]:
    """A scrape once the totals of ``names`` (their samples with ``labels``) have stayed
    unchanged for ``SETTLE_S``: nothing counted before is still on its way. (Only those
    totals: others move on their own on an idle cluster, such as the canary gate's count
    of its periodic "hold" decisions.) Fails if they have not settled by ``deadline_s``."""
    def totals(sums) -> list[float]:
        return [total(sums, name, **labels) for name in names]

    seen = {"scrape": scrape(url), "since": time.monotonic()}

    def unchanged_long_enough() -> bool:
        current = scrape(url)
        if totals(current) != totals(seen["scrape"]):
            seen["since"] = time.monotonic()
        seen["scrape"] = current
        return time.monotonic() - seen["since"] > SETTLE_S

    wait_for(unchanged_long_enough, f"{', '.join(names)} settled", deadline_s)
    return seen["scrape"]


def by_process(url: str, name: str, **labels: str) -> dict[str, float]:
    """``name``'s samples that carry all of ``labels``, summed per Ray worker process
    (``WorkerId``): which replica counted what, for a failure's message."""
    wanted = set(labels.items())
    counts: dict[str, float] = defaultdict(float)
    for key, value in scrape(url, keep=(*PDSERVE_LABELS, "WorkerId")).get(name, {}).items():
        if wanted <= set(key):
            counts[dict(key).get("WorkerId", "?")[:8]] += value
    return dict(counts)
