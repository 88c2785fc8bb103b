"""What this router sent that the replicas have not reported yet (pure), and what completed
that a report still counts. The reasoning: docs/design.md, "Replica choice: Serve request
routers fed by replica reports", the bullet "Completions since the report".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from router.replica_choice.loads import ReplicaId


@dataclass(frozen=True)
class _Pending:
    replica_id: ReplicaId
    tokens: int
    sent_at: float
    finished_at: float | None = None


class PendingTally:
    """What this router sent per replica, against what the replica's last report says.

    A report is up to a period old, so two corrections bridge it:

    - pending: sent, and the report does not include it yet. The entry leaves when its
      request completes, when a report taken after the send is read (the report counts the
      request itself), or after ``max_age_s`` whatever happens (a guard against entries of
      requests cancelled before they reached a replica that never reports).
    - finished: completed, and the last report still counts it (it was taken between the
      send and the completion). Without this a replica that just finished a stream looks
      one stream busier until its next report, which outweighs the prefix-affinity bonus
      of the conversation whose next turn arrives at once. The entry leaves when a report
      taken after the completion is read, or after ``max_age_s``.

    A request a report counted is remembered (without weight) until it completes, for
    ``max_running_s`` from its send at most, and a request that completed before any
    report was read since its send until one is (the report that arrives may still be
    one taken while it ran). A report taken after the engine finished a request but
    before its completion reached this router is corrected once too often: the load reads
    low by that request until the next report (floored at zero; ``ReplicaLoad``). Adding a
    key again moves it: a request re-routed after a rejection counts once.
    """

    def __init__(self, max_age_s: float = 60.0, max_running_s: float = 3600.0):
        if max_age_s <= 0 or max_running_s <= 0:
            raise ValueError("max_age_s and max_running_s must be > 0")
        self.max_age_s = max_age_s
        self.max_running_s = max_running_s
        self._pending = _Entries()          # in flight, not in the last report
        self._reported = _Entries()         # in flight, in the last report (no weight)
        self._done_unread = _Entries()      # completed while pending (no weight)
        self._finished = _Entries()         # completed, in the last report

    def add(self, key: str, replica_id: ReplicaId, tokens: int, now: float) -> None:
        self.discard(key)
        self._pending.put(key, _Pending(replica_id, tokens, now))

    def discard(self, key: str, replica_id: ReplicaId | None = None) -> None:
        """Forget ``key`` as in flight (only if it is on ``replica_id``, when given: a
        completion from a replica that rejected the request must not drop its entry on the
        next replica)."""
        self._pending.pop(key, replica_id)
        self._reported.pop(key, replica_id)

    def complete(self, key: str, replica_id: ReplicaId, now: float) -> None:
        """``key`` completed on ``replica_id`` at ``now``."""
        pending = self._pending.pop(key, replica_id)
        if pending is not None:
            self._done_unread.put(key, _finished(pending, now))
        reported = self._reported.pop(key, replica_id)
        if reported is not None:
            self._finished.put(key, _finished(reported, now))

    def observe_report(self, replica_id: ReplicaId, reported_at: float | None) -> None:
        """The replica's stats were taken at ``reported_at``: they count what it received
        before and had not finished by then."""
        if reported_at is None:
            return
        for key, entry in self._pending.take(replica_id, lambda e: e.sent_at < reported_at):
            self._reported.put(key, entry)
        self._finished.take(replica_id, lambda e: e.finished_at <= reported_at)
        for key, entry in self._done_unread.take(
                replica_id, lambda e: e.sent_at < reported_at or e.finished_at <= reported_at):
            if entry.finished_at > reported_at:
                self._finished.put(key, entry)

    def expire(self, now: float) -> None:
        self._pending.take(None, lambda e: now - e.sent_at > self.max_age_s)
        self._reported.take(None, lambda e: now - e.sent_at > self.max_running_s)
        for entries in (self._done_unread, self._finished):
            entries.take(None, lambda e: now - e.finished_at > self.max_age_s)

    def forget_replica(self, replica_id: ReplicaId) -> None:
        for entries in (self._pending, self._reported, self._done_unread, self._finished):
            entries.take(replica_id, lambda e: True)

    def tokens(self, replica_id: ReplicaId) -> int:
        return self._pending.tokens(replica_id)

    def requests(self, replica_id: ReplicaId) -> int:
        return self._pending.count(replica_id)

    def finished_tokens(self, replica_id: ReplicaId) -> int:
        return self._finished.tokens(replica_id)

    def finished_requests(self, replica_id: ReplicaId) -> int:
        return self._finished.count(replica_id)

    def __len__(self) -> int:
        return len(self._pending)


def _finished(entry: _Pending, at: float) -> _Pending:
    return _Pending(entry.replica_id, entry.tokens, entry.sent_at, at)


class _Entries:
    """Entries by key, with per-replica counts and token sums kept as they come and go
    (read for every replica at every routing decision)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Pending] = {}
        self._by_replica: dict[ReplicaId, set[str]] = {}
        self._tokens: dict[ReplicaId, int] = {}

    def put(self, key: str, entry: _Pending) -> None:
        self.pop(key)
        self._entries[key] = entry
        self._by_replica.setdefault(entry.replica_id, set()).add(key)
        self._tokens[entry.replica_id] = self._tokens.get(entry.replica_id, 0) + entry.tokens

    def pop(self, key: str, replica_id: ReplicaId | None = None) -> _Pending | None:
        """Remove and return ``key``'s entry (only if it is on ``replica_id``, when given)."""
        entry = self._entries.get(key)
        if entry is None or (replica_id is not None and entry.replica_id != replica_id):
            return None
        del self._entries[key]
        keys = self._by_replica[entry.replica_id]
        keys.discard(key)
        self._tokens[entry.replica_id] -= entry.tokens
        if not keys:
            del self._by_replica[entry.replica_id]
            del self._tokens[entry.replica_id]
        return entry

    def take(self, replica_id: ReplicaId | None, which: Callable[[_Pending], bool]
             ) -> list[tuple[str, _Pending]]:
        """Remove and return the entries (of ``replica_id``; None: of every replica) for
        which ``which`` holds."""
        keys = self._entries if replica_id is None else self._by_replica.get(replica_id, ())
        chosen = [key for key in keys if which(self._entries[key])]
        return [(key, self.pop(key)) for key in chosen]

    def tokens(self, replica_id: ReplicaId) -> int:
        return self._tokens.get(replica_id, 0)

    def count(self, replica_id: ReplicaId) -> int:
        return len(self._by_replica.get(replica_id, ()))

    def __len__(self) -> int:
        return len(self._entries)
