"""Configuration of per-pool autoscaling (pure: pydantic and zoneinfo only).

Defaults are sized for the reference scenario (a 70B model, p95 TTFT under 500 ms at the
evening peak); a deployment overrides the per-replica capacities with what it measured.
The latency objectives the policies scale for are not here but in the cluster's ``slo``
section (``cluster.slo``), which the dashboard and the benchmark read too.
"""

from __future__ import annotations

import re
from datetime import time
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from cluster.strict import StrictModel

Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

_HH_MM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


def parse_hh_mm(text: str) -> time:
    """``text`` as a time of day, HH:MM on a 24-hour clock (00:00..23:59)."""
    match = _HH_MM.match(text)
    if match is None:
        raise ValueError(f"expected a time of day as HH:MM (00:00..23:59), got {text!r}")
    return time(int(match.group(1)), int(match.group(2)))


class ReplicaBounds(StrictModel):
    """The least and most replicas of one pool (or of one model version's pool).

    The one bounds type: each pool's autoscaling section is one (its defaults), and a pool's
    own ``min_replicas``/``max_replicas`` override them through :meth:`overridden`, so the
    ordering rule below is the only one.
    """

    min_replicas: int = Field(1, ge=0, description="lower bound of the pool")
    max_replicas: int = Field(8, ge=1, description="upper bound of the pool")

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaBounds:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        return self

    def clamp(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))

    def overridden(
        self, min_replicas: int | None = None, max_replicas: int | None = None
    ) -> ReplicaBounds:
        """These bounds with the ends given replaced (validated: the result is ordered)."""
        return ReplicaBounds(
            min_replicas=self.min_replicas if min_replicas is None else min_replicas,
            max_replicas=self.max_replicas if max_replicas is None else max_replicas,
        )


class StandbyWindow(StrictModel):
    """A daily period with a higher minimum, e.g. the evening peak 17:00-23:00.

    ``end`` at or before ``start`` means the window wraps midnight (22:00-02:00 ends the
    next day). ``days`` names the weekdays the window *starts* on; None means every day.
    """

    start: str = Field(description="local start time, HH:MM")
    end: str = Field(description="local end time, HH:MM (earlier than start: next day)")
    min_replicas: int = Field(ge=0, description="the pool's floor while the window lasts")
    days: list[Weekday] | None = Field(
        None, description="weekdays the window starts on (mon..sun); None: every day"
    )

    @field_validator("start", "end")
    @classmethod
    def _time_of_day(cls, text: str) -> str:
        parse_hh_mm(text)
        return text

    @model_validator(mode="after")
    def _not_empty(self) -> StandbyWindow:
        if self.start == self.end:
            raise ValueError(
                "start equals end; for an all-day floor raise the pool's min_replicas instead"
            )
        return self

    @property
    def start_time(self) -> time:
        return parse_hh_mm(self.start)

    @property
    def end_time(self) -> time:
        return parse_hh_mm(self.end)

    @property
    def wraps_midnight(self) -> bool:
        return self.end_time < self.start_time


class StandbySchedule(StrictModel):
    """Warm capacity ahead of known peaks: a floor per window, ramped up before it starts.

    GPU replicas take minutes to start, so the floor rises linearly over ``ramp_minutes``
    before each window (in whole replicas), and the capacity is running when the peak
    arrives rather than being requested by it.
    """

    timezone: str = Field("UTC", description="IANA time zone of the windows, e.g. Europe/Berlin")
    ramp_minutes: float = Field(
        30, ge=0, le=720, description="how long before a window the floor starts to rise"
    )
    windows: list[StandbyWindow] = Field(default_factory=list)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, name: str) -> str:
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown IANA time zone {name!r}") from None
        return name

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


# Keys that moved out of the autoscaling sections: named in the error, not just refused.
_MOVED = {"ttft_p95_slo_s": "slo.ttft_p95_s", "itl_p95_slo_s": "slo.itl_p95_s"}


class PoolScalingConfig(ReplicaBounds):
    """What both pools' policies share: bounds (the pool's defaults), utilisation target,
    hysteresis, timing. The latency objective is the cluster's ``slo`` section."""

    target_utilisation: float = Field(
        0.75, gt=0, le=1,
        description="fraction of a replica's measured throughput to plan for (headroom for "
        "bursts and for latency, which climbs steeply near saturation)",
    )
    hysteresis: float = Field(
        0.2, ge=0, lt=1,
        description="scale down only when the load fits fewer replicas with this much "
        "spare and latency is this far below the SLO; a scale-up for a load need lands with "
        "this much spare (within the step limit)",
    )
    upscale_cooldown_s: float = Field(
        60, ge=0,
        description="after a scale-up's replicas are all running, how long before the next "
        "scale-up (Serve averages metrics over look_back_period_s, so they lag)",
    )
    downscale_delay_s: float = Field(
        300, ge=0, description="how long a scale-down must be wanted in a row before it happens"
    )
    downscale_cooldown_s: float = Field(
        600, ge=0, description="least time between any scale event and the next scale-down"
    )
    max_downscale_step: int = Field(1, ge=1, description="replicas removed per scale-down at most")
    max_upscale_factor: float = Field(
        2.0, gt=1,
        description="one scale-up multiplies replicas by at most this (and adds at least one)",
    )
    standby: StandbySchedule | None = Field(None, description="time-of-day floor; None: none")

    @model_validator(mode="before")
    @classmethod
    def _no_moved_keys(cls, data: Any) -> Any:
        moved = [f"{key} moved to {_MOVED[key]}" for key in _MOVED
                 if isinstance(data, dict) and key in data]
        if moved:
            raise ValueError("; ".join(moved) + " (one SLO for the whole cluster)")
        return data

    @property
    def bounds(self) -> ReplicaBounds:
        return ReplicaBounds(min_replicas=self.min_replicas, max_replicas=self.max_replicas)


class PrefillScalingConfig(PoolScalingConfig):
    """The prefill pool: compute-bound, sized by queued prompt tokens and TTFT."""

    target_queued_tokens_per_replica: float = Field(
        16384, gt=0,
        description="prompt tokens waiting + being prefilled per replica; the default is "
        "about half a second of work at tokens_per_s_per_replica, in line with the TTFT "
        "objective (slo.ttft_p95_s)",
    )
    tokens_per_s_per_replica: float = Field(
        32768, gt=0, description="prompt tokens one replica prefills per second at full load"
    )


class DecodeScalingConfig(PoolScalingConfig):
    """The decode pool: memory-bandwidth-bound, sized by running sequences, KV and ITL."""

    max_replicas: int = Field(16, ge=1, description="default upper bound of the pool")
    target_running_seqs_per_replica: float = Field(
        128, gt=0, description="sequences decoding at once per replica"
    )
    target_kv_usage: float = Field(
        0.8, gt=0, le=1, description="KV-cache fraction per replica beyond which to add replicas"
    )
    output_tokens_per_s_per_replica: float = Field(
        3000, gt=0, description="tokens one replica generates per second at full load"
    )


class AutoscalingConfig(StrictModel):
    """Autoscaling of the prefill and decode pools, separately and as one application.

    Reaches Ray Serve as ``policy_kwargs`` (``model_dump(mode="json")``); see
    ``cluster.autoscaling.serve_policy``.
    """

    enabled: bool = Field(True, description="false: pools keep their fixed `replicas`")
    look_back_period_s: float = Field(
        30, gt=0, description="window over which Serve averages what replicas report"
    )
    prefill: PrefillScalingConfig = PrefillScalingConfig()
    decode: DecodeScalingConfig = DecodeScalingConfig()
    couple_pools: bool = Field(
        True,
        description="when one pool scales up, raise the other to the observed prompt/output "
        "proportion (application-level policy only)",
    )
    min_prefill_per_decode: float = Field(
        0.05, gt=0, description="lowest prefill:decode replica ratio the coupling may ask for"
    )
    max_prefill_per_decode: float = Field(
        4.0, gt=0, description="highest prefill:decode replica ratio the coupling may ask for"
    )
    ratio_tolerance: float = Field(
        0.25, ge=0, lt=1,
        description="how far short of the exact proportion the other pool is raised to, so "
        "rounding and noise are not chased",
    )
    min_mix_tokens_per_s: float = Field(
        1.0, ge=0,
        description="below this prompt or output rate the mix is not measurable and no "
        "ratio is applied",
    )

    @model_validator(mode="after")
    def _ratio_ordered(self) -> AutoscalingConfig:
        if self.min_prefill_per_decode > self.max_prefill_per_decode:
            raise ValueError("min_prefill_per_decode exceeds max_prefill_per_decode")
        return self
