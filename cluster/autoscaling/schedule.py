"""The standby floor of a time-of-day schedule (pure; the clock is passed in).

Windows are local times in the schedule's IANA zone, but every comparison is made between
absolute instants (epoch seconds): a ramp of 30 minutes lasts 30 real minutes even across
a daylight-saving change, and a window is found on the right side of midnight. A local start
that does not exist (skipped by a spring-forward change) resolves as zoneinfo resolves
``fold=0``: with the offset in force before the change.
"""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from cluster.autoscaling.config import WEEKDAYS, StandbySchedule, StandbyWindow

Instant = datetime | float


def epoch_seconds(now: Instant) -> float:
    """Seconds since the epoch of an aware datetime or of epoch seconds themselves."""
    if isinstance(now, datetime):
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError("now must be timezone-aware (a naive time has no instant)")
        return now.timestamp()
    return float(now)


def standby_floor(schedule: StandbySchedule | None, now: Instant) -> int:
    """The least replicas the schedule asks for at ``now`` (0: no window near).

    Inside a window the floor is its ``min_replicas``; during the ``ramp_minutes`` before
    it, the floor rises linearly from 0 and is rounded up to whole replicas, so the first
    replica is requested as the ramp begins and the last ones as the window nears.
    Overlapping windows and ramps take the highest floor.
    """
    if schedule is None or not schedule.windows:
        return 0
    instant = epoch_seconds(now)
    zone = schedule.zone
    today = datetime.fromtimestamp(instant, zone).date()
    ramp_s = schedule.ramp_minutes * 60
    floors = [
        _window_floor(window, start, end, instant, ramp_s)
        for window in schedule.windows
        for start, end in _occurrences(window, today, zone)
    ]
    return max(floors, default=0)


def _occurrences(window: StandbyWindow, today: date, zone: ZoneInfo) -> list[tuple[float, float]]:
    # A window that started yesterday may still run (midnight wrap); one that starts
    # tomorrow may already be ramping (ramps are at most 12 hours).
    spans = []
    for day in (today - timedelta(days=1), today, today + timedelta(days=1)):
        if window.days is not None and WEEKDAYS[day.weekday()] not in window.days:
            continue
        end_day = day + timedelta(days=1) if window.wraps_midnight else day
        start = datetime.combine(day, window.start_time, tzinfo=zone).timestamp()
        end = datetime.combine(end_day, window.end_time, tzinfo=zone).timestamp()
        spans.append((start, end))
    return spans


def _window_floor(
    window: StandbyWindow, start: float, end: float, instant: float, ramp_s: float
) -> int:
    if start <= instant < end:
        return window.min_replicas
    if ramp_s > 0 and start - ramp_s <= instant < start:
        progress = (instant - (start - ramp_s)) / ramp_s
        return math.ceil(window.min_replicas * progress)
    return 0
