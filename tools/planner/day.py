"""The planned cluster over a day under pdserve's autoscalers (pure: seeded, no clock).

A plan holds the peak, but most of a day is not the peak. This module answers what the
planned cluster costs over a day, and how its latency fares, when its pools are sized by
pdserve's own autoscaling policy (``cluster.autoscaling.policy.decide_app``) under the
config ``pdserve plan`` writes: its per-replica targets, bounds, standby windows,
cool-downs and step limits, with replicas that take minutes to start and that drain
before they stop. (The config's standby floors are fitted to the forecast day in
tools/planner/standby_fit.py.)

Two time scales, two models. A replica's load settles within a minute (a request lasts
seconds); the rate moves over hours and the autoscaler over minutes. So:

- **Sensors** (``sense``): the discrete-event simulation of the planned cluster's slice
  at several multiples of its planned load per replica gives what one replica of each
  pool reports at that load (``ReplicaObservation``: queued prompt tokens, running
  sequences, KV use, p95 latencies, token rates) and the two parts of the p95 TTFT.
- **The fleet** (``simulate_day``): every metrics interval, each pool's serving replicas
  report what the sensor gives at their share of that moment's rate; the policy sees the
  reports averaged over Serve's look-back window (stale, as Serve gives them) and
  decides. A new replica serves ``startup_s`` after it is asked for; a removed one stops
  taking requests at once and holds its GPUs ``drain_s`` longer while its requests
  finish; a start still pending is cancelled before a serving replica is drained.

The fleet is simulated whole (hundreds of replicas), not as a slice: the policy steps in
whole replicas (``max_downscale_step``), so a slice of it would shrink too fast. What the
split costs: a load beyond the sensors' largest multiple reads as that multiple (a queue
that grows without bound there is not modelled), and a load's latency is the settled
one, not a burst's.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from itertools import pairwise

from cluster.autoscaling.config import AutoscalingConfig, ReplicaBounds
from cluster.autoscaling.policy import (
    PoolLoad,
    PoolState,
    PoolView,
    ReplicaObservation,
    ScalingDecision,
    decide_app,
)
from cluster.percentile import percentile
from cluster.slo import SLOConfig
from tools.planner.des import SimResult
from tools.planner.search import (
    Plan,
    Prediction,
    arrived_in,
    best_decode_batch,
    read,
    run_slice,
)
from tools.planner.workload import diurnal_concentration, diurnal_share, mean_lengths

DAY_S = 86_400.0
POOLS = ("prefill", "decode")
# Fields of a report that grow with the load (zero when idle); the rest are latencies.
_EXTENSIVE = ("queued_prefill_tokens", "running_seqs", "kv_usage", "prompt_tokens_per_s",
              "output_tokens_per_s")


@dataclass(frozen=True)
class Sensed:
    """What one replica of each pool reports at ``multiple`` times its planned load."""

    multiple: float
    prefill: ReplicaObservation
    decode: ReplicaObservation
    ttft_p95_s: float              # the requests' (both pools at this multiple)
    on_decode_p95_s: float         # its part after the KV reached decode (a decode slot,
    #                                the first step)
    e2e_p99_s: float


@dataclass(frozen=True)
class Sensors:
    """Reports by load, interpolated between the simulated multiples (ascending)."""

    points: tuple[Sensed, ...]

    def __post_init__(self) -> None:
        multiples = [p.multiple for p in self.points]
        if not multiples or multiples != sorted(set(multiples)) or multiples[0] <= 0:
            raise ValueError("sensors need ascending positive load multiples")

    @property
    def largest(self) -> float:
        return self.points[-1].multiple

    def at(self, pool: str, multiple: float) -> ReplicaObservation:
        """One replica's report at ``multiple``: rates and queues fall to zero with the
        load, latencies keep their lightest-load value; beyond the largest, the largest."""
        values = {}
        for f in fields(ReplicaObservation):
            def value(point: Sensed, name: str = f.name) -> float | None:
                return getattr(getattr(point, pool), name)
            values[f.name] = self._interpolated(multiple, value, f.name in _EXTENSIVE)
        return ReplicaObservation(**values)

    def ttft_p95_s(self, prefill_multiple: float, decode_multiple: float) -> float:
        """The p95 TTFT with each pool at its own multiple: the one simulated with both
        at the prefill's, its part on decode moved to the decode's multiple (exact where
        the multiples agree; p95s of the parts do not add up to the whole's)."""
        def on_decode(multiple: float) -> float:
            return self._interpolated(multiple, lambda p: p.on_decode_p95_s) or 0.0

        whole = self._interpolated(prefill_multiple, lambda p: p.ttft_p95_s) or 0.0
        return max(0.0, whole + on_decode(decode_multiple) - on_decode(prefill_multiple))

    def itl_p95_s(self, decode_multiple: float) -> float:
        return self._interpolated(decode_multiple, lambda p: p.decode.itl_p95_s) or 0.0

    def _interpolated(self, multiple: float, value: Callable[[Sensed], float | None],
                      to_zero: bool = False) -> float | None:
        known = [(p.multiple, v) for p in self.points if (v := value(p)) is not None]
        if not known:
            return None
        if to_zero:
            known.insert(0, (0.0, 0.0))
        multiple = min(max(multiple, known[0][0]), known[-1][0])
        for (low, low_value), (high, high_value) in pairwise(known):
            if multiple <= high:
                return low_value + (high_value - low_value) * (multiple - low) / (high - low)
        return known[-1][1]


def sense(plan: Plan, multiples: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2)
          ) -> Sensors:
    """Simulate the planned cluster's slice at each multiple of its peak rate, as the
    search simulated it (at 1.0 this is the plan's own prediction), and read one
    replica's reports off it (the means over the read window)."""
    points = []
    counts = tuple(plan.prediction.replicas[pool] for pool in POOLS)
    for multiple in sorted(multiples):
        workload = plan.inputs.workload
        inputs = replace(plan.inputs, workload=replace(workload, rate=workload.rate * multiple))
        result, simulated, window = run_slice(inputs, *counts)
        prediction = read(result, inputs, *counts, simulated, window)
        points.append(sensed(multiple, result, prediction, simulated, window))
    return Sensors(tuple(points))


def sensed(multiple: float, result: SimResult, prediction: Prediction,
           simulated: tuple[int, int], window: tuple[float, float]) -> Sensed:
    """One replica's reports in ``result`` over ``window``, as a replica of each pool
    reports them (cluster/engine/load_report.py): the prefill's TTFT is arrival to
    prefill done; rates are per second of the traffic."""
    start, end = window[0], min(window[1], result.last_arrival_s)
    span = max(result.last_arrival_s, 1e-9)

    def mean_report(pool: str, column: int) -> float:
        values = [r[column] for r in result.reports if r[1] == pool and start <= r[0] <= end]
        return sum(values) / len(values) if values else 0.0

    read_in = arrived_in(result, (start, end))
    prefilled = sorted(o.prefill_done_s for _, o in read_in if o.prefill_done_s is not None)
    answers = sorted(o.e2e_s if o.e2e_s is not None else math.inf for _, o in read_in)
    prefill = ReplicaObservation(
        queued_prefill_tokens=mean_report("prefill", 2),
        ttft_p95_s=percentile(prefilled, 95),
        prompt_tokens_per_s=result.prompt_tokens["prefill"]["computed"]
        / span / max(1, simulated[0]))
    decode = ReplicaObservation(
        queued_prefill_tokens=mean_report("decode", 2), running_seqs=mean_report("decode", 3),
        kv_usage=mean_report("decode", 4), itl_p95_s=prediction.itl_s["p95"],
        output_tokens_per_s=sum(r.output_tokens for r in result.requests)
        / span / max(1, simulated[1]))
    return Sensed(multiple, prefill, decode, prediction.ttft_s["p95"],
                  prediction.on_decode_p95_s, percentile(answers, 99) or 0.0)


# --- the fleet over a day --------------------------------------------------------------


@dataclass(frozen=True)
class DaySpec:
    """The day: its rate curve (``workload.diurnal_share``), anchored at an instant of
    its peak, and how long replicas take to start and to drain."""

    peak_at_s: float                  # epoch seconds of a peak (the curve repeats daily)
    peak_to_mean: float = 6.0
    night_share: float = 0.05
    startup_s: float = 300.0          # asked for -> serving (weights loaded, warmed up)
    drain_s: float = 60.0             # removed -> its GPUs free (its requests finish)
    tick_s: float = 10.0              # how often replicas report and the policy decides
    days: int = 2                     # simulated from a trough; the last one is read
    rate_scale: float = 1.0           # the day's rate over the forecast (the plan's)

    def __post_init__(self) -> None:
        if self.tick_s <= 0 or self.days < 1 or self.rate_scale <= 0:
            raise ValueError("a day needs a positive tick and rate, and one day or more")
        if self.startup_s < 0 or self.drain_s < 0:
            raise ValueError("a replica's start-up and drain times are 0 or more seconds")

    def forecast_share(self, days_after_peak: float) -> float:
        """The forecast rate ``days_after_peak`` after a peak, as a share of the peak's
        (the curve repeats daily; ``rate_scale`` is not applied)."""
        return diurnal_share(days_after_peak % 1.0, self._concentration, self.night_share)

    @cached_property
    def _concentration(self) -> float:
        return diurnal_concentration(self.peak_to_mean, self.night_share)


@dataclass
class _PoolFleet:
    """One pool's replicas: the policy's target, and each replica's stage."""

    target: int
    serving: int
    starting: list[float] = field(default_factory=list)    # when each will serve
    draining: list[float] = field(default_factory=list)    # when each will be gone
    state: PoolState = field(default_factory=PoolState)
    reports: deque = field(default_factory=deque)          # (time, observation)

    @property
    def alive(self) -> int:
        return self.serving + len(self.starting) + len(self.draining)

    def advance(self, now: float) -> None:
        ready = [at for at in self.starting if at <= now]
        self.starting = [at for at in self.starting if at > now]
        self.serving += len(ready)
        self.draining = [at for at in self.draining if at > now]

    def apply(self, decision: ScalingDecision, now: float, spec: DaySpec) -> None:
        self.state = decision.state
        change = decision.desired - self.target
        self.target = decision.desired
        for _ in range(max(0, change)):
            self.starting.append(now + spec.startup_s)
        for _ in range(max(0, -change)):
            if self.starting:           # the latest start is cancelled first
                self.starting.remove(max(self.starting))
            else:
                self.serving -= 1
                self.draining.append(now + spec.drain_s)

    def load(self, observation: ReplicaObservation, now: float, look_back_s: float
             ) -> PoolLoad:
        """The serving replicas' reports as the policy gets them: each the mean of what
        it reported over the look-back window."""
        self.reports.append((now, observation))
        while self.reports and self.reports[0][0] <= now - look_back_s:
            self.reports.popleft()
        return PoolLoad((_mean([o for _, o in self.reports]),) * self.serving)


def _mean(observations: list[ReplicaObservation]) -> ReplicaObservation:
    """Each field's mean over the reports that have it (``PoolLoad.mean``)."""
    reports = PoolLoad(tuple(observations))
    return ReplicaObservation(**{f.name: reports.mean(f.name)
                                 for f in fields(ReplicaObservation)})


@dataclass(frozen=True)
class DayPoint:
    """The fleet at one instant (a timeline sample, a minute apart)."""

    hours_after_start: float
    rate_share: float
    alive: dict[str, int]             # starting + serving + draining, per pool
    serving: dict[str, int]
    ideal: dict[str, int]             # the plan scaled to the rate (``Plan.gpus_by_hour``)
    ttft_p95_s: float
    itl_p95_s: float


@dataclass(frozen=True)
class DayResult:
    gpu_hours: dict[str, float]           # per pool, every replica alive, over the read day
    ideal_gpu_hours: dict[str, float]     # each pool at the plan scaled to the rate
    replicas: dict[str, tuple[int, int]]  # per pool, the fewest and most alive
    hours_over_slo: dict[str, float]      # "ttft", "itl": predicted p95 over its SLO
    hours_beyond_sensors: float           # a pool loaded past the largest sensed multiple
    scale_events: dict[str, dict[str, int]]
    timeline: tuple[DayPoint, ...]


def simulate_day(spec: DaySpec, sensors: Sensors, planned: tuple[int, int],
                 tps: tuple[int, int], config: AutoscalingConfig, slo: SLOConfig,
                 bounds: dict[str, ReplicaBounds] | None = None) -> DayResult:
    """``spec``'s days on a fleet sized by ``decide_app`` (``config``, ``slo``, each
    pool's ``bounds``), its replicas reporting what ``sensors`` give at their load. The
    planned counts (``planned``: prefill, decode replicas) carry the plan's load per
    replica at the peak rate; ``tps`` are each pool's GPUs per replica."""
    start = spec.peak_at_s - DAY_S / 2 - (spec.days - 1) * DAY_S
    read_from = start + (spec.days - 1) * DAY_S
    bounds = bounds or {pool: getattr(config, pool).bounds for pool in POOLS}
    planned_by_pool = dict(zip(POOLS, planned, strict=True))
    gpus_by_pool = dict(zip(POOLS, tps, strict=True))

    def share_at(now: float) -> float:
        return spec.rate_scale * spec.forecast_share((now - spec.peak_at_s) / DAY_S)

    def ideal(pool: str, share: float) -> int:
        return max(1, math.ceil(planned_by_pool[pool] * share))

    fleets = {pool: _PoolFleet(target=(n := bounds[pool].clamp(ideal(pool, share_at(start)))),
                               serving=n) for pool in POOLS}
    tally = _DayTally(spec, gpus_by_pool)
    steps = round(spec.days * DAY_S / spec.tick_s)
    for step in range(steps):
        now = start + step * spec.tick_s
        share = share_at(now)
        for fleet in fleets.values():
            fleet.advance(now)
        multiples = {pool: share * planned_by_pool[pool] / max(fleets[pool].serving, 1e-9)
                     for pool in POOLS}
        views = {pool: PoolView(fleets[pool].target, fleets[pool].load(
            sensors.at(pool, multiples[pool]), now, config.look_back_period_s),
            fleets[pool].state, bounds[pool], running=fleets[pool].serving)
            for pool in POOLS}
        decision = decide_app(views["prefill"], views["decode"], config, slo, now)
        for pool in POOLS:
            tally.scaled(pool, getattr(decision, pool), now >= read_from)
            fleets[pool].apply(getattr(decision, pool), now, spec)
        if now >= read_from:
            tally.add(now - read_from, share, fleets, {p: ideal(p, share) for p in POOLS},
                      sensors, multiples, slo)
    return tally.result()


class _DayTally:
    """What the read day adds up to."""

    def __init__(self, spec: DaySpec, gpus_by_pool: dict[str, int]):
        self.spec = spec
        self.gpus = gpus_by_pool
        self.gpu_s = dict.fromkeys(POOLS, 0.0)
        self.ideal_gpu_s = dict.fromkeys(POOLS, 0.0)
        self.fewest = dict.fromkeys(POOLS, math.inf)
        self.most = dict.fromkeys(POOLS, 0)
        self.over_s = {"ttft": 0.0, "itl": 0.0}
        self.beyond_s = 0.0
        self.events = {pool: {"up": 0, "down": 0} for pool in POOLS}
        self.timeline: list[DayPoint] = []

    def scaled(self, pool: str, decision: ScalingDecision, counted: bool) -> None:
        if counted and decision.direction != "hold":
            self.events[pool][decision.direction] += 1

    def add(self, since_s: float, share: float, fleets: dict[str, _PoolFleet],
            ideal: dict[str, int], sensors: Sensors, multiples: dict[str, float],
            slo: SLOConfig) -> None:
        tick = self.spec.tick_s
        for pool in POOLS:
            alive = fleets[pool].alive
            self.gpu_s[pool] += alive * self.gpus[pool] * tick
            self.ideal_gpu_s[pool] += ideal[pool] * self.gpus[pool] * tick
            self.fewest[pool] = min(self.fewest[pool], alive)
            self.most[pool] = max(self.most[pool], alive)
        ttft = sensors.ttft_p95_s(multiples["prefill"], multiples["decode"]) or 0.0
        itl = sensors.itl_p95_s(multiples["decode"])
        self.over_s["ttft"] += tick if ttft > slo.ttft_p95_s else 0.0
        self.over_s["itl"] += tick if itl > slo.itl_p95_s else 0.0
        self.beyond_s += tick if max(multiples.values()) > sensors.largest else 0.0
        if since_s % 60.0 < tick:
            self.timeline.append(DayPoint(
                since_s / 3600, share, {p: fleets[p].alive for p in POOLS},
                {p: fleets[p].serving for p in POOLS}, ideal, ttft, itl))

    def result(self) -> DayResult:
        return DayResult(
            {p: s / 3600 for p, s in self.gpu_s.items()},
            {p: s / 3600 for p, s in self.ideal_gpu_s.items()},
            {p: (int(self.fewest[p]), self.most[p]) for p in POOLS},
            {name: s / 3600 for name, s in self.over_s.items()},
            self.beyond_s / 3600, self.events, tuple(self.timeline))


# --- the autoscaler's targets for the planned cluster -----------------------------------


def autoscaling_targets(plan: Plan, sensors: Sensors, headroom: float = 0.0
                        ) -> dict[str, dict[str, float]]:
    """Each pool's per-replica autoscaling targets (``PrefillScalingConfig``,
    ``DecodeScalingConfig``) for the planned cluster: capacities from its cost model and
    a utilisation that makes the throughput signal ask for the planned count times
    1 + ``headroom`` at the peak, so the policy holds the plan there and scales it with
    the rate elsewhere, ahead of it by ``headroom`` (a scale-up to exactly the load of
    its moment is short again once its replicas have started on a rising rate); the
    other signals' targets sit above what a replica reports at the peak (they are for
    bursts).

    prefill: a replica's capacity is the prompt tokens it computes per busy second; the
    utilisation is its busy share at the peak over 1 + headroom; the queue target is half
    the TTFT objective's worth of that capacity. decode: the capacity is the tokens/s of the
    largest batch whose step stays within the ITL objective (``best_decode_batch``), the
    sequences target that batch.
    """
    inputs = plan.inputs
    prefill, decode = sensors.at("prefill", 1.0), sensors.at("decode", 1.0)
    if headroom < 0:
        raise ValueError("the throughput signal's headroom is 0 or more")
    busy = min(0.95, max(0.05, plan.prediction.prefill_busy))
    prompt_rate = prefill.prompt_tokens_per_s or 0.0
    prefill_capacity = max(1.0, prompt_rate / busy)
    mean_prompt, mean_output = mean_lengths(inputs.workload)
    context = mean_prompt + mean_output / 2
    batch = best_decode_batch(inputs, context)
    step_s = inputs.decode_cost.step_time(batch, batch * context, int(batch * context))
    output_rate = decode.output_tokens_per_s or 0.0
    decode_use = min(0.95, max(0.05, output_rate / (batch / step_s)))
    return {
        "prefill": {
            "tokens_per_s_per_replica": round(prefill_capacity),
            "target_utilisation": round(busy / (1 + headroom), 3),
            "target_queued_tokens_per_replica": round(max(
                prefill_capacity * inputs.slo.ttft_p95_s / 2,
                2 * (prefill.queued_prefill_tokens or 0.0), 1.0)),
        },
        "decode": {
            "output_tokens_per_s_per_replica": round(max(1.0, output_rate / decode_use)),
            "target_utilisation": round(decode_use / (1 + headroom), 3),
            "target_running_seqs_per_replica": round(max(
                batch, 1.1 * (decode.running_seqs or 0.0))),
            "target_kv_usage": round(min(1.0, max(0.8, 1.1 * (decode.kv_usage or 0.0))), 3),
        },
    }


def fitting_downscale_step(replicas: int, cooldown_s: float, peak_to_mean: float,
                           night_share: float = 0.05) -> int:
    """The replicas one scale-down must be allowed to remove (``max_downscale_step``) for
    a pool of ``replicas`` at the peak to follow the day's steepest fall, one step per
    ``cooldown_s``, with a quarter to spare for the delay before the first step. A step
    of one replica, fine for a pool of ten, would hold a pool of hundreds near its peak
    size for the whole night."""
    kappa = diurnal_concentration(peak_to_mean, night_share)
    minutes = int(DAY_S // 60)
    fall = max(diurnal_share(m / minutes, kappa, night_share)
               - diurnal_share((m * 60 + cooldown_s) / DAY_S, kappa, night_share)
               for m in range(minutes))
    return max(1, math.ceil(1.25 * replicas * fall))
