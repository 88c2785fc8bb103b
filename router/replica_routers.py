"""Ray Serve request routers of the two engine pools (shell around ``replica_choice``).

Serve builds one router per deployment handle and asks its ``choose_replicas`` for every
request; the answer is a strict ranking, one replica per rank. ``on_request_routed`` and
``on_request_completed`` keep the routers' own state (prefixes, pending requests) on the
router's event loop. The policies are built with ``from_config`` from Serve's
``request_router_kwargs`` (``request_router_config``): the config's ``router.routing`` and
the engines' block size or ``max_num_seqs``. Why: docs/design.md, "Replica choice: Serve
request routers fed by replica reports".
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from cluster.config import DecodeRoutingConfig, PrefillRoutingConfig, RoutingConfig
from cluster.digest import short_digest
from cluster.engine.messages import EngineRequest
from router import pool_view
from router.decode_prefixes import DecodeCacheLink
from router.replica_choice import (
    ChainMemo,
    DecodeCacheBelief,
    DecodePolicy,
    OtherRouters,
    PendingTally,
    PrefillPolicy,
    PrefixIndex,
    ReplicaLoad,
    finished_of,
    load_from_stats,
    rank_decode,
    rank_prefill,
    reported_at_of,
)

logger = logging.getLogger(__name__)

# How often replicas report (Serve calls record_routing_stats); the pending tally bridges
# the gap between reports, so shorter only costs more controller broadcasts.
ROUTING_STATS_PERIOD_S = 1.0
# A stats call slower than this is abandoned and retried by the controller.
ROUTING_STATS_TIMEOUT_S = 5.0
# request_router_kwargs key carrying a digest of this module's source (see
# request_router_config); not a policy field.
CODE_DIGEST_KEY = "router_code"


# ---------------------------------------------------------------------------------------
# Mapping between Serve's objects and the pure policy (no Ray needed: unit-tested)


def engine_request_of(pending_request: PendingRequest | None) -> EngineRequest | None:
    """The ``EngineRequest`` of a pool call (its first argument), or None for other calls
    (``stats``) that carry no prompt."""
    if pending_request is None:
        return None
    args = pending_request.args or ()
    first = args[0] if args else pending_request.kwargs.get("request")
    return first if isinstance(first, EngineRequest) else None


def request_key(pending_request: PendingRequest) -> str:
    """Serve's id of one handle call, the key of the pending tally (the same id reaches
    ``on_request_completed``)."""
    return pending_request.metadata.internal_request_id


def replica_key(replica_id: ReplicaID) -> str:
    return replica_id.unique_id


def replica_loads(
    replicas: Sequence[RunningReplica], tally: PendingTally, now: float, stale_after_s: float,
    others: OtherRouters,
) -> list[ReplicaLoad]:
    """Each replica's reported stats plus this router's pending sends to it, less the
    requests the report counted that have completed since.

    Reading a report first settles the tally entries that report already includes, and
    feeds ``others`` the replica's finished-requests counter.
    """
    loads = []
    for replica in replicas:
        key = replica_key(replica.replica_id)
        stats = replica.routing_stats
        reported_at = reported_at_of(stats)
        tally.observe_report(key, reported_at)
        others.observe(key, finished_of(stats), reported_at)
        loads.append(load_from_stats(
            key, stats, now=now, stale_after_s=stale_after_s,
            pending_tokens=tally.tokens(key), pending_requests=tally.requests(key),
            finished_tokens=tally.finished_tokens(key),
            finished_requests=tally.finished_requests(key),
        ))
    return loads


def as_ranks(
    ranking: Sequence[str], replicas: Sequence[RunningReplica]
) -> list[list[RunningReplica]]:
    """One rank per replica, in ranking order: Serve tries them strictly one by one."""
    by_key = {replica_key(r.replica_id): r for r in replicas}
    return [[by_key[key]] for key in ranking if key in by_key]


# ---------------------------------------------------------------------------------------
# The routers


class _EngineRouter(RequestRouter):
    """What both pools' routers share: the pending tally, the clock and tie-break source.

    ``initialize_state`` (which Serve calls right after construction) sets ``policy``.
    """

    policy: PrefillPolicy | DecodePolicy

    def __init__(
        self,
        *args: Any,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        **kwargs: Any,
    ):
        """Serve passes only its own keyword arguments; ``clock`` and ``rng`` are for tests.

        The clock is the wall clock because replicas stamp their reports with theirs.
        """
        super().__init__(*args, **kwargs)
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._tally = PendingTally()
        # how much the other router replicas (of other handles) send this pool
        self._others = OtherRouters()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is not None:
            # Back off between rounds when every replica is full (the default, False,
            # makes Serve retry in a tight loop).
            pending_request.routing_context.should_backoff = True
        if not candidate_replicas:
            return []
        now = self._clock()
        self._tally.expire(now)
        request = engine_request_of(pending_request)
        if pending_request is not None and request is not None:
            # A retry of this request must not see its own earlier tentative entry.
            self._tally.discard(request_key(pending_request))
        loads = replica_loads(candidate_replicas, self._tally, now, self.policy.stale_after_s,
                              self._others)
        measured = self._others.estimate()     # a pass over the replicas: once a call
        pool_view.record_others(self._deployment_id.name, measured)
        ranking = self._rank(request, loads, self._others.counted(measured))
        if pending_request is not None and request is not None and ranking:
            # Counted at once on the first choice, so that concurrent routing of a burst
            # sees it; on_request_routed moves it if Serve falls back to another rank.
            self._tally.add(request_key(pending_request), ranking[0],
                            self._pending_tokens(request), now)
        return as_ranks(ranking, candidate_replicas)

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: object
    ) -> None:
        request = engine_request_of(pending_request)
        if request is None:
            return
        key = replica_key(replica_id)
        self._tally.add(request_key(pending_request), key, self._pending_tokens(request),
                        self._clock())
        pool_view.record_routed(self._deployment_id.name, request.request_id, key)
        self._on_routed(request, key)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        key, now = replica_key(replica_id), self._clock()
        self._tally.complete(internal_request_id, key, now)
        self._others.completed(key, now)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_key(replica_id))
        self._publish_count()

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = {replica_key(r) for r in self._replica_id_set}
        super().update_replicas(replicas)
        for key in before - {replica_key(r) for r in self._replica_id_set}:
            self._forget(key)
        self._publish_count()

    def _publish_count(self) -> None:
        # Through a module imported by reference: this one reaches routers pickled by value.
        pool_view.record(self._deployment_id.name, len(self._replica_id_set))

    def _forget(self, replica: str) -> None:
        self._tally.forget_replica(replica)
        self._others.forget(replica)

    def _rank(self, request: EngineRequest | None, loads: list[ReplicaLoad],
              others: float) -> tuple[str, ...]:
        """Every candidate, best first; ``others``: what the other routers send the pool
        in a report period (``OtherRouters.per_period``)."""
        raise NotImplementedError

    def _pending_tokens(self, request: EngineRequest) -> int:
        return len(request.prompt_token_ids)

    def _on_routed(self, request: EngineRequest, replica: str) -> None:
        pass


class PrefillRequestRouter(_EngineRouter):
    """Prefix affinity weighed against queued prefill tokens (``rank_prefill``)."""

    policy: PrefillPolicy

    def initialize_state(self, *, block_size: int, **routing: Any) -> None:
        """``request_router_kwargs``: the engines' KV ``block_size`` and the fields of
        ``router.routing.prefill`` (those left out take the config's defaults)."""
        routing.pop(CODE_DIGEST_KEY, None)
        config = PrefillRoutingConfig.model_validate(routing)
        self.policy = PrefillPolicy.from_config(config, block_size)
        self._index = PrefixIndex(self.policy.index_capacity)
        # a prompt is hashed to rank the replicas, then again to record where it went
        self._chains = ChainMemo(size=16)
        logger.info("prefill router for %s: %s", self._deployment_id, self.policy)

    def _hashes(self, request: EngineRequest) -> tuple[int, ...]:
        return self._chains.chain(request.prompt_token_ids, self.policy.block_size,
                                  self.policy.max_blocks)

    def _rank(self, request: EngineRequest | None, loads: list[ReplicaLoad],
              others: float) -> tuple[str, ...]:
        if request is None:
            return rank_prefill(0, {}, loads, self.policy, self._rng).ranking
        matched = self._index.match(self._hashes(request))
        prompt_tokens = len(request.prompt_token_ids)
        return rank_prefill(prompt_tokens, matched, loads, self.policy, self._rng,
                            others, avoid=request.avoid_replicas).ranking

    def _on_routed(self, request: EngineRequest, replica: str) -> None:
        self._index.record(self._hashes(request), replica)

    def _forget(self, replica: str) -> None:
        super()._forget(replica)
        self._index.forget(replica)


class DecodeRequestRouter(_EngineRouter):
    """Least loaded by KV use and sequences, less a prefix-affinity bonus (``rank_decode``).

    What the replicas hold is kept in router/decode_prefixes.py, shared with the request
    flow: the prompts sent to each replica (whichever path filled it, pulled from a prefill
    engine or prefilled locally, the prompt's blocks end up in that engine's prefix cache)
    and, once finished, their answers. A request made decode-local by that cache names its
    replica (``EngineRequest.decode_replica``), which ranks first."""

    policy: DecodePolicy

    def initialize_state(self, *, max_num_seqs: int, block_size: int = 16,
                         **routing: Any) -> None:
        """``request_router_kwargs``: the engines' ``max_num_seqs`` and KV ``block_size``
        and the fields of ``router.routing.decode`` (those left out take the config's
        defaults)."""
        routing.pop(CODE_DIGEST_KEY, None)
        config = DecodeRoutingConfig.model_validate(routing)
        self.policy = DecodePolicy.from_config(config, max_num_seqs, block_size)
        self._tracks_prefixes = self.policy.affinity_slots > 0 or config.cache_aware_path
        self._belief = DecodeCacheLink(self._deployment_id.name)
        if self._tracks_prefixes:
            self._belief.install(DecodeCacheBelief(
                block_size, self.policy.max_blocks, self.policy.index_capacity))
        logger.info("decode router for %s: %s", self._deployment_id, self.policy)

    def _rank(self, request: EngineRequest | None, loads: list[ReplicaLoad],
              others: float) -> tuple[str, ...]:
        avoid = request.avoid_replicas if request is not None else ()
        if request is None or not self._tracks_prefixes:
            return rank_decode(loads, self.policy, self._rng, others=others, avoid=avoid)
        matched = {}
        if self.policy.affinity_slots > 0:
            matched = self._belief.match(request.prompt_token_ids)
        return rank_decode(loads, self.policy, self._rng, matched,
                           len(request.prompt_token_ids), pinned=request.decode_replica,
                           others=others, avoid=avoid)

    def _on_routed(self, request: EngineRequest, replica: str) -> None:
        if self._tracks_prefixes:
            self._belief.routed(request.request_id, request.prompt_token_ids, replica)

    def _forget(self, replica: str) -> None:
        super()._forget(replica)
        if self._tracks_prefixes:
            self._belief.forget(replica)


# ---------------------------------------------------------------------------------------
# Deployment option


ROUTER_CLASSES = {
    "prefill": f"{__name__}.PrefillRequestRouter",
    "decode": f"{__name__}.DecodeRequestRouter",
}


def request_router_config(
    pool: str, routing: RoutingConfig, *, block_size: int, max_num_seqs: int
) -> RequestRouterConfig:
    """The ``request_router_config`` deployment option of a pool.

    The router builds its policy from ``routing`` (``router.routing``) and what the pool's
    engines run with: ``block_size`` (the KV block size prefixes are hashed in) and, for
    the decode router, ``max_num_seqs``.

    Serve ships this module to the routers pickled by value, but compares router configs
    by class path and kwargs only: a redeploy whose only change is this file would keep
    the old copy. The digest of the file in the kwargs makes such a change a config
    change (a reconfiguration; no replica restarts).
    """
    if pool not in ROUTER_CLASSES:
        raise ValueError(f"unknown pool {pool!r}; expected one of {sorted(ROUTER_CLASSES)}")
    # Plain JSON values: Serve compares and ships the kwargs, not the config objects.
    if pool == "prefill":
        kwargs = {"block_size": block_size, **routing.prefill.model_dump(mode="json")}
    else:
        kwargs = {"max_num_seqs": max_num_seqs, "block_size": block_size,
                  **routing.decode.model_dump(mode="json")}
    return RequestRouterConfig(
        request_router_class=ROUTER_CLASSES[pool],
        request_router_kwargs={**kwargs, CODE_DIGEST_KEY: _source_digest()},
        request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
        request_routing_stats_timeout_s=ROUTING_STATS_TIMEOUT_S,
    )


def _source_digest() -> str:
    return short_digest(Path(__file__).read_bytes())
