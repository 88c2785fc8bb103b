"""A stand-in for ``cluster.recorder.Recorder`` that keeps what it was asked to record (the
real one creates Ray metrics), for tests of what pdserve counts."""

from __future__ import annotations

from cluster import metrics as m


class FakeRecorder:
    """Every count and observation, in order, as (metric name, tags, value)."""

    def __init__(self):
        self.counted: list[tuple[str, dict, float]] = []
        self.observed: list[tuple[str, dict, float]] = []

    def inc(self, spec, tags, value=1.0):
        self.counted.append((spec.name, dict(tags), value))

    def observe(self, spec, tags, value):
        self.observed.append((spec.name, dict(tags), value))

    def requests(self) -> list[dict]:
        return [tags for name, tags, _ in self.counted if name == m.REQUESTS.name]
