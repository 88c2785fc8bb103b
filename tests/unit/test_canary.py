"""The canary gate: replayed traffic through OutcomeWindow and decide, and its invariants."""

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cluster.config import CanaryConfig
from router.canary import CanaryPolicy, GateDecision, OutcomeWindow, WindowStats, decide, p95
from router.versions import Rollout


def gate(**fields) -> CanaryPolicy:
    """The gate of a canary section with ``fields`` set (the others: the config's defaults)."""
    return CanaryPolicy.from_config(
        CanaryConfig(served_model="chat", baseline="v1", candidate="v2", **fields))


POLICY = gate()  # steps 5, 25, 50, 100; 300 s window; 50 requests per side


@dataclass(frozen=True)
class Behaviour:
    """How a synthetic version answers: error probability, TTFT and ITL scales."""

    error_rate: float = 0.001
    ttft_s: float = 0.3
    itl_s: float = 0.03


HEALTHY = Behaviour()


def replay(canary: Behaviour, *, rps: int = 20, tick_s: float = 10.0, horizon_s: float = 3600,
           veto=None, seed: int = 7) -> list[GateDecision]:
    """Drive a rollout with a fake clock: traffic each second, the gate every ``tick_s``.

    Returns the decisions that changed the percent, ending at 100 or 0 (or the horizon).
    """
    rng = random.Random(seed)
    rollout = Rollout("chat", "v1", "v2", POLICY.steps[0])
    window = OutcomeWindow.for_policy(POLICY)
    behaviours = {"v1": HEALTHY, "v2": canary}
    last_change_at, changes = 0.0, []
    for second in range(1, int(horizon_s) + 1):
        for _ in range(rps):
            version = rollout.choose(None, rng.random())
            b = behaviours[version]
            ok = rng.random() >= b.error_rate
            window.record(second, version, ok,
                          b.ttft_s * rng.lognormvariate(0, 0.3) if ok else None,
                          b.itl_s * rng.lognormvariate(0, 0.2) if ok else None)
        if second % tick_s:
            continue
        now = float(second)
        decision = decide(POLICY, rollout.canary_percent, window.stats("v1", now),
                          window.stats("v2", now), veto, now, last_change_at)
        if decision.action == "hold":
            continue
        changes.append(decision)
        if decision.to_percent in (0, 100):
            return changes
        rollout, last_change_at = rollout.at_percent(decision.to_percent), now
    return changes


def test_a_healthy_canary_is_promoted_step_by_step_to_the_new_baseline():
    changes = replay(HEALTHY)
    assert [(d.action, d.from_percent, d.to_percent) for d in changes] == [
        ("promote", 5, 25), ("promote", 25, 50), ("promote", 50, 100)]
    assert changes[-1].completes_rollout and "new baseline" in changes[-1].reason
    assert "error rate" in changes[0].reason and "p95 TTFT" in changes[0].reason


def test_a_canary_with_more_errors_is_rolled_back():
    changes = replay(Behaviour(error_rate=0.05))
    assert [(d.action, d.from_percent, d.to_percent) for d in changes] == [("rollback", 5, 0)]
    assert "error rate" in changes[0].reason and "pp" in changes[0].reason


def test_a_canary_with_slower_first_tokens_is_rolled_back():
    changes = replay(Behaviour(ttft_s=0.5))
    assert [(d.action, d.to_percent) for d in changes] == [("rollback", 0)]
    assert "p95 TTFT" in changes[0].reason and "limit 1.2x" in changes[0].reason


def test_a_canary_with_slower_tokens_is_rolled_back():
    changes = replay(Behaviour(itl_s=0.05))
    assert [(d.action, d.to_percent) for d in changes] == [("rollback", 0)]
    assert "p95 ITL" in changes[0].reason


def test_a_vetoed_canary_is_held_and_with_rollback_on_veto_rolled_back():
    assert replay(HEALTHY, veto=True, horizon_s=1200) == []
    ok = stats(500)
    held = decide(POLICY, 25, ok, ok, True, now=1000, last_change_at=0, veto_reason="evals -3%")
    assert (held.action, held.to_percent) == ("hold", 25) and "evals -3%" in held.reason
    strict = gate(rollback_on_veto=True)
    rolled = decide(strict, 25, ok, ok, True, now=1000, last_change_at=0)
    assert (rolled.action, rolled.to_percent) == ("rollback", 0)
    assert decide(POLICY, 25, ok, ok, False, now=1000, last_change_at=0).action == "promote"


def stats(requests: int, errors: int = 0, ttft: float | None = 0.3,
          itl: float | None = 0.03) -> WindowStats:
    return WindowStats(requests, errors, ttft, itl)


def test_holds_with_too_few_requests_even_when_the_canary_looks_bad():
    few = decide(POLICY, 5, stats(1000), stats(49, errors=40), None, now=1000, last_change_at=0)
    assert (few.action, few.to_percent) == ("hold", 5) and "49/50" in few.reason
    thin = decide(POLICY, 50, stats(10), stats(1000), None, now=1000, last_change_at=0)
    assert thin.action == "hold" and "baseline has 10/50" in thin.reason


def test_holds_within_the_window_after_a_change_but_rolls_back_at_once():
    waiting = decide(POLICY, 25, stats(1000), stats(300), None, now=1120, last_change_at=1000)
    assert waiting.action == "hold" and "120s of 300s" in waiting.reason
    bad = decide(POLICY, 25, stats(1000), stats(300, ttft=0.9), None, now=1120,
                 last_change_at=1000)
    assert (bad.action, bad.to_percent) == ("rollback", 0) and "3.00x" in bad.reason
    ready = decide(POLICY, 25, stats(1000), stats(300), None, now=1300, last_change_at=1000)
    assert (ready.action, ready.to_percent) == ("promote", 50)


def test_thresholds_are_inclusive_and_error_delta_is_absolute():
    base = stats(1000, errors=10)                                    # 1.00%
    at_limit = decide(POLICY, 5, base, stats(100, errors=2, ttft=0.36, itl=0.036), None,
                      now=400, last_change_at=0)                     # +1.00 pp, 1.2x, 1.2x
    assert at_limit.action == "promote", at_limit.reason
    over = decide(POLICY, 5, base, stats(100, errors=3), None, now=400, last_change_at=0)
    assert over.action == "rollback" and "+2.00 pp" in over.reason
    # no latency samples on one side: compare what there is
    blind = decide(POLICY, 5, stats(1000, ttft=None, itl=None), stats(100), None, now=400,
                   last_change_at=0)
    assert blind.action == "promote"


def test_done_and_stopped_rollouts_only_hold_and_odd_percents_are_refused():
    assert decide(POLICY, 100, stats(0), stats(0), None, 0, 0).action == "hold"
    assert decide(POLICY, 0, stats(0), stats(0), None, 0, 0).action == "hold"
    with pytest.raises(ValueError):
        decide(POLICY, 10, stats(100), stats(100), None, 1000, 0)


@pytest.mark.parametrize("kwargs", [
    {"steps": ()}, {"steps": (5, 50)}, {"steps": (25, 5, 100)}, {"steps": (0, 100)},
    {"steps": (5, 5, 100)}, {"window_s": 0}, {"min_requests": 0},
    {"max_error_rate_delta": -0.1}, {"max_ttft_p95_ratio": 0.9}, {"max_itl_p95_ratio": 0.99},
    {"max_samples_per_version": 0},
])
def test_the_config_refuses_what_the_gate_cannot_run(kwargs):
    # The validation lives in CanaryConfig: what `pdserve config` accepts, the gate runs.
    with pytest.raises(ValidationError):
        gate(**kwargs)


def test_the_gate_takes_every_threshold_from_its_config():
    policy = gate(steps=[10, 100], window_s=60, min_requests=5, max_error_rate_delta=0.02,
                  max_ttft_p95_ratio=1.5, max_itl_p95_ratio=1.0, rollback_on_veto=True,
                  max_samples_per_version=99)
    assert policy == CanaryPolicy(
        steps=(10, 100), window_s=60, min_requests=5, max_error_rate_delta=0.02,
        max_ttft_p95_ratio=1.5, max_itl_p95_ratio=1.0, rollback_on_veto=True,
        max_samples_per_version=99)
    # the config's defaults are the gate's former ones
    former = CanaryPolicy(
        steps=(5, 25, 50, 100), window_s=300, min_requests=50, max_error_rate_delta=0.01,
        max_ttft_p95_ratio=1.2, max_itl_p95_ratio=1.2, rollback_on_veto=False,
        max_samples_per_version=10_000)
    assert gate() == former


def test_outcome_window_keeps_the_last_window_per_version():
    window = OutcomeWindow(window_s=60)
    for t in range(100):                       # t = 0..99, one sample a second
        window.record(t, "v1", ok=t % 10 != 0, ttft_s=float(t), itl_s=t / 100)
    window.record(99, "v2", ok=False)
    s = window.stats("v1", now=99)             # 40..99: 60 samples, 6 errors
    assert (s.requests, s.errors) == (60, 6)
    assert s.ttft_p95_s == 96.0                # failures report TTFT too when they had one
    assert window.stats("v2", now=99) == WindowStats(1, 1, None, None)
    assert window.stats("v3", now=99) == WindowStats(0, 0, None, None)
    assert window.stats("v1", now=500).requests == 0


def test_outcome_window_memory_is_bounded_and_out_of_order_samples_count():
    window = OutcomeWindow(window_s=1000, max_samples_per_version=100)
    for t in range(1000):
        window.record(t, "v1", ok=True, ttft_s=1.0)
    assert window.stats("v1", now=1000).requests == 100
    late = OutcomeWindow(window_s=10)
    for t in (5, 3, 9, 1):                     # finished out of order
        late.record(t, "v1", ok=True)
    assert late.stats("v1", now=14).requests == 2   # only 5 and 9 are after 14 - 10


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=300))
def test_p95_is_an_exact_nearest_rank_percentile(values):
    q = p95(values)
    assert q in values
    below_or_at = sum(v <= q for v in values)
    assert below_or_at >= 0.95 * len(values)
    assert sum(v < q for v in values) < 0.95 * len(values)


side = st.builds(WindowStats, st.integers(0, 400), st.integers(0, 400),
                 st.none() | st.floats(0, 5), st.none() | st.floats(0, 1)).filter(
    lambda s: s.errors <= s.requests)
policies = st.builds(gate,
                     steps=st.lists(st.integers(1, 99), max_size=5, unique=True).map(
                         lambda xs: [*sorted(xs), 100]),
                     min_requests=st.integers(1, 100), rollback_on_veto=st.booleans())


@settings(max_examples=300)
@given(policies, st.data(), side, side, st.none() | st.booleans(), st.floats(0, 2000),
       st.floats(0, 2000))
def test_every_decision_lands_on_a_step_and_promotes_one_step_at_a_time(
        policy, data, baseline, canary, veto, now, last_change_at):
    current = data.draw(st.sampled_from((0, *policy.steps)))
    decision = decide(policy, current, baseline, canary, veto, now, last_change_at)
    assert decision.from_percent == current
    assert decision.to_percent in {0, *policy.steps}
    if decision.action == "promote":
        assert decision.to_percent == min(s for s in policy.steps if s > current)
        assert now - last_change_at >= policy.window_s and not veto
        assert min(baseline.requests, canary.requests) >= policy.min_requests
    elif decision.action == "rollback":
        assert decision.to_percent == 0 < current < 100
        assert min(baseline.requests, canary.requests) >= policy.min_requests
    else:
        assert decision.to_percent == current
    assert decision == decide(policy, current, baseline, canary, veto, now, last_change_at)
