"""Recording the catalogue's metrics (shell: writes through ``ray.util.metrics``).

``Recorder`` creates each metric of cluster/metrics.py in this process on first use;
``Counts`` gathers an engine's per-step increments in memory for a thread to flush.
"""

from __future__ import annotations

import threading

from cluster.metrics import EXACT_SUMS, MetricSpec


class Recorder:
    """Creates the catalogue's metrics in this process on first use and records to them.

    Only this class touches ``ray.util.metrics``; metrics are created lazily because Ray
    registers them with the worker process that first creates them.
    """

    def __init__(self) -> None:
        self._metrics: dict[str, object] = {}

    def _metric(self, spec: MetricSpec):
        metric = self._metrics.get(spec.name)
        if metric is None:
            from ray.util import metrics

            if spec.kind == "counter":
                metric = metrics.Counter(spec.name, spec.description, tag_keys=spec.tags)
            elif spec.kind == "gauge":
                metric = metrics.Gauge(spec.name, spec.description, tag_keys=spec.tags)
            else:
                metric = metrics.Histogram(spec.name, spec.description,
                                           boundaries=list(spec.buckets), tag_keys=spec.tags)
            self._metrics[spec.name] = metric
        return metric

    def inc(self, spec: MetricSpec, tags: dict[str, str], value: float = 1.0) -> None:
        if value > 0:
            self._metric(spec).inc(value, tags=tags)

    def set(self, spec: MetricSpec, tags: dict[str, str], value: float) -> None:
        self._metric(spec).set(value, tags=tags)

    def observe(self, spec: MetricSpec, tags: dict[str, str], value: float) -> None:
        self._metric(spec).observe(value, tags=tags)
        exact_sum = EXACT_SUMS.get(spec.name)
        if exact_sum is not None:
            self.inc(exact_sum, tags, value)


class Counts:
    """Counter increments and histogram observations gathered in memory, handed to Ray's
    metrics by ``flush``.

    A Ray counter's ``inc`` costs far more Python than an engine step can spare for it (1 to 2%
    of a decode replica's py-spy samples under streaming load): engines add
    their per-step counts here, and a thread of the replica flushes them a few times per
    export period. Observations made on a request's way to its first token wait here too,
    so that the token does not wait for them. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[MetricSpec, tuple[tuple[str, str], ...]], float] = {}
        self._observations: list[tuple[MetricSpec, dict[str, str], float]] = []

    def add(self, spec: MetricSpec, tags: dict[str, str], value: float) -> None:
        if value > 0:
            key = (spec, tuple(sorted(tags.items())))
            with self._lock:
                self._pending[key] = self._pending.get(key, 0.0) + value

    def observe(self, spec: MetricSpec, tags: dict[str, str], value: float) -> None:
        with self._lock:
            self._observations.append((spec, tags, value))

    def flush(self, recorder: Recorder) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            observations, self._observations = self._observations, []
        for (spec, tags), value in pending.items():
            recorder.inc(spec, dict(tags), value)
        for spec, tags, value in observations:
            recorder.observe(spec, tags, value)
