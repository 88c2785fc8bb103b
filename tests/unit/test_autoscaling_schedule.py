"""The standby floor: windows in a time zone, midnight wrap, ramp-ahead, DST."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cluster.autoscaling.config import StandbySchedule, StandbyWindow
from cluster.autoscaling.schedule import epoch_seconds, standby_floor

BERLIN = ZoneInfo("Europe/Berlin")


def schedule(*windows: StandbyWindow, zone: str = "Europe/Berlin", ramp: float = 30):
    return StandbySchedule(timezone=zone, ramp_minutes=ramp, windows=list(windows))


EVENING = StandbyWindow(start="17:00", end="23:00", min_replicas=8)
NIGHT = StandbyWindow(start="22:00", end="02:00", min_replicas=3)


def berlin(day: int, hour: int, minute: int = 0, second: int = 0, month: int = 6):
    return datetime(2025, month, day, hour, minute, second, tzinfo=BERLIN)


def test_no_schedule_or_no_window_means_no_floor():
    assert standby_floor(None, berlin(11, 18)) == 0
    assert standby_floor(schedule(), berlin(11, 18)) == 0


def test_inside_the_window_the_floor_is_its_minimum_start_inclusive_end_exclusive():
    plan = schedule(EVENING, ramp=0)
    assert standby_floor(plan, berlin(11, 17)) == 8
    assert standby_floor(plan, berlin(11, 22, 59, 59)) == 8
    assert standby_floor(plan, berlin(11, 23)) == 0
    assert standby_floor(plan, berlin(11, 16, 59, 59)) == 0
    assert standby_floor(plan, berlin(11, 3)) == 0


def test_the_floor_ramps_up_linearly_in_whole_replicas_before_the_window():
    plan = schedule(EVENING, ramp=30)
    assert standby_floor(plan, berlin(11, 16, 29)) == 0
    assert standby_floor(plan, berlin(11, 16, 30)) == 0           # the ramp begins
    assert standby_floor(plan, berlin(11, 16, 30, 1)) == 1        # first replica at once
    assert standby_floor(plan, berlin(11, 16, 45)) == 4           # halfway: 8 / 2
    assert standby_floor(plan, berlin(11, 16, 52, 30)) == 6       # three quarters
    assert standby_floor(plan, berlin(11, 16, 59, 59)) == 8
    ramp = [standby_floor(plan, berlin(11, 16, 30) + timedelta(minutes=m)) for m in range(31)]
    assert ramp == sorted(ramp) and ramp[-1] == 8


def test_a_window_may_wrap_midnight():
    plan = schedule(NIGHT, ramp=60)
    assert standby_floor(plan, berlin(11, 23, 30)) == 3
    assert standby_floor(plan, berlin(12, 0, 0)) == 3
    assert standby_floor(plan, berlin(12, 1, 59)) == 3
    assert standby_floor(plan, berlin(12, 2, 0)) == 0
    assert standby_floor(plan, berlin(11, 21, 30)) == 2            # ramp: ceil(3 x 0.5)
    assert NIGHT.wraps_midnight and not EVENING.wraps_midnight


def test_a_ramp_may_start_the_day_before():
    early = StandbyWindow(start="00:30", end="06:00", min_replicas=4)
    plan = schedule(early, ramp=60)
    assert standby_floor(plan, berlin(10, 23, 45)) == 1            # 15 of 60 minutes
    assert standby_floor(plan, berlin(11, 0, 15)) == 3
    assert standby_floor(plan, berlin(11, 0, 30)) == 4


def test_days_name_the_weekday_a_window_starts_on():
    friday_night = StandbyWindow(start="22:00", end="02:00", min_replicas=5, days=["fri"])
    plan = schedule(friday_night, ramp=0)
    # 2025-06-13 is a Friday.
    assert standby_floor(plan, berlin(13, 23)) == 5
    assert standby_floor(plan, berlin(14, 1)) == 5                 # Saturday, still Friday's
    assert standby_floor(plan, berlin(14, 23)) == 0                 # Saturday's own: none
    assert standby_floor(plan, berlin(12, 23)) == 0                 # Thursday


def test_overlapping_windows_take_the_highest_floor():
    plan = schedule(EVENING, NIGHT, ramp=0)
    assert standby_floor(plan, berlin(11, 22, 30)) == 8
    assert standby_floor(plan, berlin(11, 23, 30)) == 3


def test_the_window_is_in_the_schedules_zone_whatever_the_clock_zone():
    plan = schedule(EVENING, zone="America/New_York", ramp=0)
    # 21:30 UTC in June is 17:30 in New York (EDT, UTC-4) and 23:30 in Berlin.
    at = datetime(2025, 6, 11, 21, 30, tzinfo=UTC)
    assert standby_floor(plan, at) == 8
    assert standby_floor(plan, at.astimezone(BERLIN)) == 8
    assert standby_floor(plan, at.timestamp()) == 8
    assert standby_floor(plan, at - timedelta(hours=1)) == 0


def test_now_may_be_epoch_seconds_but_never_a_naive_time():
    at = berlin(11, 16, 45)
    assert standby_floor(schedule(EVENING), at.timestamp()) == standby_floor(
        schedule(EVENING), at)
    assert epoch_seconds(at) == at.timestamp()
    with pytest.raises(ValueError, match="timezone-aware"):
        standby_floor(schedule(EVENING), datetime(2025, 6, 11, 16, 45))


def test_the_ramp_lasts_its_real_minutes_across_spring_forward():
    # Berlin, 2025-03-30: 02:00 CET jumps to 03:00 CEST. Window from 03:00 with a two-hour
    # ramp: the ramp begins two real hours earlier, at 00:00 CET (23:00 UTC), not at 01:00.
    dawn = StandbyWindow(start="03:00", end="05:00", min_replicas=4)
    plan = schedule(dawn, ramp=120)
    start = datetime(2025, 3, 30, 1, 0, tzinfo=UTC)                 # 03:00 CEST
    assert datetime(2025, 3, 30, 3, 0, tzinfo=BERLIN).timestamp() == start.timestamp()
    assert standby_floor(plan, start - timedelta(minutes=121)) == 0
    assert standby_floor(plan, start - timedelta(minutes=60)) == 2  # 00:00 UTC = 01:00 CET
    assert standby_floor(plan, start - timedelta(seconds=1)) == 4
    assert standby_floor(plan, start) == 4


def test_the_ramp_lasts_its_real_minutes_across_fall_back():
    # Berlin, 2025-10-26: 03:00 CEST falls back to 02:00 CET. A 04:00 window with a
    # three-hour ramp starts ramping at 01:00 UTC, 02:00 CEST (the first 02:00 of the night).
    dawn = StandbyWindow(start="04:00", end="06:00", min_replicas=6)
    plan = schedule(dawn, ramp=180)
    start = datetime(2025, 10, 26, 3, 0, tzinfo=UTC)                # 04:00 CET
    assert standby_floor(plan, start - timedelta(minutes=181)) == 0
    assert standby_floor(plan, start - timedelta(minutes=90)) == 3
    assert standby_floor(plan, start) == 6
    assert standby_floor(plan, start + timedelta(hours=2)) == 0     # 06:00 CET


@pytest.mark.parametrize(("field", "value", "message"), [
    ("start", "24:00", "HH:MM"),
    ("start", "7:00", "HH:MM"),
    ("end", "17:60", "HH:MM"),
])
def test_times_of_day_are_validated(field, value, message):
    data = {"start": "17:00", "end": "23:00", "min_replicas": 1, field: value}
    with pytest.raises(ValidationError, match=message):
        StandbyWindow(**data)


def test_empty_windows_unknown_days_and_zones_are_refused():
    with pytest.raises(ValidationError, match="start equals end"):
        StandbyWindow(start="17:00", end="17:00", min_replicas=1)
    with pytest.raises(ValidationError):
        StandbyWindow(start="17:00", end="18:00", min_replicas=1, days=["monday"])
    with pytest.raises(ValidationError, match="unknown IANA time zone"):
        StandbySchedule(timezone="Mars/Olympus_Mons")
    with pytest.raises(ValidationError):
        StandbySchedule(ramp_minutes=721)                          # ramps are at most 12 h


hhmm = st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.integers(0, 59))
zones = st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
                         "Asia/Kolkata", "America/Santiago"])
instants = st.floats(1.7e9, 1.8e9, allow_nan=False)


@settings(max_examples=400, deadline=None)
@given(st.lists(hhmm, min_size=2, max_size=2, unique=True), st.integers(0, 50), zones,
       st.floats(0, 720), instants, st.floats(1, 900))
def test_floor_is_bounded_and_drops_only_when_a_window_ends(
    times, replicas, zone, ramp, instant, step_s
):
    window = StandbyWindow(start=times[0], end=times[1], min_replicas=replicas)
    plan = StandbySchedule(timezone=zone, ramp_minutes=ramp, windows=[window])
    before, after = standby_floor(plan, instant), standby_floor(plan, instant + step_s)
    assert 0 <= before <= replicas and 0 <= after <= replicas
    if after < before:  # never during a ramp: only the end of a window lowers the floor
        assert before == replicas


@settings(max_examples=200, deadline=None)
@given(hhmm, hhmm, st.integers(1, 50), zones, instants)
def test_inside_a_window_the_floor_is_the_window_minimum(start, end, replicas, zone, instant):
    if start == end:
        return
    window = StandbyWindow(start=start, end=end, min_replicas=replicas)
    plan = StandbySchedule(timezone=zone, ramp_minutes=0, windows=[window])
    local = datetime.fromtimestamp(instant, ZoneInfo(zone)).strftime("%H:%M")
    inside = (start <= local < end) if start < end else (local >= start or local < end)
    # Local times are compared at minute resolution; skip the edge minutes and DST gaps.
    if local in (start, end):
        return
    floor = standby_floor(plan, instant)
    if inside:
        assert floor == replicas or _near_a_dst_change(instant, zone)
    else:
        assert floor == 0 or _near_a_dst_change(instant, zone)


def _near_a_dst_change(instant: float, zone: str) -> bool:
    tz = ZoneInfo(zone)
    offsets = {datetime.fromtimestamp(instant + h * 3600, tz).utcoffset() for h in (-26, 0, 26)}
    return len(offsets) > 1
