"""Which engine replica gets a request (pure): prefix affinity for prefill, least load for decode.

Prefill. A prompt whose leading blocks a prefill engine already holds in its prefix cache
costs that engine only the rest of the prompt. The router therefore remembers, per chain of
leading token blocks, which replica prefilled it last (``PrefixIndex``), and sends a request
where ``queued prefill tokens + tokens it would still have to compute`` is smallest. The
affinity bonus is exactly the prefill it saves, never more, so a hot prefix stays on one
replica only while that replica's queue is shorter than the others' by less than the saved
work; beyond ``max_imbalance_tokens`` of extra queue the bonus is dropped altogether.

Decode. Least loaded by reported KV-cache use and running/waiting sequences, relative to the
engine's ``max_num_seqs``; a replica whose KV cache is above a high-water mark goes last
(another stream there would push it into preemption). A decode engine pulls over NIXL only
the blocks its prefix cache lacks, so a replica believed to hold the prompt's head (it was
sent that prefix last) gets a bonus for the transfer it saves: the share of the prompt it
holds, worth at most ``affinity_slots`` sequence slots. The bonus sits below the load
terms: a stream goes to a replica at most that many streams busier than the least loaded.

Both. Replicas report their load periodically (Serve's routing stats, ~1 s), so a burst
routed between two reports would all see the same numbers and pile onto one replica. The
router keeps a ``PendingTally`` of what it sent that the replica has not reported yet: an
entry goes when the request completes or when a report timed after it arrives. The other
way round too: a request the last report counted that has completed since is taken off
that report until the next one, or a replica that just finished a conversation's turn would
look a stream busier than it is when the next turn arrives.

Missing and stale stats. A replica that has not reported yet (just started) counts as empty:
it is, and this router's own pending tally keeps it from being flooded until its first
report. A replica whose last report is older than ``stale_after_s`` (it stopped answering
the stats call: hung or overloaded) is ranked after every replica with a current report,
and so is one whose report says its engine has held requests without a step for longer
(a hung engine under a live replica, whose other figures are frozen: read as they are,
they would draw requests to it once its streams had gone elsewhere).

Many routers. Each router replica knows only its own sends since the last report, so a
deterministic "least loaded first" sends every router's next request to the same replica:
hundreds of routers herd onto it between two reports. When other routers send to the pool
too (``OtherRouters`` estimates how many requests a report period), the first choice is
drawn at random among the best-ranked tier, each replica with the share a central
dispatcher would give it: the requests expected before the next report, this one included,
poured over the replicas' loads lowest first (``water_fill_shares``). All routers drawing
independently from those shares fill the pool as one dispatcher would; one router alone
(no others) keeps the deterministic ranking.

Nothing here reads a clock or a global random source: ``now`` and an optional
``random.Random`` (for tie-breaks and the draw) are passed in, so a decision replays
exactly in a test.
"""

from __future__ import annotations

import random
import statistics
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.config import DecodeRoutingConfig, PrefillRoutingConfig

ReplicaId = str
BlockHash = int


# ---------------------------------------------------------------------------------------
# Prefix hashing and the prefix → replica index


def prefix_block_hashes(
    token_ids: Sequence[int], block_size: int, max_blocks: int = 64,
    known: Sequence[BlockHash] = (),
) -> tuple[BlockHash, ...]:
    """Hash chain over the prompt's leading full blocks: ``h_i = H(h_{i-1}, block_i)``.

    ``h_i`` identifies the whole prefix up to block ``i``, so two prompts share ``h_i``
    exactly when (up to hash collisions) they share their first ``i + 1`` blocks. Only
    full blocks count, as an engine's prefix cache only reuses full blocks; at most
    ``max_blocks`` are hashed, bounding the work per request. ``known``: the chain of a
    prefix of ``token_ids`` already hashed (a prompt's, for its prompt and answer), which
    the chain goes on from instead of hashing those blocks again.

    ``hash`` of a tuple of ints is not salted by PYTHONHASHSEED, so the chain is the same in
    every process of one Python version; it is ~7x cheaper than a cryptographic hash, and a
    collision costs only a misplaced cache hint.
    """
    if block_size < 1 or max_blocks < 0:
        raise ValueError("block_size >= 1 and max_blocks >= 0 required")
    num_blocks = min(len(token_ids) // block_size, max_blocks)
    hashes = list(known[:num_blocks])
    previous = hashes[-1] if hashes else 0
    for start in range(len(hashes) * block_size, num_blocks * block_size, block_size):
        previous = hash((previous, *token_ids[start:start + block_size]))
        hashes.append(previous)
    return tuple(hashes)


class ChainMemo:
    """The hash chains of the last few prompts, by the identity of their token tuple.

    One request's prompt is one tuple in the router's process, hashed by several readers
    of one belief (which replica holds its head: the path choice, then the decode router's
    ranking and its record of where the prompt went): up to 512 blocks, ~0.1 ms at 8K
    tokens, each time. The memo keeps a reference to each tuple it holds, so no other
    object can take its id while it is there. Not thread-safe: its owner guards it.
    """

    def __init__(self, size: int = 64):
        self._size = size
        # (id of the tuple, block size, blocks) -> (the tuple, its chain)
        self._chains: OrderedDict[tuple[int, int, int],
                                  tuple[Sequence[int], tuple[BlockHash, ...]]] = OrderedDict()

    def chain(self, token_ids: Sequence[int], block_size: int,
              max_blocks: int) -> tuple[BlockHash, ...]:
        """``prefix_block_hashes(token_ids, block_size, max_blocks)``, computed once per
        tuple (a list is hashed every time: it may change)."""
        if not isinstance(token_ids, tuple):
            return prefix_block_hashes(token_ids, block_size, max_blocks)
        key = (id(token_ids), block_size, max_blocks)
        kept = self._chains.get(key)
        if kept is not None and kept[0] is token_ids:
            self._chains.move_to_end(key)
            return kept[1]
        chain = prefix_block_hashes(token_ids, block_size, max_blocks)
        self._chains[key] = (token_ids, chain)
        while len(self._chains) > self._size:
            self._chains.popitem(last=False)
        return chain


class PrefixIndex:
    """Bounded LRU map: block-chain hash → the replica that last prefilled that prefix.

    It is the router's belief about the engines' prefix caches, not their truth: engines
    evict on their own. Size ``capacity`` (in blocks) around the pool's total prefix-cache
    blocks; a larger index only remembers prefixes the engines have already dropped.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._owner: OrderedDict[BlockHash, ReplicaId] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def match(self, hashes: Sequence[BlockHash]) -> dict[ReplicaId, int]:
        """Per replica, how many leading blocks of this chain it is believed to hold.

        A replica recorded for ``h_i`` prefilled the whole prefix up to block ``i``, so its
        match is the deepest such ``i`` (+1), even if shallower entries were taken over by
        another replica or evicted. Reading does not refresh recency: only routing does.
        """
        matched: dict[ReplicaId, int] = {}
        for depth, block_hash in enumerate(hashes, start=1):
            owner = self._owner.get(block_hash)
            if owner is not None:
                matched[owner] = depth
        return matched

    def record(self, hashes: Sequence[BlockHash], replica_id: ReplicaId) -> None:
        """``replica_id`` has (been sent to) prefill this chain: it now owns every block."""
        for block_hash in hashes:
            self._owner[block_hash] = replica_id
            self._owner.move_to_end(block_hash)
        while len(self._owner) > self.capacity:
            self._owner.popitem(last=False)

    def forget(self, replica_id: ReplicaId) -> None:
        """Drop a replica that left the pool (its cache went with it)."""
        for block_hash in [h for h, owner in self._owner.items() if owner == replica_id]:
            del self._owner[block_hash]


class DecodeCacheBelief:
    """What each decode replica is believed to hold in its prefix cache: the prompts routed
    to it and, once a request has finished there, its prompt and answer (the engine cached
    the answer's blocks as it generated them, so the next turn of the conversation finds
    them). Not thread-safe: router/decode_prefixes.py guards it.
    """

    def __init__(self, block_size: int, max_blocks: int, capacity: int,
                 max_requests: int = 10_000):
        self.block_size = block_size
        self.max_blocks = max_blocks
        self._index = PrefixIndex(capacity)
        self._chains = ChainMemo()
        self._routed: OrderedDict[str, ReplicaId] = OrderedDict()
        self._max_requests = max_requests

    @property
    def settings(self) -> tuple[int, int, int]:
        """What two beliefs must share to be one (block size, blocks hashed, capacity)."""
        return self.block_size, self.max_blocks, self._index.capacity

    def hashes(self, token_ids: Sequence[int]) -> tuple[BlockHash, ...]:
        return self._chains.chain(token_ids, self.block_size, self.max_blocks)

    def match(self, token_ids: Sequence[int]) -> dict[ReplicaId, int]:
        """Per replica, how many leading blocks of ``token_ids`` it is believed to hold."""
        return self.match_chain(self.hashes(token_ids))

    def holder(self, token_ids: Sequence[int]) -> tuple[ReplicaId | None, int]:
        """The replica believed to hold the longest head of ``token_ids``, and how many
        tokens of it (``(None, 0)``: none holds a whole block)."""
        return self.holder_of_chain(self.hashes(token_ids), len(token_ids))

    def routed(self, request_id: str, token_ids: Sequence[int], replica: ReplicaId) -> None:
        """``request_id`` went to ``replica``, which will hold its prompt."""
        self.routed_chain(request_id, self.hashes(token_ids), replica)

    def finished(self, request_id: str, sequence: Sequence[int],
                 prompt: Sequence[int] = ()) -> None:
        """``request_id`` ended with ``sequence`` (prompt and answer) computed on the replica
        it was routed to (unknown, or forgotten: nothing recorded). The last generated
        token was never fed back, so its KV does not exist: it is left out. ``prompt``, the
        head of ``sequence`` the request was routed with, spares hashing it again."""
        if request_id in self._routed:
            known = self.hashes(prompt) if prompt else ()
            self.finished_chain(request_id, prefix_block_hashes(
                sequence[:-1], self.block_size, self.max_blocks, known))

    # The same, given the prompt's chain of block hashes instead of its tokens (the
    # planner's simulator, tools/planner/des.py, has prompts as chains, not tokens).

    def match_chain(self, chain: Sequence[BlockHash]) -> dict[ReplicaId, int]:
        return self._index.match(chain[:self.max_blocks])

    def holder_of_chain(self, chain: Sequence[BlockHash],
                        prompt_tokens: int) -> tuple[ReplicaId | None, int]:
        matched = self.match_chain(chain)
        if not matched:
            return None, 0
        replica = max(sorted(matched), key=lambda r: matched[r])
        return replica, min(matched[replica] * self.block_size, prompt_tokens)

    def routed_chain(self, request_id: str, chain: Sequence[BlockHash],
                     replica: ReplicaId) -> None:
        self._index.record(chain[:self.max_blocks], replica)
        self._routed[request_id] = replica
        self._routed.move_to_end(request_id)
        while len(self._routed) > self._max_requests:
            self._routed.popitem(last=False)

    def finished_chain(self, request_id: str, chain: Sequence[BlockHash]) -> None:
        """``chain``: of the prompt and answer, less the answer's last token."""
        replica = self._routed.pop(request_id, None)
        if replica is not None:
            self._index.record(chain[:self.max_blocks], replica)

    def forget(self, replica: ReplicaId) -> None:
        """A replica that left the pool (its cache went with it)."""
        self._index.forget(replica)
        for request_id in [r for r, owner in self._routed.items() if owner == replica]:
            del self._routed[request_id]


# ---------------------------------------------------------------------------------------
# What this router sent that the replicas have not reported yet


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


# ---------------------------------------------------------------------------------------
# Replica load: a report plus the local tally


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


def _tie_breaks(loads: Sequence[ReplicaLoad], rng: random.Random | None) -> dict[str, object]:
    """Equal scores are broken by replica id, or at random when ``rng`` is given (several
    router replicas would otherwise all send their first request to the same replica)."""
    if rng is None:
        return {load.replica_id: load.replica_id for load in loads}
    return {load.replica_id: rng.random() for load in loads}


# ---------------------------------------------------------------------------------------
# Many routers: the share of the requests to come that each replica should take


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


def _draw_first(ranking: list[ReplicaLoad], in_draw: int, levels: Mapping[ReplicaId, float],
                amount: float, rng: random.Random,
                weights: Mapping[ReplicaId, float] | None = None) -> list[ReplicaLoad]:
    """``ranking`` with one of its first ``in_draw`` replicas, drawn by its water-fill
    share of ``amount``, moved to the front (the rest keep their order)."""
    shares = water_fill_shares({load.replica_id: levels[load.replica_id]
                                for load in ranking[:in_draw]}, amount, weights)
    point, total = rng.random(), 0.0
    for position, load in enumerate(ranking[:in_draw]):
        total += shares.get(load.replica_id, 0.0)
        if point < total:
            return [load, *ranking[:position], *ranking[position + 1:]]
    return ranking   # rounding left the point past the last share: keep the best


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


# ---------------------------------------------------------------------------------------
# Prefill: prefix affinity weighed against queued prefill work


@dataclass(frozen=True)
class PrefillPolicy:
    """The prefill ranking's tunables. Built with :meth:`from_config`: defaults and
    validation live in ``router.routing.prefill`` (``PrefillRoutingConfig``)."""

    block_size: int                   # the engines' KV block size (tokens)
    max_blocks: int                   # leading blocks hashed per prompt
    max_imbalance_tokens: int         # most extra queue an affinity replica may have
    index_capacity: int               # blocks remembered by the PrefixIndex
    stale_after_s: float              # a report older than this ranks its replica last
    spread: bool = True               # draw the first choice when other routers send too

    @classmethod
    def from_config(cls, config: PrefillRoutingConfig, block_size: int) -> PrefillPolicy:
        """The policy of ``router.routing.prefill`` for engines of ``block_size`` (the
        validated ``engine.block_size``: prefixes are hashed in the engines' blocks)."""
        return cls(block_size=block_size, max_blocks=config.max_blocks,
                   max_imbalance_tokens=config.max_imbalance_tokens,
                   index_capacity=config.index_capacity, stale_after_s=config.stale_after_s,
                   spread=config.spread)


@dataclass(frozen=True)
class PrefillChoice:
    ranking: tuple[ReplicaId, ...]  # every candidate, best first
    cached_tokens: int              # prompt tokens the first choice is believed to hold


def rank_prefill(
    prompt_tokens: int,
    matched_blocks: Mapping[ReplicaId, int],
    loads: Sequence[ReplicaLoad],
    policy: PrefillPolicy,
    rng: random.Random | None = None,
    others: float = 0.0,
    avoid: Collection[ReplicaId] = (),
) -> PrefillChoice:
    """Rank replicas by estimated prefill cost: queued tokens + tokens still to compute.

    A replica holding ``m`` blocks of the prompt saves ``m * block_size`` tokens (the engine
    recomputes at least the last prompt token). That saving is dropped for a replica whose
    queue exceeds the shortest current queue by more than ``max_imbalance_tokens``, so the
    first choice's queue never exceeds the shortest by more than
    ``min(max_imbalance_tokens, its saving)``. Ties prefer the larger saving, then the
    shorter queue. Replicas with stale stats come last, after them those in ``avoid`` (an
    earlier attempt of this request failed there), and those with a dead engine after
    them all (tried only when nothing else is left).

    ``others``: the requests other routers send the pool per report period
    (``OtherRouters``). When it is above 0, ``rng`` is given and the policy spreads, the
    first choice is drawn among the current replicas by their share of that many prompts
    like this one (and this one) poured over their estimated costs, lowest first
    (``water_fill_shares``).
    """
    if not loads:
        return PrefillChoice((), 0)
    current = [load for load in loads if not (load.stale or load.dead)] or list(loads)
    shortest = min(load.prefill_queue for load in current)
    tie = _tie_breaks(loads, rng)

    def saving(load: ReplicaLoad) -> int:
        if load.prefill_queue - shortest > policy.max_imbalance_tokens:
            return 0
        cached = matched_blocks.get(load.replica_id, 0) * policy.block_size
        return max(0, min(cached, prompt_tokens - 1))

    def key(load: ReplicaLoad):
        saved = saving(load)
        cost = load.prefill_queue + prompt_tokens - saved
        return (load.dead, load.replica_id in avoid, load.stale, cost, -saved,
                load.prefill_queue, tie[load.replica_id])

    keys = {load.replica_id: key(load) for load in loads}
    ranked = sorted(loads, key=lambda load: keys[load.replica_id])
    if policy.spread and others > 0 and rng is not None and prompt_tokens > 0:
        tier = keys[ranked[0].replica_id][:3]     # dead, avoided, stale
        in_draw = sum(1 for load in ranked if keys[load.replica_id][:3] == tier)
        # keys[r][3]: the estimated cost
        levels = {load.replica_id: keys[load.replica_id][3] / prompt_tokens
                  for load in ranked[:in_draw]}
        ranked = _draw_first(ranked, in_draw, levels, others + 1, rng)
    return PrefillChoice(tuple(load.replica_id for load in ranked), saving(ranked[0]))


# ---------------------------------------------------------------------------------------
# Decode: least loaded by KV use and sequences


@dataclass(frozen=True)
class DecodePolicy:
    """The decode ranking's tunables. Built with :meth:`from_config`: defaults and
    validation live in ``router.routing.decode`` (``DecodeRoutingConfig``)."""

    kv_weight: float                  # a full KV cache weighs as much as max_num_seqs streams
    kv_high_water: float              # above this, a replica is ranked after the others
    default_max_num_seqs: int         # when a replica does not report its own
    stale_after_s: float              # a report older than this ranks its replica last
    affinity_slots: float = 0.0       # a replica holding the whole prompt: this many slots
    block_size: int = 16              # the engines' KV block size (prefixes are hashed in it)
    max_blocks: int = 512             # leading blocks hashed per prompt (and answer)
    index_capacity: int = 100_000     # blocks remembered by the decode PrefixIndex
    spread: bool = True               # draw the first choice when other routers send too

    @classmethod
    def from_config(cls, config: DecodeRoutingConfig, max_num_seqs: int,
                    block_size: int = 16) -> DecodePolicy:
        """The policy of ``router.routing.decode`` for engines of ``max_num_seqs`` (what the
        pool's engines run with; replicas report their own, this covers the first second)
        and KV blocks of ``block_size``."""
        return cls(kv_weight=config.kv_weight, kv_high_water=config.kv_high_water,
                   default_max_num_seqs=max_num_seqs, stale_after_s=config.stale_after_s,
                   affinity_slots=config.prefix_affinity_slots, block_size=block_size,
                   max_blocks=config.max_blocks, index_capacity=config.index_capacity,
                   spread=config.spread)


def decode_score(load: ReplicaLoad, policy: DecodePolicy) -> float:
    """Load in [0, ~1 + kv_weight]: share of sequence slots in use plus weighted KV use.

    Sequences count running, waiting (the engine has no room for them yet) and this
    router's unreported sends.
    """
    max_num_seqs = load.max_num_seqs or policy.default_max_num_seqs
    return load.sequences / max_num_seqs + policy.kv_weight * load.kv_usage


def affinity_bonus(load: ReplicaLoad, matched_blocks: int, prompt_tokens: int,
                   policy: DecodePolicy) -> float:
    """What holding ``matched_blocks`` of a ``prompt_tokens`` prompt is worth, in the units
    of ``decode_score``: the share of the prompt's KV the pull would not move, times
    ``affinity_slots`` sequence slots."""
    if prompt_tokens <= 0 or matched_blocks <= 0 or policy.affinity_slots <= 0:
        return 0.0
    held = min(matched_blocks * policy.block_size, prompt_tokens) / prompt_tokens
    return held * policy.affinity_slots / (load.max_num_seqs or policy.default_max_num_seqs)


def rank_decode(
    loads: Sequence[ReplicaLoad], policy: DecodePolicy, rng: random.Random | None = None,
    matched_blocks: Mapping[ReplicaId, int] | None = None, prompt_tokens: int = 0,
    pinned: ReplicaId | None = None, others: float = 0.0,
    avoid: Collection[ReplicaId] = (),
) -> tuple[ReplicaId, ...]:
    """Every candidate, least loaded first (less the prefix-affinity bonus of the blocks
    ``matched_blocks`` says a replica holds of this ``prompt_tokens`` prompt; a tie goes
    to the larger bonus); above the KV high-water mark next; stale after them; then those
    in ``avoid`` (an earlier attempt of this request failed there: a hung engine reports
    the load it had when it stopped); a replica whose engine died last of all.

    ``pinned``: the replica whose prefix cache made this request decode-local
    (router/disaggregation.py) comes first among the live, fresh, not full ones, whatever
    its load: anywhere else the engine would prefill the whole prompt.

    ``others``: the requests other routers send the pool per report period
    (``OtherRouters``). When it is above 0, ``rng`` is given and the policy spreads, the
    first choice (unless pinned) is drawn among the best tier by its share of that many
    streams (and this one) poured over the replicas' scores less their bonus, lowest
    first, each stream taking a sequence slot (``water_fill_shares``)."""
    tie = _tie_breaks(loads, rng)
    matched = matched_blocks or {}

    def key(load: ReplicaLoad):
        full = load.kv_usage >= policy.kv_high_water
        bonus = affinity_bonus(load, matched.get(load.replica_id, 0), prompt_tokens, policy)
        return (load.dead, load.replica_id in avoid, load.stale, full,
                load.replica_id != pinned, decode_score(load, policy) - bonus, -bonus,
                tie[load.replica_id])

    keys = {load.replica_id: key(load) for load in loads}
    ranked = sorted(loads, key=lambda load: keys[load.replica_id])
    first = keys[ranked[0].replica_id][:5] if ranked else ()
    if policy.spread and others > 0 and rng is not None and first and first[4]:  # unpinned
        in_draw = sum(1 for load in ranked if keys[load.replica_id][:5] == first)
        slots = {load.replica_id: load.max_num_seqs or policy.default_max_num_seqs
                 for load in ranked[:in_draw]}
        # keys[r][5]: the score less the affinity bonus
        levels = {r: keys[r][5] for r in slots}
        ranked = _draw_first(ranked, in_draw, levels, others + 1, rng, slots)
    return tuple(load.replica_id for load in ranked)
