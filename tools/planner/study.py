"""A plan's written autoscaling and its day, from ``pdserve plan``'s arguments (shell:
reads ``--base-config``): what ``pdserve plan`` writes and runs, and what the studies of
tools/experiments/ call."""

from __future__ import annotations

import argparse
import datetime as dt
from dataclasses import dataclass, replace
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from cluster.config import parse_config
from tools.planner.arguments import add_parser
from tools.planner.day import (
    POOLS,
    DaySpec,
    autoscaling_targets,
    fitting_downscale_step,
    sense,
    simulate_day,
)
from tools.planner.inputs import inputs_from
from tools.planner.search import search
from tools.planner.standby_fit import fit_standby


@dataclass(frozen=True)
class ScalingInputs:
    """What a plan's written autoscaling is fitted from: the base config (as written and
    parsed), the loads the planned replicas would report (``day.sense``: at each sensed
    multiple of the peak with the day, at the peak alone without it; None when the base
    has no autoscaling), each pool's throughput targets and downscale step, the forecast
    day (None without autoscaling) and the peak's local time of day."""

    base: dict
    parsed: Any
    sensors: Any
    targets: dict
    forecast: Any
    peak_at: dt.time

    def fitted_floors(self, plan, margin: float, shift_minutes: int,
                      slot_minutes: int = 30) -> dict:
        """Each pool's standby floors fitted to the forecast day (``standby_fit.fit_standby``),
        both in the zone the peak's time is read in."""
        zone = _peak_zone(self.parsed.autoscaling).key
        peak_minute = self.peak_at.hour * 60 + self.peak_at.minute
        return {pool: fit_standby(replicas, peak_minute, self.forecast, slot_minutes,
                                  margin, shift_minutes, zone)
                for pool, replicas in plan.prediction.replicas.items()}


def plan_for_study(argv: list[str]):
    """``pdserve plan``'s arguments parsed from ``argv``, the plan it searches and its
    ``ScalingInputs``: for scripts that study a plan's day (tools/experiments/standby_fits.py,
    tools/experiments/max_replicas_cap.py, tools/experiments/router_herding.py)."""
    commands = argparse.ArgumentParser().add_subparsers(dest="command")
    add_parser(commands)
    args = commands.choices["plan"].parse_args(argv)
    plan = search(inputs_from(args))
    return args, plan, scaling_inputs(args, plan)


def scaling_inputs(args, plan) -> ScalingInputs:
    """``ScalingInputs`` of ``plan`` under ``pdserve plan``'s parsed ``args``
    (``--base-config``, ``--day``, ``--scaling-headroom``, ``--downscale-step``,
    ``--peak-at``, ``--peak-to-mean``, ``--startup-s``)."""
    base = yaml.safe_load(args.base_config.read_text())
    parsed = parse_config(base, source=str(args.base_config))
    # The written targets need the planned load only; the day needs the loads around it
    sensors = None
    if parsed.autoscaling is not None:
        sensors = sense(plan) if args.day else sense(plan, multiples=(1.0,))
    targets = autoscaling_targets(plan, sensors, args.scaling_headroom) if sensors else {}
    _add_downscale_steps(args, plan, parsed, targets)
    forecast = None
    if parsed.autoscaling is not None:
        forecast = DaySpec(
            peak_at_s=_peak_epoch(args.peak_at, parsed.autoscaling),
            peak_to_mean=args.peak_to_mean, startup_s=args.startup_s,
            drain_s=next(p for p in sensors.points if p.multiple >= 1.0).e2e_p99_s)
    return ScalingInputs(base, parsed, sensors, targets, forecast, args.peak_at)


def day_runner(plan, sensors, forecast):
    """``run(config, without_floors=False, **spec_changes)``: a day under ``config``'s
    autoscalers (without its standby windows and with night floors of one replica if
    asked), the forecast day changed by ``spec_changes``."""

    def run(config, without_floors: bool = False, **spec_changes):
        version = next(iter(config.versions))
        bounds = {pool: config.scaling_bounds(version, pool) for pool in POOLS}
        autoscaling = config.autoscaling
        if without_floors:
            bounds = {pool: bound.overridden(min_replicas=1) for pool, bound in bounds.items()}
            autoscaling = without_windows(autoscaling)
        return simulate_day(
            replace(forecast, **spec_changes), sensors,
            tuple(plan.prediction.replicas[pool] for pool in POOLS),
            (plan.inputs.prefill_cost.tp, plan.inputs.decode_cost.tp), autoscaling,
            config.slo, bounds)
    return run


def without_windows(autoscaling):
    """``autoscaling`` without either pool's standby windows."""
    return autoscaling.model_copy(update={
        pool: getattr(autoscaling, pool).model_copy(update={"standby": None})
        for pool in POOLS})


def _add_downscale_steps(args, plan, base, targets: dict) -> None:
    """Each pool's ``max_downscale_step``: ``--downscale-step``, else the base config's or
    the step the planned size needs to follow the day down, whichever is larger."""
    if base.autoscaling is None:
        return
    for pool, replicas in plan.prediction.replicas.items():
        scaling = getattr(base.autoscaling, pool)
        step = args.downscale_step or max(scaling.max_downscale_step, fitting_downscale_step(
            replicas, scaling.downscale_cooldown_s, args.peak_to_mean))
        targets.setdefault(pool, {})["max_downscale_step"] = step


def _peak_epoch(peak_at: dt.time, autoscaling) -> float:
    """Epoch seconds of ``peak_at`` on a fixed Wednesday, local to the standby schedule's
    zone (UTC without one)."""
    return dt.datetime.combine(dt.date(2026, 1, 7), peak_at,
                               tzinfo=_peak_zone(autoscaling)).timestamp()


def _peak_zone(autoscaling):
    """The zone ``--peak-at`` is local to: the base's standby schedule's (decode's, else
    prefill's), UTC without one."""
    schedule = autoscaling.decode.standby or autoscaling.prefill.standby
    return schedule.zone if schedule else ZoneInfo("UTC")
