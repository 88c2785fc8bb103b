"""Reading pdserve's metrics as Prometheus scrapes them, for tests."""

from __future__ import annotations

from collections import defaultdict

import httpx
from prometheus_client.parser import text_string_to_metric_families

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


def by_process(url: str, name: str, **labels: str) -> dict[str, float]:
    """``name``'s samples that carry all of ``labels``, summed per Ray worker process
    (``WorkerId``): which replica counted what, for a failure's message."""
    wanted = set(labels.items())
    counts: dict[str, float] = defaultdict(float)
    for key, value in scrape(url, keep=(*PDSERVE_LABELS, "WorkerId")).get(name, {}).items():
        if wanted <= set(key):
            counts[dict(key).get("WorkerId", "?")[:8]] += value
    return dict(counts)
