"""Pool autoscaling decisions (pure; the Ray Serve adapter is tested in tests/component)."""

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.autoscaling.config import (
    AutoscalingConfig,
    DecodeScalingConfig,
    PrefillScalingConfig,
    ReplicaBounds,
    StandbySchedule,
    StandbyWindow,
)
from cluster.autoscaling.policy import (
    PoolLoad,
    PoolState,
    PoolView,
    ReplicaObservation,
    decide_app,
    decide_decode,
    decide_prefill,
    mix_ratio,
)
from cluster.slo import SLOConfig

PREFILL = PrefillScalingConfig(max_replicas=16)
DECODE = DecodeScalingConfig(max_replicas=32)
SLO = SLOConfig()  # p95 TTFT 0.5 s, p95 ITL 0.05 s
T = 1_750_000_000.0  # a fixed "now"


def view(current: int, state: PoolState | None = None, **totals) -> PoolView:
    """``current`` replicas, all running, sharing the pool totals given."""
    return PoolView(current, PoolLoad.spread(max(current, 1), **totals),
                    state or PoolState(), running=current)


prefill_view = decode_view = view


IDLE_PREFILL = {"queued_prefill_tokens": 0.0, "ttft_p95_s": 0.05, "prompt_tokens_per_s": 0.0}
IDLE_DECODE = {"running_seqs": 0.0, "kv_usage": 0.0, "itl_p95_s": 0.02,
               "output_tokens_per_s": 0.0}


# --- prefill -------------------------------------------------------------------------------


def test_queued_prefill_tokens_above_target_scale_up_with_a_readable_reason():
    decision = decide_prefill(prefill_view(2, queued_prefill_tokens=41_000), PREFILL, SLO, T)
    assert (decision.current, decision.desired, decision.direction) == (2, 4, "up")
    assert decision.reason == ("up: queued prefill tokens 41k > 2 x 16k target "
                               "(to 4, 20% spare)")
    assert decision.state.last_scale_up_s == T


def test_a_ttft_breach_scales_up_in_proportion_but_at_most_by_the_step_factor():
    mild = decide_prefill(prefill_view(4, ttft_p95_s=0.6), PREFILL, SLO, T)
    assert mild.desired == 5 and mild.reason == "up: p95 TTFT 0.60 s > 0.50 s SLO"
    severe = decide_prefill(prefill_view(4, ttft_p95_s=3.0), PREFILL, SLO, T)
    assert severe.desired == 8                                     # x2, not x6
    one = decide_prefill(prefill_view(1, ttft_p95_s=0.51), PREFILL, SLO, T)
    assert one.desired == 2                                        # at least one more


def test_prompt_throughput_sizes_prefill_at_its_target_utilisation():
    # 32768 tokens/s per replica at 75%: 24576 planned; 80k tokens/s need 3.3 replicas,
    # and the scale-up lands with the hysteresis (20%) to spare: 3.3 / 0.8 -> 5.
    decision = decide_prefill(prefill_view(3, prompt_tokens_per_s=80_000), PREFILL, SLO, T)
    assert decision.need == pytest.approx(80_000 / 24_576)
    assert decision.desired == 5
    assert decision.reason == "up: prompt 80k tokens/s > 3 x 25k tokens/s (to 5, 20% spare)"


def test_a_scale_up_lands_with_the_spare_the_scale_down_rule_keeps():
    """After a scale-up the load may grow by 1 / (1 - hysteresis) before the pool needs
    another (its new replicas serve minutes later, on a load that kept rising), and the
    same load does not shrink it back."""
    grown = decide_prefill(prefill_view(4, prompt_tokens_per_s=150_000), PREFILL, SLO, T)
    assert (grown.direction, grown.desired) == ("up", 8)       # need 6.1, 6.1 / 0.8 -> 8
    later = T + 3600                                  # the replicas serve, cool-downs passed
    served = replace(grown.state, ready_since_s=T + 300)
    for load in (150_000, 150_000 / (1 - PREFILL.hysteresis) * 0.99):
        again = decide_prefill(prefill_view(grown.desired, prompt_tokens_per_s=load,
                                            state=served), PREFILL, SLO, later)
        # neither up nor down wanted (a wanted scale-down would be "down to N wanted")
        assert again.direction == "hold" and "down to" not in again.reason, again.reason


def test_more_load_lands_no_lower_when_a_latency_need_wins():
    """The highest landing of all needs counts, not the winning need's alone: a TTFT just
    over the SLO asks for a step without spare (4 -> 5) beside a throughput need of 4.4,
    which lands at 6 with its spare."""
    rate = 4.2 * 24_576
    calm = decide_prefill(prefill_view(4, prompt_tokens_per_s=rate, ttft_p95_s=0.49),
                          PREFILL, SLO, T)
    busier = decide_prefill(prefill_view(4, prompt_tokens_per_s=rate * 1.05,
                                         ttft_p95_s=0.5145), PREFILL, SLO, T)
    assert calm.desired == 6                                  # 4.2 / 0.8 -> 6
    assert busier.desired == 6 and busier.reason == (
        "up: p95 TTFT 0.51 s > 0.50 s SLO (to 6, 20% spare)")


def test_without_hysteresis_a_scale_up_lands_on_the_need():
    exact = PREFILL.model_copy(update={"hysteresis": 0.0})
    decision = decide_prefill(prefill_view(3, prompt_tokens_per_s=80_000), exact, SLO, T)
    assert decision.desired == 4 and "spare" not in decision.reason      # 3.3 -> 4


def test_a_spare_the_step_cuts_short_says_so():
    decision = decide_prefill(prefill_view(4, prompt_tokens_per_s=7.5 * 24_576),
                              PREFILL, SLO, T)
    assert decision.desired == 8                      # need 7.5 fits the x2 step; 9.4 not
    assert decision.reason == ("up: prompt 184k tokens/s > 4 x 25k tokens/s "
                               "(to 8, its 20% spare capped by the x2 step)")


def test_a_huge_backlog_is_climbed_in_steps_not_in_one_jump():
    decision = decide_prefill(prefill_view(3, queued_prefill_tokens=3_000_000), PREFILL, SLO, T)
    assert decision.desired == 6 and "step of at most x2" in decision.reason
    assert decision.need == pytest.approx(3_000_000 / 16384)


def test_the_next_scale_up_waits_for_starting_replicas_and_then_the_cool_down():
    after_up = PoolState(last_scale_up_s=T)
    starting = PoolView(6, PoolLoad.spread(3, ttft_p95_s=2.0), after_up, running=3)
    decision = decide_prefill(starting, PREFILL, SLO, T + 200)
    assert decision.direction == "hold" and "3 replica(s) still starting" in decision.reason

    ready = replace(starting, running=6)
    first_seen = decide_prefill(ready, PREFILL, SLO, T + 230)      # all up: metrics lag
    assert first_seen.direction == "hold" and "settling" in first_seen.reason
    assert first_seen.state.ready_since_s == T + 230
    settled = decide_prefill(replace(ready, state=first_seen.state), PREFILL, SLO, T + 230 + 60)
    assert settled.direction == "up" and settled.desired == 12


def test_without_a_running_count_the_cool_down_counts_from_the_scale_up():
    view = PoolView(4, PoolLoad.spread(4, ttft_p95_s=1.0), PoolState(last_scale_up_s=T))
    assert decide_prefill(view, PREFILL, SLO, T + 59).direction == "hold"
    assert decide_prefill(view, PREFILL, SLO, T + 60).direction == "up"


def test_scale_down_needs_headroom_latency_margin_a_sustained_wish_and_a_cool_down():
    config = PREFILL
    low = {"queued_prefill_tokens": 1000.0, "ttft_p95_s": 0.1, "prompt_tokens_per_s": 1000.0}
    state = PoolState(last_scale_up_s=T - 10_000)
    first = decide_prefill(prefill_view(5, state, **low), config, SLO, T)
    assert first.direction == "hold" and "wanted for 0 s of 300 s" in first.reason
    waiting = decide_prefill(prefill_view(5, first.state, **low), config, SLO, T + 299)
    assert waiting.direction == "hold"
    down = decide_prefill(prefill_view(5, waiting.state, **low), config, SLO, T + 300)
    assert (down.desired, down.direction) == (4, "down")          # one step at a time
    assert down.reason.startswith("down: ")
    # The wish to shrink further starts again at the next tick; the next step then waits
    # for the cool-down since this scale-down, although the wish has lasted long enough.
    wish = decide_prefill(prefill_view(4, down.state, **low), config, SLO, T + 301)
    again = decide_prefill(prefill_view(4, wish.state, **low), config, SLO, T + 300 + 599)
    assert again.direction == "hold" and "cool-down (1 s left)" in again.reason
    later = decide_prefill(prefill_view(4, again.state, **low), config, SLO, T + 300 + 600)
    assert later.direction == "down"


def test_a_recent_scale_up_blocks_scale_down_for_the_cool_down():
    low = {"queued_prefill_tokens": 0.0, "ttft_p95_s": 0.1, "prompt_tokens_per_s": 0.0}
    state = PoolState(last_scale_up_s=T - 500, down_wanted_since_s=T - 400)
    decision = decide_prefill(prefill_view(5, state, **low), PREFILL, SLO, T)
    assert decision.direction == "hold" and "cool-down (100 s left)" in decision.reason


def test_load_inside_the_hysteresis_band_or_latency_near_the_slo_holds():
    # 3 replicas of load: 3 fit in 3, but not with 20% spare in 3 -> no scale-down from 4.
    band = decide_prefill(prefill_view(4, queued_prefill_tokens=3 * 16384 * 0.9), PREFILL, SLO,
                          T)
    assert band.direction == "hold" and band.reason.endswith("needs 4 replicas with 20% headroom")
    # 3.9 replicas of load fit in 4 with no scale-up, but need 5 with the spare: said as such
    full = decide_prefill(prefill_view(4, queued_prefill_tokens=3.9 * 16384), PREFILL, SLO, T)
    assert full.direction == "hold" and full.reason.endswith(
        "needs 5 replicas with 20% headroom, holding 4")
    near_slo = decide_prefill(prefill_view(4, ttft_p95_s=0.45), PREFILL, SLO, T)
    assert near_slo.direction == "hold" and "within 20% of 0.50 s SLO" in near_slo.reason


def test_no_metrics_means_hold_not_scale_to_the_minimum():
    view = PoolView(5, PoolLoad((ReplicaObservation(),) * 5), PoolState(), running=5)
    decision = decide_prefill(view, PREFILL, SLO, T)
    assert decision.desired == 5 and decision.reason == "hold: no metrics reported"


def test_bounds_of_the_view_override_the_pool_config_and_max_wins_over_the_floor():
    bounds = ReplicaBounds(min_replicas=3, max_replicas=4)
    view = PoolView(2, PoolLoad.spread(2, **IDLE_PREFILL), bounds=bounds, running=2)
    assert decide_prefill(view, PREFILL, SLO, T).desired == 3
    busy = replace(view, current=4, load=PoolLoad.spread(4, queued_prefill_tokens=10**6))
    capped = decide_prefill(busy, PREFILL, SLO, T)
    assert capped.desired == 4 and "max_replicas 4" not in capped.reason  # already there
    evening = PREFILL.model_copy(update={"standby": StandbySchedule(
        windows=[StandbyWindow(start="00:00", end="23:59", min_replicas=9)])})
    floored = decide_prefill(view, evening, SLO, datetime(2025, 6, 11, 12, tzinfo=UTC))
    assert (floored.floor, floored.desired) == (9, 4)
    assert floored.reason == (
        "up: standby floor 9 (queued prefill tokens 0 fits 0 x 16k target with 20% headroom)")


def test_the_standby_floor_raises_at_once_and_is_reported():
    plan = StandbySchedule(timezone="Europe/Berlin", ramp_minutes=0,
                           windows=[StandbyWindow(start="17:00", end="23:00", min_replicas=6)])
    config = PREFILL.model_copy(update={"standby": plan})
    at = datetime(2025, 6, 11, 18, tzinfo=UTC)                   # 20:00 in Berlin
    starting = PoolView(2, PoolLoad.spread(1, **IDLE_PREFILL), PoolState(last_scale_up_s=T),
                        running=1)
    decision = decide_prefill(starting, config, SLO, at)
    assert (decision.desired, decision.floor, decision.direction) == (6, 6, "up")
    assert decision.reason.startswith("up: standby floor 6")


# --- decode --------------------------------------------------------------------------------


def test_decode_scales_on_running_sequences_kv_cache_and_itl():
    seqs = decide_decode(decode_view(2, running_seqs=400), DECODE, SLO, T)
    assert seqs.desired == 4 and seqs.reason == "up: running seqs 400 > 2 x 128 target"
    kv = decide_decode(decode_view(4, kv_usage=0.95), DECODE, SLO, T)
    assert kv.desired == 6 and kv.reason == ("up: mean KV-cache use 95% > 80% target "
                                             "(to 6, 20% spare)")    # 4.75 / 0.8
    itl = decide_decode(decode_view(4, itl_p95_s=0.08), DECODE, SLO, T)
    assert itl.desired == 7 and itl.reason == "up: p95 ITL 0.08 s > 0.05 s SLO"
    fine = decide_decode(decode_view(4, running_seqs=400, kv_usage=0.6, itl_p95_s=0.03),
                         DECODE, SLO, T)
    assert fine.direction == "hold"


def test_output_throughput_sizes_decode_at_its_target_utilisation():
    # 3000 tokens/s per replica at 75%: 2250 planned; 9000 tokens/s need 4 replicas.
    decision = decide_decode(decode_view(2, output_tokens_per_s=9000), DECODE, SLO, T)
    assert decision.desired == 4 and "output 9.0k tokens/s > 2 x 2.2k tokens/s" in (
        decision.reason)


# --- both pools ----------------------------------------------------------------------------


CONFIG = AutoscalingConfig(prefill=PREFILL, decode=DECODE)


def test_the_ratio_follows_the_prompt_output_mix():
    chat = mix_ratio(PoolLoad.spread(1, prompt_tokens_per_s=50_000),
                     PoolLoad.spread(1, output_tokens_per_s=30_000), CONFIG)
    summaries = mix_ratio(PoolLoad.spread(1, prompt_tokens_per_s=160_000),
                          PoolLoad.spread(1, output_tokens_per_s=1_000), CONFIG)
    # prefill demand / decode demand = (50000 / 32768) / (30000 / 3000)
    assert chat == pytest.approx((50_000 / 32768) / (30_000 / 3000))
    assert summaries == pytest.approx(CONFIG.max_prefill_per_decode)  # 14.6, clamped
    assert mix_ratio(PoolLoad(), PoolLoad.spread(1, output_tokens_per_s=10), CONFIG) is None


def test_a_pool_that_scales_up_takes_the_other_along_by_the_mix():
    prefill = prefill_view(4, queued_prefill_tokens=100_000, ttft_p95_s=0.3,
                           prompt_tokens_per_s=90_000)
    decode = decode_view(4, running_seqs=300, kv_usage=0.5, itl_p95_s=0.03,
                         output_tokens_per_s=9_000)
    both = decide_app(prefill, decode, CONFIG, SLO, T)
    alone = decide_decode(decode, DECODE, SLO, T)
    assert both.prefill.direction == "up" and alone.direction == "hold"
    assert both.decode.desired > alone.desired
    assert "prefill scaling to" in both.decode.reason and "token mix" in both.decode.reason
    uncoupled = decide_app(prefill, decode, CONFIG.model_copy(update={"couple_pools": False}),
                           SLO, T)
    assert uncoupled.decode.desired == alone.desired and uncoupled.prefill_per_decode is None


def test_decode_scaling_up_takes_prefill_along_too():
    prefill = prefill_view(2, queued_prefill_tokens=0.0, ttft_p95_s=0.1,
                           prompt_tokens_per_s=40_000)
    decode = decode_view(10, running_seqs=2000, kv_usage=0.7, itl_p95_s=0.04,
                         output_tokens_per_s=20_000)
    both = decide_app(prefill, decode, CONFIG, SLO, T)
    assert both.decode.direction == "up"
    assert both.prefill.desired > decide_prefill(prefill, PREFILL, SLO, T).desired
    assert "decode scaling to" in both.prefill.reason


def test_a_companion_need_gets_no_spare_of_its_own():
    """The companion is a lower bound against starvation: decode's need by the mix (2.7
    prefill replicas) lands prefill at 3, not at 2.7 / 0.8 -> 4; prefill's own load
    needs add their spare when its load arrives."""
    prefill = prefill_view(2, queued_prefill_tokens=0.0, ttft_p95_s=0.1,
                           prompt_tokens_per_s=20_000)
    decode = decode_view(5, running_seqs=1300, kv_usage=0.5, itl_p95_s=0.03,
                         output_tokens_per_s=5_000)
    both = decide_app(prefill, decode, CONFIG, SLO, T)
    assert both.prefill.need == pytest.approx(2.7, abs=0.05)
    assert both.prefill.desired == 3 and "spare" not in both.prefill.reason


def test_the_coupling_never_blocks_a_scale_down():
    prefill = prefill_view(8, PoolState(down_wanted_since_s=T - 1000), **{
        **IDLE_PREFILL, "prompt_tokens_per_s": 30_000})
    decode = decode_view(10, PoolState(down_wanted_since_s=T - 1000), **{
        **IDLE_DECODE, "output_tokens_per_s": 3_000})
    both = decide_app(prefill, decode, CONFIG, SLO, T)
    assert both.prefill.direction == "down" and both.decode.direction == "down"


# --- state ---------------------------------------------------------------------------------


def test_state_round_trips_and_tolerates_foreign_keys():
    state = PoolState(1.0, 2.0, None, 4.0)
    assert PoolState.from_dict(state.to_dict()) == state
    assert PoolState.from_dict({"last_scale_up_s": "x", "other": 1}) == PoolState()
    assert PoolState.from_dict(None) == PoolState()


# --- properties ----------------------------------------------------------------------------

loads = st.fixed_dictionaries({
    "queued_prefill_tokens": st.floats(0, 2e6),
    "ttft_p95_s": st.floats(0, 10),
    "prompt_tokens_per_s": st.floats(0, 5e5),
    "running_seqs": st.floats(0, 1e4),
    "kv_usage": st.floats(0, 1),
    "itl_p95_s": st.floats(0, 1),
    "output_tokens_per_s": st.floats(0, 2e5),
})
maybe_time = st.none() | st.floats(T - 5000, T)
states = st.builds(PoolState, maybe_time, maybe_time, maybe_time, maybe_time)
bounds = st.tuples(st.integers(0, 10), st.integers(1, 40)).filter(lambda b: b[0] <= b[1]).map(
    lambda b: ReplicaBounds(min_replicas=b[0], max_replicas=b[1]))
PREFILL_FIELDS = ("queued_prefill_tokens", "ttft_p95_s", "prompt_tokens_per_s")
DECODE_FIELDS = ("running_seqs", "kv_usage", "itl_p95_s", "output_tokens_per_s")
EVENING = StandbySchedule(timezone="Europe/Berlin", ramp_minutes=60, windows=[
    StandbyWindow(start="17:00", end="23:00", min_replicas=12)])


def _decide(pool, current, running, load, state, bound, now, standby):
    if pool == "prefill":
        config, names, decide = PREFILL, PREFILL_FIELDS, decide_prefill
    else:
        config, names, decide = DECODE, DECODE_FIELDS, decide_decode
    config = config.model_copy(update={"standby": EVENING if standby else None})
    pool_load = PoolLoad.spread(max(running, 1), **{n: load[n] for n in names})
    view = PoolView(current, pool_load, state, bound, running)
    return decide(view, config, SLO, now), config


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["prefill", "decode"]), st.integers(0, 45), st.integers(0, 45), loads,
       states, bounds, st.floats(T, T + 86_400), st.booleans())
def test_decisions_stay_in_bounds_above_the_floor_and_respect_cool_downs(
    pool, current, running, load, state, bound, now, standby
):
    decision, config = _decide(pool, current, running, load, state, bound, now, standby)
    assert bound.min_replicas <= decision.desired <= bound.max_replicas
    assert decision.desired >= min(decision.floor, bound.max_replicas)
    lower = min(max(bound.min_replicas, decision.floor), bound.max_replicas)
    if decision.direction == "down" and current <= bound.max_replicas:  # not forced by max
        last = max((t for t in (state.last_scale_up_s, state.last_scale_down_s)
                    if t is not None), default=None)
        assert last is None or now - last >= config.downscale_cooldown_s
        since = state.down_wanted_since_s
        assert since is not None and now - since >= config.downscale_delay_s
        assert current - decision.desired <= config.max_downscale_step
    if decision.direction == "up" and decision.desired > lower:
        assert decision.desired <= max(current + 1, current * config.max_upscale_factor)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["prefill", "decode"]), st.integers(0, 45), loads, states, bounds,
       st.floats(T, T + 86_400), st.floats(1, 10))
def test_more_load_never_means_fewer_replicas(pool, current, load, state, bound, now, factor):
    higher = {name: value * factor for name, value in load.items()}
    higher["kv_usage"] = min(1.0, higher["kv_usage"])
    lower_decision, _ = _decide(pool, current, current, load, state, bound, now, False)
    higher_decision, _ = _decide(pool, current, current, higher, state, bound, now, False)
    assert higher_decision.desired >= lower_decision.desired
