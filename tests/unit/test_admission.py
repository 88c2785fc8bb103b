"""Admission control and the disaggregation choice (pure policies of the router)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.config import AdmissionConfig
from router.admission import AdmissionController, AdmissionPolicy, Expiry
from router.disaggregation import PathChoice, choose_path, choose_path_with_cache


def policy(**fields) -> AdmissionPolicy:
    """A policy as the router builds it: from a validated config section. One key may
    hold the whole budget running unless a test says otherwise."""
    return AdmissionPolicy.from_config(AdmissionConfig(
        **{"max_running_share_per_key": None, **fields}))


# One key may fill the whole queue here: these tests are about the queue itself.
POLICY = policy(token_budget=100, max_queue=2, max_wait_s=5, retry_after_s=3,
                max_queue_per_key=None)


def test_admits_within_budget_then_queues_then_refuses():
    gate = AdmissionController(POLICY)
    assert gate.request(1, 60, now=0).action == "admit"
    assert gate.request(2, 30, now=0).action == "admit"
    assert gate.request(3, 30, now=0).action == "queue"       # 120 > 100
    assert gate.request(4, 5, now=0).action == "queue"        # fits, but FIFO: no overtaking
    refused = gate.request(5, 1, now=0)
    assert (refused.action, refused.retry_after_s) == ("reject", 3)
    assert gate.snapshot() == {"token_budget": 100, "tokens_in_flight": 90,
                               "long_tokens_in_flight": 0, "running": 2, "queued": 2,
                               "max_queue": 2}
    assert gate.release(1) == [3, 4]                          # 30 + 30 + 5 <= 100
    assert gate.in_flight_tokens == 65 and gate.queue_length == 0
    assert gate.snapshot()["running"] == 3 and gate.snapshot()["queued"] == 0


def test_waiters_expire_and_giving_up_unblocks_the_queue():
    gate = AdmissionController(POLICY)
    gate.request(1, 90, now=0)
    gate.request(2, 50, now=1)      # blocked head
    gate.request(3, 5, now=2)
    assert gate.expired(now=6.5) == [2]
    assert gate.give_up(2) == [3]  # 3 was blocked behind it
    assert gate.in_flight_tokens == 95 and gate.queue_length == 0
    assert gate.give_up(3) is None  # already running: not a waiter any more


def test_expiry_refuses_exactly_at_the_deadline_and_admits_who_was_held_back():
    gate = AdmissionController(POLICY)
    gate.request(1, 90, now=0)
    gate.request(2, 50, now=1, key="a")     # blocked head: deadline 6
    gate.request(3, 5, now=2, key="a")      # behind it in its key's queue: deadline 7
    assert gate.next_deadline() == 6
    assert gate.expire(now=5.999) == Expiry(refused=(), admitted=())
    assert gate.expire(now=6) == Expiry(refused=(2,), admitted=(3,))
    assert gate.next_deadline() is None and gate.queue_length == 0
    assert gate.in_flight_tokens == 95
    assert gate.release(1) == [] and gate.release(3) == []
    assert gate.in_flight_tokens == 0 and gate.snapshot()["running"] == 0


def test_the_policy_comes_from_the_config():
    plain = AdmissionPolicy.from_config(AdmissionConfig())
    # Unset: a quarter of the queue per key; set to null: the whole queue.
    assert plain.long_budget is None and plain.max_queue_per_key == plain.max_queue // 4
    assert AdmissionConfig(max_queue=2).max_queue_per_key == 1
    assert AdmissionConfig(max_queue_per_key=None).max_queue_per_key is None
    assert (plain.token_budget, plain.max_queue, plain.max_wait_s, plain.retry_after_s) == (
        AdmissionConfig().token_budget, AdmissionConfig().max_queue,
        AdmissionConfig().max_wait_s, AdmissionConfig().retry_after_s)
    laned = AdmissionPolicy.from_config(AdmissionConfig(
        token_budget=1000, max_queue=4, max_queue_per_key=2, max_wait_s=3, retry_after_s=2,
        long_prompt_tokens=100, long_lane_share=0.25))
    assert laned == AdmissionPolicy(token_budget=1000, max_queue=4, max_wait_s=3,
                                    retry_after_s=2, max_queue_per_key=2, long_budget=250,
                                    key_budget=500)
    tiny = AdmissionConfig(token_budget=1, long_prompt_tokens=1, long_lane_share=0.1)
    assert AdmissionPolicy.from_config(tiny).long_budget == 1   # never a lane of 0 tokens


def test_a_request_over_the_whole_budget_is_refused_never_run_alone():
    """Run alone, it would hold every other client off for as long as it ran."""
    gate = AdmissionController(POLICY)
    assert gate.request(1, 101, now=0).action == "too_large"
    assert gate.snapshot()["running"] == 0 and gate.queue_length == 0
    assert gate.request(2, 100, now=0).action == "admit"        # the whole budget: fine
    assert gate.request(3, 500, now=0).action == "too_large"    # never queued either
    assert gate.queue_length == 0


events = st.lists(
    st.tuples(st.sampled_from(["request", "release", "give_up"]), st.integers(1, 150)),
    max_size=200,
)


@settings(max_examples=300)
@given(events)
def test_budget_queue_bound_and_fifo_hold_for_any_sequence(steps):
    gate = AdmissionController(POLICY)
    running, waiting, admitted_order, requested_order = set(), [], [], []
    for ticket, (action, value) in enumerate(steps):
        if action == "request":
            decision = gate.request(ticket, value, now=0)
            assert (decision.action == "too_large") == (value > POLICY.token_budget)
            if decision.action not in ("reject", "too_large"):
                requested_order.append(ticket)
            if decision.action == "admit":
                running.add(ticket)
                admitted_order.append(ticket)
            elif decision.action == "queue":
                waiting.append(ticket)
        elif action == "release" and running:
            done = sorted(running)[value % len(running)]
            running.discard(done)
            for t in gate.release(done):
                running.add(t)
                waiting.remove(t)
                admitted_order.append(t)
        elif action == "give_up" and waiting:
            leaving = waiting[value % len(waiting)]
            unblocked = gate.give_up(leaving)
            assert unblocked is not None
            waiting.remove(leaving)
            requested_order.remove(leaving)
            for t in unblocked:
                running.add(t)
                waiting.remove(t)
                admitted_order.append(t)
        assert gate.queue_length <= POLICY.max_queue
        assert gate.in_flight_tokens <= POLICY.token_budget
        assert gate.in_flight_tokens >= 0
    # first come, first served: admission order is request order
    assert admitted_order == [t for t in requested_order if t in set(admitted_order)]


@pytest.mark.parametrize(("tokens", "threshold", "path"), [
    (10, 0, "disaggregated"), (10, 256, "decode_local"), (255, 256, "decode_local"),
    (256, 256, "disaggregated"), (5000, 256, "disaggregated"),
])
def test_choose_path(tokens, threshold, path):
    assert choose_path(tokens, threshold) == path


@pytest.mark.parametrize(("tokens", "threshold", "holder", "held", "choice"), [
    (900, 256, None, 0, PathChoice("disaggregated")),              # nobody holds it
    (900, 256, "d", 640, PathChoice("disaggregated")),              # 260 left: over
    (900, 256, "d", 645, PathChoice("decode_local", "d")),          # 255 left: under
    (900, 256, "d", 900, PathChoice("decode_local", "d")),          # all held: it computes 1
    (100, 256, "d", 96, PathChoice("decode_local")),                # short anyway: not pinned
    (900, 0, "d", 900, PathChoice("disaggregated")),                # 0 disaggregates all
])
def test_a_prompt_whose_head_a_decode_engine_holds_is_judged_by_the_rest(
        tokens, threshold, holder, held, choice):
    assert choose_path_with_cache(tokens, threshold, holder, held) == choice


@pytest.mark.parametrize("bad", [{"token_budget": 0}, {"max_queue": -1}, {"max_wait_s": 0},
                                 {"max_queue_per_key": -1}, {"long_lane_share": 0}])
def test_policy_validation_lives_in_the_config(bad):
    with pytest.raises(ValueError):
        policy(**bad)


FAIR = policy(token_budget=100, max_queue=10, max_wait_s=5, max_queue_per_key=3)


def test_a_flooding_key_fills_only_its_own_queue_and_keys_take_turns():
    gate = AdmissionController(FAIR)
    assert gate.request(0, 100, now=0, key="flood").action == "admit"   # budget full
    for ticket in (1, 2, 3):
        assert gate.request(ticket, 50, now=0, key="flood").action == "queue"
    refused = gate.request(4, 50, now=0, key="flood")
    assert (refused.action, refused.retry_after_s) == ("reject", 1)     # its share is used
    assert gate.request(5, 50, now=0, key="quiet").action == "queue"    # others still queue
    assert gate.request(6, 50, now=0, key="quiet").action == "queue"
    # budget frees: two fit; the keys take turns instead of the flood going first twice
    assert gate.release(0) == [1, 5]
    assert gate.release(1) == [2]
    assert gate.release(5) == [6]


def test_other_keys_pass_a_large_head_that_keeps_its_place():
    gate = AdmissionController(FAIR)
    gate.request(0, 60, now=0, key="a")
    assert gate.request(1, 90, now=0, key="big").action == "queue"    # 60 + 90 > 100
    assert gate.request(2, 20, now=0, key="small").action == "admit"  # fits: not held back
    assert gate.request(3, 30, now=0, key="small").action == "queue"  # 110 > 100
    assert gate.release(2) == [3]   # big still does not fit beside 60; small's 30 does
    assert gate.release(0) == []    # 30 + 90 > 100: big keeps waiting, first in line
    assert gate.release(3) == [1]   # and goes as soon as it fits


keyed_events = st.lists(
    st.tuples(st.sampled_from(["request", "release", "give_up"]), st.integers(1, 150),
              st.sampled_from("abc")),
    max_size=200,
)


@settings(max_examples=300)
@given(keyed_events)
def test_fair_queues_keep_every_bound_and_fifo_within_a_key(steps):
    gate = AdmissionController(FAIR)
    running, waiting = set(), {}           # waiting: ticket -> key
    order: dict[str, list[int]] = {}       # per key: tickets in request order
    admitted: dict[str, list[int]] = {}
    for ticket, (action, value, key) in enumerate(steps):
        if action == "request":
            decision = gate.request(ticket, value, now=0, key=key)
            assert (decision.action == "too_large") == (value > FAIR.token_budget)
            if decision.action == "admit":
                running.add(ticket)
                admitted.setdefault(key, []).append(ticket)
            elif decision.action == "queue":
                waiting[ticket] = key
            if decision.action not in ("reject", "too_large"):
                order.setdefault(key, []).append(ticket)
            unblocked = []
        elif action == "release" and running:
            done = sorted(running)[value % len(running)]
            unblocked = gate.release(done)
            running.discard(done)
        elif action == "give_up" and waiting:
            leaving = sorted(waiting)[value % len(waiting)]
            unblocked = gate.give_up(leaving) or []
            order[waiting.pop(leaving)].remove(leaving)
        else:
            unblocked = []
        for t in unblocked:
            running.add(t)
            admitted.setdefault(waiting[t], []).append(t)
            del waiting[t]
        assert running == set(gate._running)
        assert gate.queue_length == len(waiting) <= FAIR.max_queue
        for k in "abc":
            assert sum(1 for w in waiting.values() if w == k) <= FAIR.key_queue_limit
        assert gate.in_flight_tokens <= FAIR.token_budget
    for key, tickets in admitted.items():
        assert tickets == [t for t in order[key] if t in set(tickets)], "FIFO within a key"


def test_client_key_hashes_api_keys_and_falls_back_to_user():
    from router.admission import client_key

    key = client_key("Bearer sk-secret-123", "alice")
    assert key.startswith("key:") and "secret" not in key
    assert key == client_key("bearer sk-secret-123", None)
    assert client_key("Bearer other", None) != key
    assert client_key(None, "alice") == "user:alice"
    assert client_key("Basic abc", None) == client_key(None, None) == "anonymous"


LANES = policy(token_budget=100, max_queue=10, max_wait_s=5, long_prompt_tokens=1000,
               long_lane_share=0.6)   # the long lane may hold 60 tokens


def test_a_waiting_long_prompt_does_not_hold_back_short_ones_of_the_same_key():
    gate = AdmissionController(LANES)
    assert gate.request(1, 50, now=0, key="a", long=True).action == "admit"
    assert gate.request(2, 40, now=0, key="a", long=True).action == "queue"   # 90 > 60
    assert gate.request(3, 30, now=0, key="a").action == "admit"   # short lane: fits 100
    assert gate.long_in_flight_tokens == 50 and gate.in_flight_tokens == 80
    assert gate.release(1) == [2]
    assert gate.long_in_flight_tokens == 40


def test_without_a_long_budget_lanes_share_the_whole_budget():
    gate = AdmissionController(policy(token_budget=100, max_queue=10, max_wait_s=5))
    assert gate.request(1, 50, now=0, long=True).action == "admit"
    assert gate.request(2, 50, now=0, long=True).action == "admit"


lane_events = st.lists(
    st.tuples(st.sampled_from(["request", "release", "give_up"]), st.integers(1, 150),
              st.booleans(), st.sampled_from(["a", "b"])),
    max_size=200,
)


@settings(max_examples=300)
@given(lane_events)
def test_the_long_lane_never_exceeds_its_budget_and_short_fits_are_never_kept_waiting(steps):
    gate = AdmissionController(LANES)
    running: dict[int, bool] = {}
    waiting: dict[int, bool] = {}
    for ticket, (action, value, long, key) in enumerate(steps):
        admitted: list[int] = []
        if action == "request":
            decision = gate.request(ticket, value, now=0, key=key, long=long)
            if decision.action == "admit":
                running[ticket] = long
            elif decision.action == "queue":
                waiting[ticket] = long
        elif action == "release" and running:
            done = sorted(running)[value % len(running)]
            del running[done]
            admitted = gate.release(done)
        elif action == "give_up" and waiting:
            admitted = gate.give_up(sorted(waiting)[value % len(waiting)]) or []
            waiting.pop(sorted(waiting)[value % len(waiting)])
        for t in admitted:
            running[t] = waiting.pop(t)
        longs_running = sum(1 for is_long in running.values() if is_long)
        assert gate.long_in_flight_tokens <= LANES.long_budget or longs_running == 1
        assert gate.in_flight_tokens <= LANES.token_budget or len(running) == 1
        # nobody waits in the short lane while its head would fit: lanes never block it
        assert not any(not is_long for is_long in waiting.values()) or running


SHARED = policy(token_budget=100, max_queue=10, max_wait_s=5, max_queue_per_key=5,
                max_running_share_per_key=0.5)


def test_a_key_holding_its_share_running_waits_while_another_key_is_admitted():
    gate = AdmissionController(SHARED)
    assert gate.request(1, 30, now=0, key="a").action == "admit"
    assert gate.request(2, 20, now=0, key="a").action == "admit"   # 50: its share
    assert gate.request(3, 10, now=0, key="a").action == "queue"   # the budget has room
    assert gate.request(4, 40, now=0, key="b").action == "admit"   # another key's share
    assert gate.snapshot()["tokens_in_flight"] == 90
    assert gate.release(4) == []        # room in the budget, none in a's share
    assert gate.release(2) == [3]       # a's own request ended: its next one runs


def test_a_key_may_always_run_one_request_within_the_budget():
    """A request larger than a key's share would otherwise wait for nothing."""
    gate = AdmissionController(SHARED)
    assert gate.request(1, 80, now=0, key="a").action == "admit"
    assert gate.request(2, 70, now=0, key="b").action == "queue"   # the budget: 150 > 100
    assert gate.release(1) == [2]


def test_the_share_is_off_when_one_key_calls_for_many_users():
    gate = AdmissionController(policy(token_budget=100, max_queue=10, max_wait_s=5,
                                      max_running_share_per_key=None))
    for ticket in range(1, 5):
        assert gate.request(ticket, 25, now=0, key="gateway").action == "admit"


def test_a_share_is_a_fraction_of_the_budget_by_default_half():
    assert AdmissionPolicy.from_config(AdmissionConfig(token_budget=1000)).key_budget == 500
    assert policy(token_budget=1000, max_running_share_per_key=0.25).key_budget == 250


@pytest.mark.parametrize("key", ["", "anonymous"])
def test_requests_without_an_identity_are_not_capped_by_a_share(key):
    """With neither an API key nor a user they may be every client there is."""
    gate = AdmissionController(SHARED)
    for ticket in range(1, 5):
        assert gate.request(ticket, 25, now=0, key=key).action == "admit"


def test_a_user_name_cannot_name_another_clients_long_lane():
    """Queues are (key, lane) pairs: a `user` ending in what a joined name would use for
    the long lane queues as itself, not in the lane of the user it imitates."""
    gate = AdmissionController(policy(token_budget=100, max_queue=10, max_wait_s=5,
                                      max_queue_per_key=1, long_prompt_tokens=10,
                                      long_lane_share=0.5))
    assert gate.request(1, 100, now=0, key="user:a").action == "admit"      # budget full
    assert gate.request(2, 10, now=0, key="user:a", long=True).action == "queue"
    # its own short lane, not user:a's long one (whose share of the queue is used)
    assert gate.request(3, 10, now=0, key="user:a\x00long").action == "queue"
    assert gate.release(1) == [2, 3]
