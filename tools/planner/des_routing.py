"""The router replicas' routing in a simulation (pure): pdserve's own policies on load
snapshots.

The path comes from ``router.disaggregation``'s choice; replicas are ranked by
``rank_prefill`` and ``rank_decode`` on load reports at most ``report_interval_s`` old,
plus what each router replica sent since them (its ``PendingTally``), where it sent each
prefix and what it believes each decode cache holds: each replica's own view, unless
``shared_router_view``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from cluster.config import DecodeRoutingConfig, PrefillRoutingConfig
from router.disaggregation import PathChoice, choose_path_with_cache
from router.replica_choice import (
    DecodeCacheBelief,
    DecodePolicy,
    OtherRouters,
    PendingTally,
    PrefillPolicy,
    PrefixIndex,
    ReplicaLoad,
    rank_decode,
    rank_prefill,
)
from tools.planner.des_engine import Engine, Seq, first_with_room
from tools.planner.des_events import EventLoop
from tools.planner.des_spec import ClusterSpec


@dataclass(eq=False)
class RouterView:
    """What one router replica knows beyond the replicas' reports: its own sends since
    them, where it sent each prefix, and what it believes the decode caches hold."""

    tally: PendingTally
    prefix_index: PrefixIndex
    belief: DecodeCacheBelief
    # what the other routers send each pool, from the reports (one router: nothing)
    others: dict = field(default_factory=lambda: {"prefill": OtherRouters(),
                                                  "decode": OtherRouters()})


class Routing:
    """The router's path choice and replica rankings over ``prefill`` and ``decode``,
    with one view per router replica (one for all when they share one); ``rng`` breaks
    ranking ties."""

    def __init__(self, spec: ClusterSpec, prefill: list[Engine], decode: list[Engine],
                 rng: random.Random, clock: EventLoop) -> None:
        self.spec = spec
        self.prefill = prefill
        self.decode = decode
        self.rng = rng
        self._clock = clock
        self._snapshot: dict[str, ReplicaLoad] = {}
        self._snapshot_at = float("-inf")
        self._served: dict[str, int] = {}
        self.reports: list[tuple[float, str, float, float, float]] = []
        # The router's policies as configured; a load report is never too old to trust
        # here (no replica dies)
        prefill_routing = spec.prefill_routing or PrefillRoutingConfig()
        decode_routing = spec.decode_routing or DecodeRoutingConfig()
        self._prefill_policy = replace(PrefillPolicy.from_config(
            prefill_routing, spec.block_size), stale_after_s=float("inf"))
        self._decode_policy = replace(DecodePolicy.from_config(
            decode_routing, spec.decode_limits.max_num_seqs, spec.block_size),
            stale_after_s=float("inf"))
        self._cache_aware = decode_routing.cache_aware_path
        tier = spec.routers
        self._views = [RouterView(
            PendingTally(), PrefixIndex(self._prefill_policy.index_capacity),
            DecodeCacheBelief(spec.block_size, self._decode_policy.max_blocks,
                              self._decode_policy.index_capacity))
            for _ in range(tier.replicas if tier and not spec.shared_router_view else 1)]

    def view_for(self, router: int) -> int:
        """The view router replica ``router`` routes on (one for all when they share)."""
        return 0 if len(self._views) == 1 else router

    def _loads(self, engines: list[Engine], view: RouterView) -> list[ReplicaLoad]:
        """The replicas' last reports (refreshed once a report interval), plus what this
        router sent since them."""
        now = self._clock.now
        interval = self.spec.report_interval_s
        if interval <= 0 or now - self._snapshot_at >= interval:
            self._snapshot_at = now
            self._snapshot = {e.name: ReplicaLoad(
                e.name, queued_prefill_tokens=e.queued_prompt_tokens(),
                running_seqs=len(e.running), waiting_seqs=len(e.waiting),
                kv_usage=e.reserved / e.limits.kv_capacity_tokens,
                max_num_seqs=e.limits.max_num_seqs) for e in self.prefill + self.decode}
            self._served = {e.name: e.served for e in self.prefill + self.decode}
            self._record_reports()
        others = view.others["prefill" if engines is self.prefill else "decode"]
        for engine in engines:      # as the router does on reading a report
            view.tally.observe_report(engine.name, self._snapshot_at)
            others.observe(engine.name, self._served[engine.name], self._snapshot_at)
        return [self._with_pending(self._snapshot[e.name], view.tally) for e in engines]

    def _record_reports(self) -> None:
        """Each pool's mean report, as of now."""
        for pool, engines in (("prefill", self.prefill), ("decode", self.decode)):
            if engines:
                loads = [self._snapshot[e.name] for e in engines]
                self.reports.append((self._clock.now, pool, *(
                    sum(getattr(load, name) for load in loads) / len(loads)
                    for name in ("queued_prefill_tokens", "running_seqs", "kv_usage"))))

    @staticmethod
    def _with_pending(load: ReplicaLoad, tally: PendingTally) -> ReplicaLoad:
        """The report plus what was sent since, less what it counted that completed since,
        as the router's ReplicaLoad has it (built, not ``dataclasses.replace``d: this runs
        for every replica at every routing)."""
        return ReplicaLoad(load.replica_id, load.queued_prefill_tokens, load.running_seqs,
                           load.waiting_seqs, load.kv_usage, load.max_num_seqs,
                           pending_tokens=tally.tokens(load.replica_id),
                           pending_requests=tally.requests(load.replica_id),
                           finished_tokens=tally.finished_tokens(load.replica_id),
                           finished_requests=tally.finished_requests(load.replica_id))

    def completed(self, seq: Seq, engine: Engine, key: str, pool: str) -> None:
        """As Serve calls the router's ``on_request_completed``."""
        view = self._views[seq.router]
        view.tally.complete(key, engine.name, self._clock.now)
        view.others[pool].completed(engine.name, self._clock.now)

    def sent(self, seq: Seq, engine: Engine, key: str, tokens: int) -> None:
        """Its router counts ``tokens`` sent to ``engine`` until they complete."""
        self._views[seq.router].tally.add(key, engine.name, tokens, self._clock.now)

    def finished(self, seq: Seq, chain: tuple[int, ...]) -> None:
        """Its router believes its decode replica now caches ``chain``."""
        self._views[seq.router].belief.finished_chain(f"decode-{seq.index}", chain)

    def pick_prefill(self, seq: Seq) -> Engine:
        """The prefill router: its ranking, then its record of where the prefix went."""
        view = self._views[seq.router]
        chain = seq.chain[:self._prefill_policy.max_blocks]
        loads = self._loads(self.prefill, view)
        ranking = rank_prefill(seq.prompt, view.prefix_index.match(chain), loads,
                               self._prefill_policy, self.rng,
                               view.others["prefill"].per_period()).ranking
        engine = first_with_room(ranking, self.prefill)
        engine.ongoing += 1             # its replica holds it until its prompt is computed
        view.prefix_index.record(chain, engine.name)
        return engine

    def pick_decode(self, seq: Seq, pinned: str | None = None) -> Engine:
        """The decode router: its ranking (prefix affinity, the pinned holder), then its
        belief that the replica holds the prompt."""
        view = self._views[seq.router]
        matched = {}
        if self._decode_policy.affinity_slots > 0:
            matched = view.belief.match_chain(seq.chain)
        loads = self._loads(self.decode, view)
        ranking = rank_decode(loads, self._decode_policy, self.rng, matched, seq.prompt,
                              pinned=pinned,
                              others=view.others["decode"].per_period())
        engine = first_with_room(ranking, self.decode)
        engine.ongoing += 1             # its replica holds it from the pull to the answer
        if seq.chain:   # only a request with blocks to share is told back when it ends
            view.belief.routed_chain(f"decode-{seq.index}", seq.chain, engine.name)
        return engine

    def path(self, seq: Seq) -> PathChoice:
        """The router's path choice (router/engine_client.py ``route``)."""
        if not self.prefill:
            return PathChoice("decode_local")
        threshold = self.spec.threshold_tokens
        holder, held = None, 0
        if self._cache_aware and seq.chain and seq.prompt >= threshold > 0:
            holder, held = self._views[seq.router].belief.holder_of_chain(seq.chain,
                                                                          seq.prompt)
        return choose_path_with_cache(seq.prompt, threshold, holder, held)
