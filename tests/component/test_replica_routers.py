"""The Serve request routers of the pools, driven without a Ray cluster.

Ray's ``RequestRouter`` needs no running Ray to be constructed, so the routers are built
with the keyword arguments Serve passes them, fed replicas that look like Serve's
``RunningReplica`` (id, routing stats, queue length) and ``PendingRequest``s as Serve makes
them. The last tests run Serve's own routing loop (``_choose_replica_for_request``, which
calls ``choose_replicas`` and probes queue lengths) over those replicas.
"""

import asyncio
import random

import pytest
from pydantic import ValidationError
from ray import cloudpickle
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, ReplicaID

from cluster.config import DecodeRoutingConfig, parse_config
from cluster.engine.messages import EngineRequest
from cluster.engine.routing_stats import routing_stats_from
from cluster.engine.stats import EngineStats
from router.decode_prefixes import DecodeCacheLink
from router.pool_view import ROUTED_KEPT, known_replicas, record_routed, routed_to
from router.replica_choice import DecodePolicy, PrefillPolicy, load_from_stats
from router.replica_routers import (
    CODE_DIGEST_KEY,
    ROUTER_CLASSES,
    DecodeRequestRouter,
    PrefillRequestRouter,
    as_ranks,
    engine_request_of,
    request_router_config,
)

DEPLOYMENT = DeploymentID(name="prefill", app_name="pdserve")
SYSTEM_PROMPT = tuple(range(256))   # 16 blocks of 16


class FakeReplica:
    """What a router reads of Serve's ``RunningReplica``."""

    def __init__(self, name: str, stats: dict | None = None, queue_len: int = 0,
                 max_ongoing_requests: int = 8):
        self.replica_id = ReplicaID(unique_id=name, deployment_id=DEPLOYMENT)
        self.routing_stats = stats or {}
        self.queue_len = queue_len
        self.max_ongoing_requests = max_ongoing_requests
        self.node_id = "node"
        self.availability_zone = None
        self.multiplexed_model_ids: set[str] = set()
        self.is_cross_language = False

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_router(cls, clock: Clock, deployment: DeploymentID = DEPLOYMENT, **state):
    """Construct a router the way Serve's ``AsyncioRouter`` does, then configure it."""
    router = cls(
        deployment_id=deployment,
        handle_source=DeploymentHandleSource.REPLICA,
        self_node_id="node",
        self_actor_id="actor",
        self_actor_handle=None,
        use_replica_queue_len_cache=True,
        create_replica_wrapper_func=lambda info: info,
        prefer_local_node_routing=False,
        prefer_local_az_routing=False,
        self_availability_zone=None,
        clock=clock,
        rng=random.Random(0),
    )
    router.initialize_state(**state)
    return router


# The routers read only the prompt's token ids of a request; its sampling (vLLM's
# SamplingParams in production) is opaque to them, so any object stands in for it.
SAMPLING = object()


def engine_request(request_id: str, prompt: tuple[int, ...]) -> EngineRequest:
    return EngineRequest(request_id, prompt, SAMPLING)


def pending(request_id: str, *args, **kwargs) -> PendingRequest:
    """A handle call as Serve queues it (call from inside an event loop)."""
    return PendingRequest(
        args=list(args), kwargs=kwargs,
        metadata=RequestMetadata(request_id=request_id, internal_request_id=request_id),
    )


def first_ids(ranks) -> list[str]:
    assert all(len(rank) == 1 for rank in ranks)   # strict ranking: one replica per rank
    return [rank[0].replica_id.unique_id for rank in ranks]


def run(coroutine):
    return asyncio.run(coroutine)


# -- mapping helpers --------------------------------------------------------------------


def test_engine_request_is_the_first_argument_of_pool_calls_only():
    async def check():
        request = engine_request("x", (1, 2, 3))
        assert engine_request_of(pending("1", request, None)) is request      # decode call
        assert engine_request_of(pending("2", request=request)) is request
        assert engine_request_of(pending("3")) is None                         # stats()
        assert engine_request_of(pending("4", "text")) is None
        assert engine_request_of(None) is None
    run(check())


def test_ranks_keep_only_known_replicas_one_per_rank():
    a, b = FakeReplica("a"), FakeReplica("b")
    assert as_ranks(["b", "gone", "a"], [a, b]) == [[b], [a]]


# -- prefill router ---------------------------------------------------------------------


def test_prefill_router_follows_the_prefix_it_routed():
    async def check():
        clock = Clock()
        router = make_router(PrefillRequestRouter, clock, block_size=16)
        replicas = [FakeReplica("a"), FakeReplica("b"), FakeReplica("c")]
        first = pending("1", engine_request("1", SYSTEM_PROMPT + (1000,) * 40))
        ranks = await router.choose_replicas(replicas, first)
        assert sorted(first_ids(ranks)) == ["a", "b", "c"]
        assert first.routing_context.should_backoff       # no tight retry loop when full
        router.on_request_routed(first, replicas[1].replica_id, result=None)   # went to b
        router.on_request_completed(replicas[1].replica_id, "1")

        second = pending("2", engine_request("2", SYSTEM_PROMPT + (2000,) * 40))
        assert first_ids(await router.choose_replicas(replicas, second))[0] == "b"
    run(check())


def test_prefill_router_leaves_an_affinity_replica_whose_queue_is_too_long():
    async def check():
        clock = Clock()
        router = make_router(PrefillRequestRouter, clock, block_size=16,
                             max_imbalance_tokens=500)
        a = FakeReplica("a", {"queued_prefill_tokens": 0, "reported_at": clock.now})
        b = FakeReplica("b", {"queued_prefill_tokens": 0, "reported_at": clock.now})
        routed = pending("1", engine_request("1", SYSTEM_PROMPT))
        await router.choose_replicas([a, b], routed)
        router.on_request_routed(routed, a.replica_id, result=None)
        router.on_request_completed(a.replica_id, "1")
        a.routing_stats = {"queued_prefill_tokens": 501, "reported_at": clock.now}
        again = pending("2", engine_request("2", SYSTEM_PROMPT))
        ranks = await router.choose_replicas([a, b], again)
        assert first_ids(ranks) == ["b", "a"]
    run(check())


def test_a_burst_spreads_before_any_replica_reports():
    """Requests routed between two stats reports see each other through the tally."""
    async def check():
        router = make_router(PrefillRequestRouter, Clock(), block_size=16)
        replicas = [FakeReplica(name) for name in "abcd"]
        chosen = []
        for i in range(8):
            prompt = tuple(range(i * 1000, i * 1000 + 500))
            request = pending(str(i), engine_request(str(i), prompt))
            chosen.append(first_ids(await router.choose_replicas(replicas, request))[0])
        assert sorted(chosen) == sorted("abcd" * 2)
    run(check())


def test_a_report_taken_after_routing_replaces_the_routers_own_count():
    async def check():
        clock = Clock(100.0)
        router = make_router(PrefillRequestRouter, clock, block_size=16)
        a, b = FakeReplica("a"), FakeReplica("b")
        big = pending("1", engine_request("1", tuple(range(5000))))
        await router.choose_replicas([a, b], big)
        router.on_request_routed(big, a.replica_id, result=None)     # 5000 tokens pending on a
        small = pending("2", engine_request("2", tuple(range(9000, 9100))))
        assert first_ids(await router.choose_replicas([a, b], small))[0] == "b"
        router.on_request_routed(small, b.replica_id, result=None)
        # a reports after it received the request, with most of it already prefilled
        clock.now = 101.0
        a.routing_stats = {"queued_prefill_tokens": 10, "reported_at": 100.5}
        b.routing_stats = {"queued_prefill_tokens": 100, "reported_at": 100.5}
        third = pending("3", engine_request("3", tuple(range(20000, 20100))))
        assert first_ids(await router.choose_replicas([a, b], third))[0] == "a"
    run(check())


def test_completion_from_a_replica_that_rejected_does_not_drop_the_new_count():
    async def check():
        router = make_router(PrefillRequestRouter, Clock(), block_size=16)
        a, b = FakeReplica("a"), FakeReplica("b", {"queued_prefill_tokens": 10})
        request = pending("1", engine_request("1", tuple(range(3000))))
        assert first_ids(await router.choose_replicas([a, b], request))[0] == "a"
        router.on_request_completed(a.replica_id, "1")   # a rejected it (full)
        router.on_request_routed(request, b.replica_id, result=None)  # Serve fell back to b
        router.on_request_completed(a.replica_id, "1")   # stray completion of the attempt
        assert (router._tally.tokens("a"), router._tally.tokens("b")) == (0, 3000)
        other = pending("2", engine_request("2", tuple(range(5000, 5100))))
        assert first_ids(await router.choose_replicas([a, b], other))[0] == "a"
        router.on_request_completed(b.replica_id, "1")   # prefill done on b
        again = pending("3", engine_request("3", tuple(range(7000, 7100))))
        ranks = await router.choose_replicas([a, b], again)
        assert first_ids(ranks)[0] == "b"   # a holds request 2's tentative count
    run(check())


def test_stats_calls_are_ranked_by_load_and_not_counted():
    async def check():
        router = make_router(PrefillRequestRouter, Clock(), block_size=16)
        a = FakeReplica("a", {"queued_prefill_tokens": 900})
        b = FakeReplica("b", {"queued_prefill_tokens": 10})
        call = pending("s")
        assert first_ids(await router.choose_replicas([a, b], call)) == ["b", "a"]
        router.on_request_routed(call, b.replica_id, result=None)
        assert len(router._tally) == 0
        assert await router.choose_replicas([], call) == []
    run(check())


def test_a_dead_replica_is_forgotten():
    async def check():
        router = make_router(PrefillRequestRouter, Clock(), block_size=16)
        a, b = FakeReplica("a"), FakeReplica("b")
        routed = pending("1", engine_request("1", SYSTEM_PROMPT))
        await router.choose_replicas([a, b], routed)
        router.on_request_routed(routed, a.replica_id, result=None)
        router.on_replica_actor_died(a.replica_id)
        assert len(router._tally) == 0 and len(router._index) == 0
    run(check())


def test_policy_kwargs_are_checked():
    # by the config models of router.routing, where the tunables' validation lives
    with pytest.raises(ValidationError, match="no_such_knob"):
        make_router(PrefillRequestRouter, Clock(), block_size=16, no_such_knob=1)
    with pytest.raises(ValidationError, match="kv_high_water"):
        make_router(DecodeRequestRouter, Clock(), max_num_seqs=16, kv_high_water=2)
    with pytest.raises(TypeError, match="block_size"):  # the engines' block size is required
        make_router(PrefillRequestRouter, Clock())


# -- decode router ----------------------------------------------------------------------


def test_decode_router_prefers_the_least_loaded_and_counts_its_sends():
    async def check():
        clock = Clock()
        router = make_router(DecodeRequestRouter, clock, max_num_seqs=16)
        a = FakeReplica("a", {"running_seqs": 2, "kv_usage": 0.1, "max_num_seqs": 16,
                              "reported_at": clock.now})
        b = FakeReplica("b", {"running_seqs": 0, "kv_usage": 0.97, "max_num_seqs": 16,
                              "reported_at": clock.now})
        c = FakeReplica("c", {"running_seqs": 3, "kv_usage": 0.13, "max_num_seqs": 16,
                              "reported_at": clock.now})
        request = engine_request("1", tuple(range(100)))
        # scores: a 2/16 + 0.1 = 0.225, c 3/16 + 0.13 = 0.3175, b above the high-water mark
        assert first_ids(await router.choose_replicas([a, b, c], pending("1", request, None))) \
            == ["a", "c", "b"]
        # each unreported send adds 1/16: after two, a (0.35) is busier than c
        ranks = await router.choose_replicas([a, b, c], pending("2", request, None))
        assert first_ids(ranks)[0] == "a"
        ranks = await router.choose_replicas([a, b, c], pending("3", request, None))
        assert first_ids(ranks)[0] == "c"
    run(check())


def decode_pair(clock: Clock, running_seqs: int, deployment: DeploymentID = DEPLOYMENT):
    """A decode router (16 sequences, blocks of 16) and its replicas a and b, each
    reporting ``running_seqs`` now."""
    router = make_router(DecodeRequestRouter, clock, deployment, max_num_seqs=16,
                         block_size=16)
    a, b = (FakeReplica(name, {"running_seqs": running_seqs, "max_num_seqs": 16,
                               "reported_at": clock.now}) for name in ("a", "b"))
    return router, a, b


def test_decode_router_follows_the_prefix_it_sent_only_while_the_load_allows():
    async def check():
        clock = Clock()
        router, a, b = decode_pair(clock, running_seqs=2)
        first = pending("1", engine_request("1", SYSTEM_PROMPT + (1000,) * 40))
        await router.choose_replicas([a, b], first)
        router.on_request_routed(first, b.replica_id, result=None)   # its blocks are on b
        router.on_request_completed(b.replica_id, "1")
        # equal loads: the replica holding the system prompt pulls only the suffix
        second = pending("2", engine_request("2", SYSTEM_PROMPT + (2000,) * 40))
        assert first_ids(await router.choose_replicas([a, b], second)) == ["b", "a"]
        router.on_request_completed(b.replica_id, "2")
        # two streams busier than a: more than the one slot a whole prompt is worth
        b.routing_stats = {"running_seqs": 4, "max_num_seqs": 16, "reported_at": clock.now}
        third = pending("3", engine_request("3", SYSTEM_PROMPT + (3000,) * 40))
        assert first_ids(await router.choose_replicas([a, b], third)) == ["a", "b"]
    run(check())


def test_the_next_turn_follows_its_prefix_to_a_replica_whose_report_still_counts_the_last():
    """The report a replica gave while it streamed the first turn still counts that stream
    when the next turn arrives: the router takes off what it saw complete since, so the
    replica holding the conversation is not one stream busier than it is (one slot is
    worth more than the affinity bonus, and the turn would pull its whole prompt
    elsewhere)."""
    async def check():
        clock = Clock()
        router, a, b = decode_pair(clock, running_seqs=0)
        first = pending("1", engine_request("1", SYSTEM_PROMPT + (1000,) * 40))
        await router.choose_replicas([a, b], first)
        router.on_request_routed(first, b.replica_id, result=None)
        clock.now += 0.5
        b.routing_stats = {"running_seqs": 1, "kv_usage": 0.001, "max_num_seqs": 16,
                           "reported_at": clock.now}                  # while it streams
        a.routing_stats = {**a.routing_stats, "reported_at": clock.now}
        clock.now += 0.2
        router.on_request_completed(b.replica_id, "1")
        second = pending("2", engine_request("2", SYSTEM_PROMPT + (2000,) * 40))
        assert first_ids(await router.choose_replicas([a, b], second)) == ["b", "a"]
        router.on_request_routed(second, b.replica_id, result=None)
        # b's next report counts the second turn and not the first: the correction goes
        clock.now += 0.5
        b.routing_stats = {**b.routing_stats, "reported_at": clock.now}
        await router.choose_replicas([a, b], pending("3", engine_request("3", (7,) * 50)))
        assert router._tally.finished_requests("b") == 0
    run(check())


def test_the_flow_learns_where_a_call_went_and_its_retry_keeps_off_that_replica():
    """A hung decode engine's replica reports what it had when it stopped; once the
    router took the hung stream off that report, the replica holding the prompt looks
    idle. The continuation names it (router/flow.py) and goes to the other."""
    async def check():
        clock = Clock()
        router, a, b = decode_pair(
            clock, running_seqs=0,
            deployment=DeploymentID(name="decode-avoid", app_name="pdserve"))
        prompt = SYSTEM_PROMPT + (1000,) * 40
        first = pending("1", engine_request("req-1", prompt))
        await router.choose_replicas([a, b], first)
        router.on_request_routed(first, b.replica_id, result=None)
        assert routed_to("decode-avoid", "req-1") == "b"
        router.on_request_completed(b.replica_id, "1")      # cancelled at its deadline
        again = EngineRequest("req-1-retry1", (*prompt, 5), SAMPLING, avoid_replicas=("b",))
        assert first_ids(await router.choose_replicas([a, b], pending("2", again))) == [
            "a", "b"]
        same = EngineRequest("req-2", (*prompt, 6), SAMPLING)
        assert first_ids(await router.choose_replicas([a, b], pending("3", same)))[0] == "b"
    run(check())


def test_where_calls_went_is_kept_for_the_latest_calls_only():
    for i in range(ROUTED_KEPT + 1):
        record_routed("decode-kept", f"r{i}", "a")
    record_routed("decode-kept", "r1", "b")                  # routed again: moved, kept
    record_routed("decode-kept", "r-new", "a")
    assert routed_to("decode-kept", "r0") is None and routed_to("decode-kept", "r2") is None
    assert routed_to("decode-kept", "r1") == "b" and routed_to("other", "r1") is None


def test_decode_router_ranks_a_replica_with_stale_stats_last():
    async def check():
        clock = Clock(1000.0)
        router = make_router(DecodeRequestRouter, clock, max_num_seqs=16, stale_after_s=5)
        fresh = FakeReplica("fresh", {"running_seqs": 100, "kv_usage": 0.9, "reported_at": 999})
        stale = FakeReplica("stale", {"running_seqs": 0, "kv_usage": 0.0, "reported_at": 990})
        new = FakeReplica("new")    # no report yet: empty
        call = pending("1", engine_request("1", (1,)), None)
        ranks = await router.choose_replicas([stale, fresh, new], call)
        assert first_ids(ranks) == ["new", "fresh", "stale"]
    run(check())


def test_a_request_made_decode_local_by_a_replicas_cache_goes_to_it_unless_it_is_full():
    async def check():
        clock = Clock()
        router = make_router(DecodeRequestRouter, clock, max_num_seqs=16)
        idle = FakeReplica("idle", {"running_seqs": 0, "max_num_seqs": 16,
                                    "reported_at": clock.now})
        busy = FakeReplica("busy", {"running_seqs": 12, "max_num_seqs": 16,
                                    "reported_at": clock.now})
        pinned = EngineRequest("1", tuple(range(100)), SAMPLING, decode_replica="busy")
        assert first_ids(await router.choose_replicas([idle, busy], pending("1", pinned, None))
                         ) == ["busy", "idle"]
        busy.routing_stats = {"running_seqs": 12, "kv_usage": 0.99, "max_num_seqs": 16,
                              "reported_at": clock.now}
        assert first_ids(await router.choose_replicas([idle, busy], pending("2", pinned, None))
                         ) == ["idle", "busy"]
    run(check())


def test_the_flow_learns_which_replica_holds_a_conversation_through_the_shared_belief():
    """Pickled by value as Serve ships it, the decode router shares its belief with the
    flow's link: the prompt it routed, then the answer the flow saw finish there."""
    async def check():
        cls = cloudpickle.loads(RequestRouterConfig(
            request_router_class=ROUTER_CLASSES["decode"],
        ).get_serialized_request_router_cls())
        pool = DeploymentID(name="decode-conversations", app_name="pdserve")
        router = make_router(cls, Clock(), pool, max_num_seqs=16, block_size=16)
        link = DecodeCacheLink(pool.name)
        a, b = FakeReplica("a"), FakeReplica("b")
        turn1 = SYSTEM_PROMPT + (1000,) * 40                  # 296 tokens: 18 whole blocks
        call = pending("1", engine_request("1", turn1), None)
        await router.choose_replicas([a, b], call)
        router.on_request_routed(call, b.replica_id, result=None)
        answer = (2000,) * 61                                  # 60 of them were fed back
        turn2 = turn1 + answer + (3000,) * 20
        assert link.holder(turn2) == ("b", 18 * 16)            # the prompt only, so far
        link.finished("1", turn1 + answer)
        assert link.holder(turn2) == ("b", (296 + 60) // 16 * 16)
        link.finished("1", turn1 + answer + answer)            # told twice: recorded once
        assert link.holder(turn2 + answer) == ("b", (296 + 60) // 16 * 16)
        # another handle's router of the pool (made when first used) shares the belief
        make_router(DecodeRequestRouter, Clock(), pool, max_num_seqs=16, block_size=16)
        assert link.holder(turn2) == ("b", (296 + 60) // 16 * 16)
        router.on_replica_actor_died(b.replica_id)             # its cache went with it
        assert link.holder(turn2) == (None, 0)
    run(check())


@pytest.mark.parametrize(("affinity", "cache_aware", "tracked"), [
    (0, False, False), (0, True, True), (1, False, True)])
def test_the_decode_router_keeps_a_belief_only_for_affinity_or_the_cache_aware_path(
        affinity, cache_aware, tracked):
    async def check():
        deployment = DeploymentID(name=f"decode-{affinity}-{cache_aware}", app_name="pdserve")
        router = make_router(DecodeRequestRouter, Clock(), deployment, max_num_seqs=16,
                             prefix_affinity_slots=affinity, cache_aware_path=cache_aware)
        a = FakeReplica("a")
        call = pending("1", engine_request("1", SYSTEM_PROMPT), None)
        await router.choose_replicas([a], call)
        router.on_request_routed(call, a.replica_id, result=None)
        held = ("a", len(SYSTEM_PROMPT)) if tracked else (None, 0)
        assert DecodeCacheLink(deployment.name).holder(SYSTEM_PROMPT) == held
    run(check())


# -- through Serve's own routing loop ---------------------------------------------------


def test_serve_gives_the_chosen_replica_to_the_request_it_was_chosen_for():
    async def check():
        router = make_router(PrefillRequestRouter, Clock(), block_size=16)
        replicas = [FakeReplica("a"), FakeReplica("b")]
        router.update_replicas(replicas)
        warm = pending("1", engine_request("1", SYSTEM_PROMPT))
        chosen = await router._choose_replica_for_request(warm)
        router.on_request_routed(warm, chosen.replica_id, result=None)
        router.on_request_completed(chosen.replica_id, "1")
        follow = pending("2", engine_request("2", SYSTEM_PROMPT + (7,) * 16))
        assert await router._choose_replica_for_request(follow) is chosen
    run(check())


def test_serve_falls_back_to_the_next_rank_when_the_first_is_full():
    async def check():
        router = make_router(PrefillRequestRouter, Clock(), block_size=16)
        a = FakeReplica("a", queue_len=8, max_ongoing_requests=8)    # full
        b = FakeReplica("b", {"queued_prefill_tokens": 5000})
        router.update_replicas([a, b])
        request = pending("1", engine_request("1", tuple(range(100))))
        assert first_ids(await router.choose_replicas([a, b], request))[0] == "a"
        chosen = await asyncio.wait_for(router._choose_replica_for_request(request), 10)
        assert chosen is b
    run(check())


def test_update_replicas_forgets_removed_replicas():
    async def check():
        router = make_router(PrefillRequestRouter, Clock(), block_size=16)
        a, b = FakeReplica("a"), FakeReplica("b")
        router.update_replicas([a, b])
        routed = pending("1", engine_request("1", SYSTEM_PROMPT))
        await router.choose_replicas([a, b], routed)
        router.on_request_routed(routed, a.replica_id, result=None)
        router.update_replicas([b])
        assert len(router._index) == 0 and len(router._tally) == 0
    run(check())


def test_the_flow_learns_how_many_replicas_the_router_knows():
    """Pickled by value as Serve ships it, the router still tells the flow's module."""
    async def check():
        cls = cloudpickle.loads(RequestRouterConfig(
            request_router_class=ROUTER_CLASSES["prefill"],
        ).get_serialized_request_router_cls())
        router = make_router(cls, Clock(), block_size=16)
        a, b = FakeReplica("a"), FakeReplica("b")
        router.update_replicas([a, b])
        assert known_replicas(DEPLOYMENT.name) == 2
        router.on_replica_actor_died(a.replica_id)
        assert known_replicas(DEPLOYMENT.name) == 1
        router.on_replica_actor_died(b.replica_id)  # before the controller says so
        assert known_replicas(DEPLOYMENT.name) == 0
    run(check())


# -- deployment option and replica stats ------------------------------------------------


def test_router_config_names_the_class_and_carries_the_routing_config():
    routing = parse_config({
        "model": {"name": "m", "path": "/m"},
        "router": {"routing": {"prefill": {"max_imbalance_tokens": 100},
                               "decode": {"kv_high_water": 0.9}}},
    }).router.routing
    config = request_router_config("prefill", routing, block_size=32, max_num_seqs=64)
    assert isinstance(config, RequestRouterConfig)
    assert config.request_router_class == "router.replica_routers.PrefillRequestRouter"
    kwargs = dict(config.request_router_kwargs)
    assert len(kwargs.pop(CODE_DIGEST_KEY)) == 16
    assert kwargs == {"block_size": 32, **routing.prefill.model_dump()}
    assert config.request_routing_stats_period_s == 1.0
    router_class = config.get_request_router_class()   # as Serve ships it: by value
    assert router_class.__name__ == "PrefillRequestRouter"
    router = make_router(router_class, Clock(), **config.request_router_kwargs)
    assert router.policy == PrefillPolicy.from_config(routing.prefill, 32)
    decode = request_router_config("decode", routing, block_size=32, max_num_seqs=64)
    assert set(decode.request_router_kwargs) == {
        "max_num_seqs", "block_size", CODE_DIGEST_KEY, *DecodeRoutingConfig.model_fields}
    router = make_router(decode.get_request_router_class(), Clock(),
                         **decode.request_router_kwargs)
    assert router.policy == DecodePolicy.from_config(routing.decode, 64, block_size=32)
    assert router.policy.kv_high_water == 0.9 and router.policy.default_max_num_seqs == 64
    with pytest.raises(ValueError):
        request_router_config("router", routing, block_size=16, max_num_seqs=64)


def test_engine_stats_reach_the_router_as_reported():
    stats = EngineStats(role="decode", engine_id="d", kv_cache_usage=0.25, num_running=7,
                        num_waiting=2, queued_prefill_tokens=300)
    report = routing_stats_from(stats, max_num_seqs=64, reported_at=50.0)
    load = load_from_stats("d", report, now=51.0, stale_after_s=5)
    assert (load.running_seqs, load.waiting_seqs, load.kv_usage, load.max_num_seqs) == (
        7, 2, 0.25, 64)
    assert not load.stale
    assert report["queued_prefill_tokens"] == 300


def test_the_report_carries_the_counted_queue_and_no_time_unless_given():
    stats = EngineStats(role="prefill", engine_id="p", num_running=1, num_waiting=3)
    stats.queued_prefill_tokens = 1234    # kept by EngineHost.generate
    assert routing_stats_from(stats)["queued_prefill_tokens"] == 1234
    assert "reported_at" not in routing_stats_from(stats)


def test_a_router_draws_its_first_choice_when_other_routers_send_to_the_pool_too():
    """Two decode replicas report every second for ten seconds, each having finished 20
    more requests, of which this router's own completions (Serve tells it of each) were
    1 (others send the pool ~38 a period) or all 20 (it is alone). The router alone
    always puts the less loaded replica first; among other routers it draws, so the
    busier one comes first too, by its share of the period's requests."""
    async def first_choices(own_per_second: int) -> set[str]:
        clock = Clock(1000.0)
        router = make_router(DecodeRequestRouter, clock, max_num_seqs=16)
        a, b = FakeReplica("a"), FakeReplica("b")
        for second in range(11):
            clock.now = 1000.0 + second
            for replica in (a, b):
                for index in range(own_per_second if second else 0):
                    router.on_request_completed(replica.replica_id, f"{second}-{index}")
            a.routing_stats, b.routing_stats = (
                {"running_seqs": running, "max_num_seqs": 16, "reported_at": clock.now,
                 "requests_finished": 20 * second} for running in (2, 3))
            await router.choose_replicas([a, b], None)    # reading the reports
        seen = set()
        for index in range(40):
            ranks = await router.choose_replicas(
                [a, b], pending(f"r{index}", engine_request(f"r{index}", (1, 2)), None))
            seen.add(first_ids(ranks)[0])
            router._tally.discard(f"r{index}")     # as if the report counted it
        return seen

    assert run(first_choices(own_per_second=20)) == {"a"}
    assert run(first_choices(own_per_second=1)) == {"a", "b"}
