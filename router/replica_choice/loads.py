"""A replica's load as the router sees it (pure): its last report, read defensively, plus
what this router's pending tally adds and takes off. The reasoning: docs/design.md,
"Replica choice: Serve request routers fed by replica reports".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ReplicaId = str


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's load as the router sees it: its last report plus its pending sends."""

    replica_id: ReplicaId
    queued_prefill_tokens: int = 0
    running_seqs: int = 0
    waiting_seqs: int = 0
    kv_usage: float = 0.0
    max_num_seqs: int | None = None
    stale: bool = False
    dead: bool = False           # its engine died; the replica lives until Serve replaces it
    pending_tokens: int = 0
    pending_requests: int = 0
    finished_tokens: int = 0     # of requests the report counts that have since completed
    finished_requests: int = 0

    @property
    def prefill_queue(self) -> int:
        return max(0, self.queued_prefill_tokens - self.finished_tokens) + self.pending_tokens

    @property
    def sequences(self) -> int:
        reported = self.running_seqs + self.waiting_seqs
        return max(0, reported - self.finished_requests) + self.pending_requests


def load_from_stats(
    replica_id: ReplicaId,
    stats: Mapping[str, object] | None,
    *,
    now: float,
    stale_after_s: float,
    pending_tokens: int = 0,
    pending_requests: int = 0,
    finished_tokens: int = 0,
    finished_requests: int = 0,
) -> ReplicaLoad:
    """Read a replica's routing-stats dict (``cluster.engine.routing_stats``) defensively.

    Missing keys read as zero (a replica that has not reported yet is empty); a value of
    the wrong type reads as missing. Stale: the report carries ``reported_at`` and it is
    older than ``stale_after_s``, or its engine has not stepped for longer with requests
    in it. Dead: the replica reported that its engine died.
    """
    stats = stats or {}
    reported_at = _number(stats.get("reported_at"))
    max_num_seqs = _number(stats.get("max_num_seqs"))
    return ReplicaLoad(
        replica_id=replica_id,
        queued_prefill_tokens=max(0, int(_number(stats.get("queued_prefill_tokens")) or 0)),
        running_seqs=max(0, int(_number(stats.get("running_seqs")) or 0)),
        waiting_seqs=max(0, int(_number(stats.get("waiting_seqs")) or 0)),
        kv_usage=min(1.0, max(0.0, float(_number(stats.get("kv_usage")) or 0.0))),
        max_num_seqs=int(max_num_seqs) if max_num_seqs and max_num_seqs >= 1 else None,
        stale=((reported_at is not None and now - reported_at > stale_after_s)
               or (_number(stats.get("engine_stalled_s")) or 0.0) > stale_after_s),
        dead=bool(_number(stats.get("engine_dead"))),
        pending_tokens=pending_tokens,
        pending_requests=pending_requests,
        finished_tokens=finished_tokens,
        finished_requests=finished_requests,
    )


def reported_at_of(stats: Mapping[str, object] | None) -> float | None:
    return _number((stats or {}).get("reported_at"))


def finished_of(stats: Mapping[str, object] | None) -> int | None:
    """The report's finished-requests counter (None: absent or not a number)."""
    finished = _number((stats or {}).get("requests_finished"))
    return None if finished is None else int(finished)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)

