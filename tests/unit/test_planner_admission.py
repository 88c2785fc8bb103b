"""Admission in the planner's simulator: the router replicas admit with pdserve's own
``AdmissionController``, so a request waits for budget, is refused when the queue is full
or its wait too long, and every budget comes back to zero."""

from __future__ import annotations

import random
from dataclasses import replace

from cluster.config import DecodeRoutingConfig
from cluster.percentile import percentile
from router.admission import AdmissionPolicy
from tools.planner.des import ClusterSpec, EngineLimits, RouterTier, SimRequest, Simulation


def _tier(replicas: int = 1, budget: int = 200, queue: int = 4, wait_s: float = 60.0,
          ) -> RouterTier:
    return RouterTier(replicas, AdmissionPolicy(token_budget=budget, max_queue=queue,
                                                max_wait_s=wait_s, retry_after_s=1,
                                                max_queue_per_key=None, long_budget=None))


def _spec(tier: RouterTier | None) -> ClusterSpec:
    """One prefill and one decode replica, 10 ms a step each."""
    return ClusterSpec(1, 1, lambda n, p, c: 0.01, lambda n, p, c: 0.01, lambda t: 0.0,
                       routers=tier)


# six requests at once, each 90 prompt + 10 answer tokens: a budget of 200 runs two
BURST = [SimRequest(0.0, 90, 10) for _ in range(6)]


def _drained(simulation: Simulation) -> bool:
    """Every admission budget back to zero, and every replica holding nothing."""
    admission = simulation.admission
    return (all(c.in_flight_tokens == 0 and c.queue_length == 0
                for c in admission.controllers) and not any(admission.holding)
            and not any(e.ongoing for e in simulation.prefill + simulation.decode))


def test_requests_beyond_the_budget_wait_for_it_and_all_finish():
    simulation = Simulation(_spec(_tier()), BURST)
    result = simulation.run()
    assert all(o.e2e_s is not None for o in result.outcomes)
    ttfts = sorted(o.ttft_s for o in result.outcomes)
    # two at a time: each pair starts once the pair before it has answered
    assert ttfts[2] > max(o.e2e_s for o in result.outcomes[:2])
    assert ttfts[4] > ttfts[2]
    assert _drained(simulation)


def test_a_full_queue_refuses_and_a_long_wait_refuses_too():
    simulation = Simulation(_spec(_tier(queue=1)), BURST)
    result = simulation.run()
    paths = [o.path for o in result.outcomes]
    assert paths.count("refused") == 3                 # two run, one waits, three refused
    assert sum(o.e2e_s is not None for o in result.outcomes) == 3
    assert _drained(simulation)
    # a wait shorter than the first pair's answers: the waiter is refused after it
    simulation = Simulation(_spec(_tier(queue=1, wait_s=0.05)), BURST)
    result = simulation.run()
    assert [o.path for o in result.outcomes].count("refused") == 4
    assert _drained(simulation)


def test_a_refused_turn_ends_its_conversation():
    first = [replace(r, conversation=i) for i, r in enumerate(BURST)]
    later = [replace(first[i], prompt_tokens=120, follows=i, think_s=0.1) for i in range(6)]
    simulation = Simulation(_spec(_tier(queue=1)), first + later)
    result = simulation.run()
    refused = {i for i, o in enumerate(result.outcomes[:6]) if o.path == "refused"}
    assert len(refused) == 3
    for i in range(6):
        turn = result.outcomes[6 + i]
        assert (turn.path == "") == (i in refused)       # never arrived
    assert _drained(simulation)


def test_a_tier_that_never_binds_changes_nothing():
    work = [SimRequest(i * 0.02, 50 + i % 40, 5 + i % 7) for i in range(300)]
    plain = Simulation(_spec(None), work).run()
    tiered = Simulation(_spec(_tier(replicas=3, budget=10**6)), work).run()
    assert [o.ttft_s for o in tiered.outcomes] == [o.ttft_s for o in plain.outcomes]
    assert [o.e2e_s for o in tiered.outcomes] == [o.e2e_s for o in plain.outcomes]


def test_a_waiter_admitted_by_an_answer_on_its_own_decode_engine_runs_once():
    """Decode-local requests (under the threshold) on one decode engine, two at a time,
    finishing in the same step (the second starts a step later with an answer a token
    shorter): the waiter the first one's answer admits goes to the engine that answered
    while the second is still in that step."""
    work = [SimRequest(0.0, 90, 11 - i % 2) for i in range(6)]
    spec = replace(_spec(_tier(budget=201, queue=8)), prefill_replicas=0, threshold_tokens=512)
    simulation = Simulation(spec, work)
    result = simulation.run()
    assert all(o.path == "decode_local" and o.e2e_s is not None for o in result.outcomes)
    assert result.outcomes[0].e2e_s == result.outcomes[1].e2e_s
    gaps = sum(count for _, _, count in result.token_gaps)
    assert gaps == sum(r.output_tokens - 1 for r in work)     # each token counted once
    assert _drained(simulation)


def test_routers_that_cannot_see_each_others_sends_herd_onto_the_least_loaded_replica():
    """Four decode replicas; three long answers, a report interval apart (each router sees
    the one before in the report), occupy three of them. At 3.5 s (the report shows one
    replica idle) a burst of eight arrives. One router counts its own sends on top of the
    report and spreads the burst; sixteen routers, each seeing only the report and its own
    sends, send most of it to the idle replica."""
    requests = ([SimRequest(1.1 * i, 16, 500) for i in range(3)]
                + [SimRequest(3.5, 16, 50) for _ in range(8)])

    def burst_on_idle_replica(routers: int, shared: bool = False,
                              max_ongoing: int | None = None) -> int:
        spec = ClusterSpec(0, 4, lambda n, p, c: 0.01, lambda n, p, c: 0.01,
                           lambda t: 0.0, routers=_tier(routers, budget=10**6),
                           shared_router_view=shared,
                           decode_limits=EngineLimits(max_ongoing=max_ongoing))
        simulation = Simulation(spec, requests)
        outcomes = simulation.run().outcomes
        # every replica gave back each request it held (Serve's ongoing counts balance)
        assert [engine.ongoing for engine in simulation.decode] == [0] * 4
        busy = {o.decode_replica for o in outcomes[:3]}
        assert len(busy) == 3                    # each saw the others in a report
        return sum(o.decode_replica not in busy for o in outcomes[3:])

    spread, herded = burst_on_idle_replica(1), burst_on_idle_replica(16)
    assert spread <= 3                  # 11 sequences over 4 replicas: about 3 each
    assert herded >= 5
    assert burst_on_idle_replica(16, shared=True) == spread   # one view: as one router
    # Serve's max_ongoing_requests bounds it: a full replica turns the next one away and
    # the router tries its next choice
    assert burst_on_idle_replica(16, max_ongoing=3) == 3


def test_routers_that_draw_by_water_fill_share_spread_as_one_router_does():
    """Eight decode replicas of four sequence slots each, Poisson arrivals at 40 a second
    for 40 s, 50-token answers: about 20 of the 32 slots busy. Sixteen routers that each
    rank least loaded first pile onto the same replica between reports, and requests wait
    for slots; drawing the first choice by each replica's share of what all routers send
    in a report period (router.routing.decode.spread, the default) keeps the waits short.
    One router alone routes exactly as without the draw."""
    rng = random.Random(7)
    arrivals, now = [], 0.0
    while now < 40:
        now += rng.expovariate(40)
        arrivals.append(SimRequest(now, 16, 50))

    def ttft_p95(routers: int, spread: bool) -> tuple[float, list]:
        spec = ClusterSpec(0, 8, lambda n, p, c: 0.01, lambda n, p, c: 0.01,
                           lambda t: 0.0, routers=_tier(routers, budget=10**6),
                           decode_limits=EngineLimits(max_num_seqs=4),
                           decode_routing=DecodeRoutingConfig(spread=spread))
        simulation = Simulation(spec, arrivals)
        outcomes = simulation.run().outcomes
        assert all(o.e2e_s is not None for o in outcomes) and _drained(simulation)
        ttfts = [o.ttft_s for o in outcomes[100:]]          # after the first reports
        return percentile(sorted(ttfts), 95), ttfts

    herded, _ = ttft_p95(16, spread=False)
    spread, _ = ttft_p95(16, spread=True)
    assert spread < herded / 3
    assert ttft_p95(1, spread=True)[1] == ttft_p95(1, spread=False)[1]
