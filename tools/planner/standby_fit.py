"""Standby floors fitted to the forecast day (pure): a pool's floors that lead the day's
known shape by a replica's start-up, for the config ``pdserve plan`` writes
(docs/planning.md; the day they are judged on is tools/planner/day.py's)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tools.planner.day import DaySpec


@dataclass(frozen=True)
class FittedStandby:
    """A pool's floors that follow the forecast day, ahead of it by a replica's start-up:
    ``night_floor`` (its ``min_replicas``) and ``windows``, each (start, end, floor) in
    minutes after local midnight (end up to 1440), where the floor is above the night's."""

    night_floor: int
    windows: tuple[tuple[int, int, int], ...]
    timezone: str = "UTC"             # the zone of the local minutes (and of the peak)

    @property
    def highest(self) -> int:
        return max((floor for _, _, floor in self.windows), default=self.night_floor)

    def standby_section(self) -> dict:
        """The windows as a pool's ``standby`` config section (``StandbySchedule``). The
        fit already leads the day by a start-up: no ramp of its own."""
        def hh_mm(minute: int) -> str:
            return f"{minute // 60 % 24:02d}:{minute % 60:02d}"

        return {"timezone": self.timezone, "ramp_minutes": 0,
                "windows": [{"start": hh_mm(start), "end": hh_mm(end), "min_replicas": floor}
                            for start, end, floor in self.windows]}


def fit_standby(planned: int, peak_minute: float, spec: DaySpec, slot_minutes: int = 30,
                margin: float = 0.1, shift_minutes: int = 0,
                timezone: str = "UTC") -> FittedStandby:
    """Floors for a pool of ``planned`` replicas at the peak (``peak_minute`` after
    midnight in ``timezone``, the local time of ``spec.peak_at_s``; the curve's shape and
    the start-up are ``spec``'s, its ``rate_scale`` is not: this fits the forecast) over
    a day, in slots of ``slot_minutes``: a slot's floor is
    the planned size scaled to the highest rate its replicas will meet, with ``margin`` to
    spare: they serve ``spec.startup_s`` after the floor asks for them (one policy tick
    later at most), so a slot's floor covers the rate from its start plus that lead to
    its end plus the lead, and ``shift_minutes`` either side for a day whose peak comes
    that much early or late. The night floor is the lowest slot's.

    This is predictive scaling: the floor carries the day's known shape, which the
    policy's reactive signals follow only after a start-up and a look-back window (tens
    of minutes on a steep rise); the policy still scales above it for a day busier than
    forecast, and a written config should be refitted when the day's shape changes."""
    if planned < 1 or not 0 < slot_minutes <= 720 or 1440 % slot_minutes or margin < 0 \
            or not 0 <= shift_minutes <= 720:
        raise ValueError("fitting floors needs replicas, slots that divide a day, "
                         "margin >= 0 and a shift of 0 to 720 minutes")
    lead_minutes = math.ceil((spec.startup_s + spec.tick_s) / 60)
    floors = []
    for start in range(0, 1440, slot_minutes):
        highest = max(spec.forecast_share((minute - peak_minute) / 1440) for minute in
                      range(start + lead_minutes - shift_minutes,
                            start + slot_minutes + lead_minutes + shift_minutes + 1))
        floors.append(max(1, math.ceil(planned * highest * (1 + margin) - 1e-9)))
    night = min(floors)
    windows: list[tuple[int, int, int]] = []
    for index, floor in enumerate(floors):
        start = index * slot_minutes
        if floor <= night:
            continue
        if windows and windows[-1][1] == start and windows[-1][2] == floor:
            windows[-1] = (windows[-1][0], start + slot_minutes, floor)
        else:
            windows.append((start, start + slot_minutes, floor))
    return FittedStandby(night, tuple(windows), timezone)
