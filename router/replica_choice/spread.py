"""Many routers (pure): how many requests the pool's other routers send it, and how the
requests to come divide among its replicas. The reasoning: docs/design.md, "Replica choice:
Serve request routers fed by replica reports", the bullet "Many routers draw their first choice".
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping

from router.replica_choice.loads import ReplicaId


def water_fill_shares(levels: Mapping[ReplicaId, float], amount: float,
                      weights: Mapping[ReplicaId, float] | None = None
                      ) -> dict[ReplicaId, float]:
    """How ``amount`` units of work poured over replicas at ``levels`` divide among them.

    The lowest fill first, up to the common level ``h`` where ``sum(max(0, h - level) *
    weight) = amount`` (a unit raises a replica of weight ``w`` by ``1 / w``: a replica
    with twice the sequence slots takes twice the requests per level). Returns each
    replica's share of ``amount`` (they sum to 1); replicas above ``h`` are left out.
    """
    if amount <= 0 or not levels:
        raise ValueError("amount > 0 and at least one replica required")
    weight = {r: (weights or {}).get(r, 1.0) for r in levels}
    ordered = sorted(levels, key=lambda r: levels[r])
    filled_weight = filled_work = 0.0
    level = 0.0
    for count, replica in enumerate(ordered, start=1):
        filled_weight += weight[replica]
        filled_work += levels[replica] * weight[replica]
        level = (amount + filled_work) / filled_weight
        if count == len(ordered) or level <= levels[ordered[count]]:
            break
    return {r: (level - levels[r]) * weight[r] / amount
            for r in ordered if level > levels[r]}


# Reports of a replica (less one) before OtherRouters counts it: two, so that a request
# counted across a report's boundary is at most half a request a period.
MIN_REPORT_GAPS = 2


class OtherRouters:
    """How many requests the pool's other routers send it per report period (pure).

    Each replica's report carries its finished-requests counter. Between two reports of a
    replica, the requests it finished less those of this router's that completed there
    (Serve tells each router of its own) are the other routers' requests: no need to
    know how many routers there are, and one router alone counts none. Each replica's
    count is kept over a window of ``horizon_s``, and nothing is estimated for a replica
    until ``MIN_REPORT_GAPS`` gaps between its reports are in it: a request of this
    router's that the engine had counted before a report but that completed here just
    after it counts as another's for a report (the next one evens it out), which over
    the window is a fraction of a request a period, and below ``min_per_period`` counts
    as none.
    """

    def __init__(self, horizon_s: float = 10.0, min_per_period: float = 1.0):
        if horizon_s <= 0:
            raise ValueError("horizon_s must be > 0")
        self.horizon_s = horizon_s
        self.min_per_period = min_per_period
        self._last: dict[ReplicaId, tuple[float, int]] = {}   # reported_at, finished
        self._own: dict[ReplicaId, list[float]] = {}          # own completions since
        # per replica, (reported_at, the others' requests it finished so far) by report
        self._counts: dict[ReplicaId, deque[tuple[float, int]]] = {}

    def completed(self, replica_id: ReplicaId, now: float) -> None:
        """A request this router sent ``replica_id`` completed there at ``now``."""
        self._own.setdefault(replica_id, []).append(now)

    def observe(self, replica_id: ReplicaId, finished: int | None,
                reported_at: float | None) -> None:
        """One replica's report: its finished-requests counter at ``reported_at``."""
        if finished is None or reported_at is None:
            return
        last = self._last.get(replica_id)
        if last is not None and reported_at <= last[0]:
            return                  # the same report read again
        own = self._own.get(replica_id, [])
        own_since = sum(1 for at in own if at <= reported_at)
        self._own[replica_id] = [at for at in own if at > reported_at]
        self._last[replica_id] = (reported_at, finished)
        counts = self._counts.get(replica_id)
        if counts is None or last is None or finished < last[1]:
            # first report, or a new engine's counter: count from here
            self._counts[replica_id] = deque([(reported_at, 0)])
            return
        counts.append((reported_at, counts[-1][1] + finished - last[1] - own_since))
        while len(counts) > 2 and counts[1][0] <= reported_at - self.horizon_s:
            counts.popleft()

    def forget(self, replica_id: ReplicaId) -> None:
        for held in (self._last, self._own, self._counts):
            held.pop(replica_id, None)

    def estimate(self) -> float:
        """Requests the other routers sent the pool per report period, as measured: near 0
        for a router alone (what ``GET /admin/stats`` shows as ``other_routers_per_period``)."""
        rate, periods = 0.0, []
        for counts in self._counts.values():
            if len(counts) > MIN_REPORT_GAPS:
                span = counts[-1][0] - counts[0][0]
                rate += (counts[-1][1] - counts[0][1]) / span
                periods.append(span / (len(counts) - 1))
        return rate * statistics.fmean(periods) if periods else 0.0

    def per_period(self) -> float:
        """Requests the other routers are expected to send the pool in one report period
        (the estimate; below ``min_per_period``, none)."""
        return self.counted(self.estimate())

    def counted(self, estimate: float) -> float:
        """What of an ``estimate`` the draw counts: below ``min_per_period``, none."""
        return estimate if estimate >= self.min_per_period else 0.0

