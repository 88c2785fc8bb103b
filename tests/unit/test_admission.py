"""Admission control and the disaggregation choice (pure policies of the router)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.admission import AdmissionController, AdmissionPolicy
from router.disaggregation import choose_path

POLICY = AdmissionPolicy(token_budget=100, max_queue=2, max_wait_s=5, retry_after_s=3)


def test_admits_within_budget_then_queues_then_refuses():
    gate = AdmissionController(POLICY)
    assert gate.request(1, 60, now=0).action == "admit"
    assert gate.request(2, 30, now=0).action == "admit"
    assert gate.request(3, 30, now=0).action == "queue"       # 120 > 100
    assert gate.request(4, 5, now=0).action == "queue"        # fits, but FIFO: no overtaking
    refused = gate.request(5, 1, now=0)
    assert (refused.action, refused.status, refused.retry_after_s) == ("reject", 429, 3)
    assert gate.release(1) == [3, 4]                          # 30 + 30 + 5 <= 100
    assert gate.in_flight_tokens == 65 and gate.queue_length == 0


def test_waiters_expire_and_giving_up_unblocks_the_queue():
    gate = AdmissionController(POLICY)
    gate.request(1, 90, now=0)
    gate.request(2, 50, now=1)      # blocked head
    gate.request(3, 5, now=2)
    assert gate.expired(now=6.5) == [2]
    assert gate.give_up(2) == [3]  # 3 was blocked behind it
    assert gate.in_flight_tokens == 95 and gate.queue_length == 0
    assert gate.give_up(3) is None  # already running: not a waiter any more


def test_an_oversized_request_runs_alone_instead_of_never():
    gate = AdmissionController(POLICY)
    assert gate.request(1, 500, now=0).action == "admit"
    assert gate.request(2, 1, now=0).action == "queue"
    assert gate.release(1) == [2]


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
            if decision.action != "reject":
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
        assert gate.in_flight_tokens <= POLICY.token_budget or len(running) == 1
        assert gate.in_flight_tokens >= 0
    # first come, first served: admission order is request order
    assert admitted_order == [t for t in requested_order if t in set(admitted_order)]


@pytest.mark.parametrize(("tokens", "threshold", "path"), [
    (10, 0, "disaggregated"), (10, 256, "decode_local"), (255, 256, "decode_local"),
    (256, 256, "disaggregated"), (5000, 256, "disaggregated"),
])
def test_choose_path(tokens, threshold, path):
    assert choose_path(tokens, threshold) == path


def test_policy_validation():
    with pytest.raises(ValueError):
        AdmissionPolicy(token_budget=0, max_queue=1, max_wait_s=1)
