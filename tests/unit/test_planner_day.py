"""The planned cluster's day under pdserve's autoscaling policy (tools/planner/day.py):
sensors read off the simulator, the fleet sized by ``decide_app`` with start-up delays,
drains, step limits and standby floors, and the targets ``pdserve plan`` writes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from cluster.autoscaling.config import (
    AutoscalingConfig,
    DecodeScalingConfig,
    PrefillScalingConfig,
    StandbySchedule,
    StandbyWindow,
)
from cluster.autoscaling.policy import PoolLoad, ReplicaObservation, decode_needs, prefill_needs
from cluster.autoscaling.schedule import standby_floor
from cluster.config import parse_config
from cluster.slo import SLOConfig
from tests.unit.test_planner import small_inputs
from tools.planner.day import (
    DaySpec,
    Sensed,
    Sensors,
    autoscaling_targets,
    fitting_downscale_step,
    sense,
    simulate_day,
)
from tools.planner.output import config_document
from tools.planner.search import search
from tools.planner.standby_fit import fit_standby
from tools.planner.workload import diurnal_concentration, diurnal_share

REPO = Path(__file__).resolve().parents[2]
PEAK_AT = 1_767_816_000.0        # 2026-01-07 20:00 UTC
PLANNED = (40, 20)
SLO = SLOConfig(ttft_p95_s=0.5, itl_p95_s=0.05)


def _point(m: float) -> Sensed:
    """One replica at ``m`` times its planned load: rates and queues in proportion, TTFT
    over the SLO past 1.1 x the plan."""
    return Sensed(
        m,
        ReplicaObservation(queued_prefill_tokens=100 * m, ttft_p95_s=0.05 + 0.1 * m,
                           prompt_tokens_per_s=1000 * m),
        ReplicaObservation(running_seqs=10 * m, kv_usage=0.3 * m, itl_p95_s=0.02 + 0.02 * m,
                           output_tokens_per_s=500 * m),
        ttft_p95_s=0.1 + 0.33 * m * m, on_decode_p95_s=0.02 + 0.01 * m, e2e_p99_s=20.0)


SENSORS = Sensors(tuple(_point(m) for m in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)))


def _config(step: int = 4, delay_s: float = 60, cooldown_s: float = 120,
            standby: StandbySchedule | None = None) -> AutoscalingConfig:
    """Targets at which the throughput signal asks for exactly the planned counts at the
    peak (a replica's planned load is 1000 prompt / 500 output tokens/s)."""
    timing = {"max_downscale_step": step, "downscale_delay_s": delay_s,
              "downscale_cooldown_s": cooldown_s, "min_replicas": 1, "max_replicas": 200,
              "target_utilisation": 1.0}
    return AutoscalingConfig(
        prefill=PrefillScalingConfig(tokens_per_s_per_replica=1000,
                                     target_queued_tokens_per_replica=10**6, standby=standby,
                                     **timing),
        decode=DecodeScalingConfig(output_tokens_per_s_per_replica=500,
                                   target_running_seqs_per_replica=10**6, target_kv_usage=1.0,
                                   standby=standby, **timing))


def _day(config: AutoscalingConfig, **spec):
    return simulate_day(DaySpec(**({"peak_at_s": PEAK_AT} | spec)), SENSORS,
                        PLANNED, (4, 4), config, SLO)


def test_sensors_interpolate_rates_to_zero_and_hold_latencies_at_the_ends():
    half = SENSORS.at("prefill", 0.625)
    assert half.prompt_tokens_per_s == pytest.approx(625)
    assert half.ttft_p95_s == pytest.approx(0.1125)
    idle = SENSORS.at("prefill", 0.1)
    assert idle.prompt_tokens_per_s == pytest.approx(100)       # towards (0, 0)
    assert idle.ttft_p95_s == pytest.approx(0.075)              # the lightest load's
    assert SENSORS.at("decode", 5.0) == SENSORS.at("decode", 2.0)
    assert SENSORS.at("decode", 1.0).itl_p95_s == pytest.approx(0.04)
    # TTFT: exact where both pools are at one multiple; the decode part moves alone
    assert SENSORS.ttft_p95_s(1.0, 1.0) == pytest.approx(0.43)
    assert SENSORS.ttft_p95_s(1.0, 0.5) == pytest.approx(0.43 - 0.005)
    for bad in ((), (_point(1.0), _point(0.5)), (_point(0.0),)):
        with pytest.raises(ValueError):
            Sensors(bad)


def test_the_fleet_follows_the_rate_between_its_trough_and_the_plan():
    day = _day(_config(), startup_s=120)
    ideal = sum(day.ideal_gpu_hours.values())
    assert ideal == pytest.approx(sum(
        max(1, math.ceil(n * share)) for n in PLANNED
        for share in (p.rate_share for p in day.timeline)) * 4 / 60, rel=0.02)
    assert ideal <= sum(day.gpu_hours.values()) <= 1.5 * ideal
    for pool, planned in zip(("prefill", "decode"), PLANNED, strict=True):
        fewest, most = day.replicas[pool]
        assert fewest <= math.ceil(planned * 0.05) + 1
        # a scale-up lands with the hysteresis (20%) to spare, so near the peak the
        # pool holds more than the plan (landing on the need, it held at most 2 more),
        # and no more than planned / 0.8
        assert planned + 2 < most <= math.ceil(planned / 0.8)
        assert day.scale_events[pool]["up"] > 0 and day.scale_events[pool]["down"] > 0
    assert day.hours_over_slo["itl"] == 0
    assert day.hours_over_slo["ttft"] < 0.5
    assert day.hours_beyond_sensors == 0
    assert len(day.timeline) == 24 * 60
    assert all(p.alive[pool] >= p.serving[pool] for p in day.timeline
               for pool in ("prefill", "decode"))


def test_step_limits_and_cool_downs_hold_gpus_after_the_peak():
    fast = _day(_config())
    slow = _day(_config(step=1, delay_s=300, cooldown_s=600))
    assert sum(slow.gpu_hours.values()) > 1.2 * sum(fast.gpu_hours.values())
    # one replica less per 10 minutes at most (and one draining a minute)
    timeline = slow.timeline
    for before, after in zip(timeline, timeline[60:], strict=False):
        assert after.serving["prefill"] >= before.serving["prefill"] - 6


def test_the_fitted_downscale_step_follows_the_day_down():
    step = fitting_downscale_step(PLANNED[0], 600, peak_to_mean=6)
    assert 1 < step < PLANNED[0] / 4
    assert fitting_downscale_step(PLANNED[0], 60, peak_to_mean=6) < step
    one = _day(_config(step=1, delay_s=300, cooldown_s=600))
    fitted = _day(_config(step=step, delay_s=300, cooldown_s=600))
    assert sum(fitted.gpu_hours.values()) < 0.8 * sum(one.gpu_hours.values())
    night = [p for p in fitted.timeline if 18 <= p.hours_after_start < 20]  # 6 h after
    assert night and all(p.alive["prefill"] <= 4 for p in night)           # the peak
    assert any(p.alive["prefill"] > 4 for p in one.timeline if p.hours_after_start >= 18)


def test_replicas_that_start_slowly_miss_the_slo_on_the_rise():
    quick = _day(_config(), startup_s=0)
    slow = _day(_config(), startup_s=1800)
    assert slow.hours_over_slo["ttft"] > quick.hours_over_slo["ttft"] + 0.25
    during_start = [p for p in slow.timeline if p.alive["prefill"] > p.serving["prefill"]]
    assert during_start, "a start-up shows as replicas alive that do not serve yet"


def test_a_standby_window_holds_the_planned_size_through_the_peak():
    window = StandbySchedule(timezone="UTC", ramp_minutes=30, windows=[
        StandbyWindow(start="18:00", end="22:00", min_replicas=PLANNED[0])])
    plain = _day(_config())
    held = _day(_config().model_copy(update={"prefill": _config(standby=window).prefill}))
    # 18:00-22:00 UTC: all asked for by 18:00 (the ramp), serving once started (5 min)
    in_window = [p for p in held.timeline if 10 <= p.hours_after_start < 14]
    assert in_window and all(p.alive["prefill"] >= PLANNED[0] for p in in_window)
    assert all(p.serving["prefill"] >= PLANNED[0] for p in in_window
               if p.hours_after_start >= 10 + 5 / 60)
    assert any(p.serving["prefill"] < PLANNED[0] for p in in_window)
    assert held.gpu_hours["prefill"] > plain.gpu_hours["prefill"]
    assert held.gpu_hours["decode"] == pytest.approx(plain.gpu_hours["decode"], rel=0.05)


def test_the_written_targets_ask_for_the_planned_size_at_its_peak():
    plan = search(small_inputs(rate=30))
    planned = (plan.prediction.prefill_replicas, plan.prediction.decode_replicas)
    sensors = sense(plan, multiples=(0.5, 1.0))
    peak = {pool: sensors.at(pool, 1.0) for pool in ("prefill", "decode")}
    assert peak["decode"].running_seqs > 0 and 0 < peak["decode"].kv_usage <= 1
    assert peak["prefill"].queued_prefill_tokens >= 0
    assert sensors.points[-1].ttft_p95_s == pytest.approx(plan.prediction.ttft_s["p95"])
    targets = autoscaling_targets(plan, sensors)
    prefill = PrefillScalingConfig(**targets["prefill"])
    decode = DecodeScalingConfig(**targets["decode"])
    at_peak = {pool: PoolLoad((peak[pool],) * n)
               for pool, n in zip(("prefill", "decode"), planned, strict=True)}
    needs = {need.signal: need.replicas for need in prefill_needs(at_peak["prefill"], prefill)}
    assert needs["throughput"] == pytest.approx(planned[0], rel=0.01)
    assert needs["queue"] < planned[0]
    needs = {need.signal: need.replicas for need in decode_needs(at_peak["decode"], decode)}
    assert needs["throughput"] == pytest.approx(planned[1], rel=0.01)
    assert max(needs["sequences"], needs["kv"]) <= planned[1]
    # written into the base config, which pdserve loads; its night floor in proportion
    base = yaml.safe_load((REPO / "ray_configs/prod-70b.yaml").read_text())
    config = parse_config(config_document(plan, base, targets))
    assert config.autoscaling.prefill.tokens_per_s_per_replica == \
        targets["prefill"]["tokens_per_s_per_replica"]
    assert config.autoscaling.prefill.min_replicas == math.ceil(planned[0] * 100 / 344)
    assert config.autoscaling.decode.min_replicas == math.ceil(planned[1] * 40 / 126)
    # with headroom, the throughput signals ask for that much more at the same load
    ahead = autoscaling_targets(plan, sensors, headroom=0.1)
    for pool, needs_of, scaling, n in (
            ("prefill", prefill_needs, PrefillScalingConfig, planned[0]),
            ("decode", decode_needs, DecodeScalingConfig, planned[1])):
        needs = {need.signal: need.replicas
                 for need in needs_of(at_peak[pool], scaling(**ahead[pool]))}
        assert needs["throughput"] == pytest.approx(1.1 * n, rel=0.01)
    with pytest.raises(ValueError):
        autoscaling_targets(plan, sensors, headroom=-0.1)


KAPPA = diurnal_concentration(6.0, 0.05)


def _share(minute: float) -> float:
    """The test day's rate share at a UTC minute (its peak at 20:00 UTC)."""
    return diurnal_share(((minute - 20 * 60) / 1440) % 1.0, KAPPA, 0.05)


def test_fitted_floors_hold_the_forecast_rate_a_start_up_ahead():
    spec = DaySpec(peak_at_s=PEAK_AT, startup_s=600)
    fitted = fit_standby(100, 20 * 60, spec, slot_minutes=30, margin=0.1)
    schedule = StandbySchedule(**fitted.standby_section())
    midnight = PEAK_AT - 20 * 3600
    floors = [max(fitted.night_floor, standby_floor(schedule, midnight + minute * 60))
              for minute in range(1440)]
    lead = 11                          # the start-up and a policy tick, in whole minutes
    for minute, floor in enumerate(floors):
        # what the replicas it asks for will meet, and no more than its slot's highest
        assert 110 * _share(minute + lead) - 1e-6 <= floor
        assert floor <= max(fitted.night_floor, math.ceil(
            110 * max(_share(minute + ahead) for ahead in range(lead - 30, lead + 31))))
    assert fitted.night_floor == math.ceil(100 * 1.1 * 0.05)
    assert fitted.highest == max(floors) == 110
    # a floor only where the rate is above the night's, in few windows
    assert sum(floors) / 1440 < 0.4 * 110 and len(fitted.windows) <= 24
    # a shift covers a peak that comes that much early or late, for more floor
    shifted = fit_standby(100, 20 * 60, spec, slot_minutes=30, margin=0.1, shift_minutes=60)
    schedule = StandbySchedule(**shifted.standby_section())
    wider = [max(shifted.night_floor, standby_floor(schedule, midnight + minute * 60))
             for minute in range(1440)]
    for minute, floor in enumerate(wider):
        assert floor >= 110 * max(_share(minute + lead - 60), _share(minute + lead + 60)) - 1e-6
    assert sum(floors) < sum(wider) < 2 * sum(floors)
    for bad in ({"slot_minutes": 7}, {"margin": -0.1}, {"shift_minutes": 721}):
        with pytest.raises(ValueError):
            fit_standby(100, 0, spec, **bad)


def _with_floors(shift_minutes: int, **spec) -> tuple[AutoscalingConfig, dict]:
    fitted = {pool: fit_standby(n, 20 * 60, DaySpec(peak_at_s=PEAK_AT, **spec),
                                shift_minutes=shift_minutes)
              for pool, n in zip(("prefill", "decode"), PLANNED, strict=True)}
    config = _config()
    return config.model_copy(update={pool: getattr(config, pool).model_copy(update={
        "standby": StandbySchedule(**fitted[pool].standby_section()),
        "min_replicas": fitted[pool].night_floor})
        for pool in ("prefill", "decode")}), fitted


def test_fitted_floors_keep_the_slo_for_fewer_gpu_hours_than_a_window_at_the_peak_size():
    spec = {"startup_s": 1200}         # slow starts: the policy alone lags the rise
    config, fitted = _with_floors(0, **spec)
    held = _config()
    held = held.model_copy(update={pool: getattr(held, pool).model_copy(update={
        "standby": StandbySchedule(timezone="UTC", ramp_minutes=30, windows=[
            StandbyWindow(start="17:00", end="23:00", min_replicas=n)])})
        for pool, n in zip(("prefill", "decode"), PLANNED, strict=True)})
    alone, predicted, blunt = _day(_config(), **spec), _day(config, **spec), _day(held, **spec)
    assert alone.hours_over_slo["ttft"] > 0.25
    assert predicted.hours_over_slo == {"ttft": 0, "itl": 0}
    assert blunt.hours_over_slo["ttft"] == 0
    assert sum(predicted.gpu_hours.values()) < 0.8 * sum(blunt.gpu_hours.values())
    # above the floors the policy still follows a day busier than forecast
    busier = _day(config, rate_scale=1.3, **spec)
    assert busier.replicas["prefill"][1] > fitted["prefill"].highest


def test_floors_fitted_with_a_shift_keep_the_slo_when_the_peak_comes_early():
    spec = {"startup_s": 1200, "peak_at_s": PEAK_AT - 3600}
    exact, shifted = _with_floors(0, startup_s=1200)[0], _with_floors(60, startup_s=1200)[0]
    assert _day(exact, **spec).hours_over_slo["ttft"] > 0.25
    assert _day(shifted, **spec).hours_over_slo == {"ttft": 0, "itl": 0}


def test_fitted_floors_are_written_in_the_zone_of_the_peak_with_room_above():
    plan = search(small_inputs(rate=30))
    planned = {"prefill": plan.prediction.prefill_replicas,
               "decode": plan.prediction.decode_replicas}
    spec = DaySpec(peak_at_s=PEAK_AT)
    fitted = {pool: fit_standby(10 * n, 20 * 60, spec, timezone="America/New_York")
              for pool, n in planned.items()}
    base = yaml.safe_load((REPO / "ray_configs/prod-70b.yaml").read_text())
    del base["autoscaling"]["decode"]["standby"]        # one pool without a schedule
    config = parse_config(config_document(plan, base, standby=fitted))
    for pool in planned:
        scaling = getattr(config.autoscaling, pool)
        assert scaling.standby.timezone == "America/New_York"
        assert scaling.min_replicas == fitted[pool].night_floor
        assert [(w.start, w.end, w.min_replicas) for w in scaling.standby.windows] == [
            (f"{a // 60 % 24:02d}:{a % 60:02d}", f"{b // 60 % 24:02d}:{b % 60:02d}", n)
            for a, b, n in fitted[pool].windows]
        assert scaling.max_replicas >= 1.25 * fitted[pool].highest
    base["autoscaling"] = None                          # no autoscaling: pools only
    assert parse_config(config_document(plan, base, standby=fitted)).autoscaling is None


def test_throughput_targets_with_headroom_keep_ahead_of_a_rising_rate():
    def with_utilisation(share: float) -> AutoscalingConfig:
        config = _config()
        return config.model_copy(update={pool: getattr(config, pool).model_copy(
            update={"target_utilisation": share}) for pool in ("prefill", "decode")})

    exact = _day(with_utilisation(1.0), startup_s=1200)
    ahead = _day(with_utilisation(1 / 1.2), startup_s=1200)
    assert ahead.hours_over_slo["ttft"] < exact.hours_over_slo["ttft"] - 0.1
    assert sum(ahead.gpu_hours.values()) < 1.3 * sum(exact.gpu_hours.values())
