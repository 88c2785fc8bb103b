"""How many replicas each pool should have (pure: no Ray, no clock; ``now`` is passed in).

Every signal becomes a ``Need`` in replicas (``prefill_needs``, ``decode_needs``, p95
latency against the ``slo``) and a pool takes the largest; ``decide_prefill`` and
``decide_decode`` apply the step, cool-down, hysteresis, bounds and standby-floor rules to
it, and ``decide_app`` sizes both pools together by the observed prompt/output token mix.
Why, and what it measured: docs/design.md, "Autoscaling: the pools' own policies, a
standby floor, drain on the way down".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

from cluster.autoscaling.config import (
    AutoscalingConfig,
    DecodeScalingConfig,
    PoolScalingConfig,
    PrefillScalingConfig,
    ReplicaBounds,
)
from cluster.autoscaling.schedule import Instant, epoch_seconds, standby_floor
from cluster.slo import SLOConfig

Pool = Literal["prefill", "decode"]
Direction = Literal["up", "down", "hold"]
NeedKind = Literal["per_replica", "level", "replicas"]

# ceil() of a need computed as 3 * 16384 / 16384 must not become 4 through rounding noise.
_EPS = 1e-9


@dataclass(frozen=True)
class ReplicaObservation:
    """One replica's report; None where it reported nothing.

    Units match the metric names of ``cluster.engine.load_report``: tokens, sequences,
    a 0..1 fraction, seconds and tokens per second.
    """

    queued_prefill_tokens: float | None = None
    running_seqs: float | None = None
    kv_usage: float | None = None
    ttft_p95_s: float | None = None
    itl_p95_s: float | None = None
    prompt_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None


@dataclass(frozen=True)
class PoolLoad:
    """What a pool's running replicas reported, combined into pool totals and means."""

    replicas: tuple[ReplicaObservation, ...] = ()

    @classmethod
    def spread(cls, count: int, **totals: float | None) -> PoolLoad:
        """``count`` identical replicas sharing pool totals (latencies are copied as they are).

        For simulations and tests, where the load is known for the pool as a whole.
        """
        if count < 1:
            return cls()
        per_replica = {
            name: value if value is None or name.endswith("_p95_s") or name == "kv_usage"
            else value / count
            for name, value in totals.items()
        }
        return cls(tuple(ReplicaObservation(**per_replica) for _ in range(count)))

    def _values(self, name: str) -> list[float]:
        return [value for r in self.replicas if (value := getattr(r, name)) is not None]

    def total(self, name: str) -> float:
        return sum(self._values(name))

    def mean(self, name: str) -> float | None:
        values = self._values(name)
        return sum(values) / len(values) if values else None

    @property
    def reported(self) -> bool:
        return any(any(getattr(r, f.name) is not None for f in fields(r)) for r in self.replicas)


@dataclass(frozen=True)
class PoolState:
    """What a pool's policy remembers between decisions (epoch seconds; None: never)."""

    last_scale_up_s: float | None = None
    last_scale_down_s: float | None = None
    down_wanted_since_s: float | None = None
    ready_since_s: float | None = None     # all replicas of the last scale-up running since

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object] | None) -> PoolState:
        """Tolerates missing or foreign keys, so a state from an older version still loads."""
        data = data or {}
        values = {}
        for f in fields(cls):
            value = data.get(f.name)
            values[f.name] = float(value) if isinstance(value, int | float) else None
        return cls(**values)


@dataclass(frozen=True)
class PoolView:
    """One pool at one decision: its target count, running replicas, load, memory, bounds.

    ``current`` is the target the pool is being scaled to; ``running`` how many of its
    replicas serve (None: unknown, then a scale-up waits ``upscale_cooldown_s`` from the
    last one instead of for its replicas). ``bounds`` None means the pool config's own
    min/max; a model version with bounds of its own passes them here.
    """

    current: int
    load: PoolLoad
    state: PoolState = field(default_factory=PoolState)
    bounds: ReplicaBounds | None = None
    running: int | None = None


@dataclass(frozen=True)
class Need:
    """The replicas one signal asks for, with the words to explain it."""

    signal: str
    replicas: float
    observed: str      # "queued prefill tokens 41k"
    target: str        # "16k target", "0.50 s SLO"
    kind: NeedKind = "per_replica"

    def why_up(self, current: int) -> str:
        if self.kind == "per_replica":
            return f"{self.observed} > {current} x {self.target}"
        if self.kind == "level":
            return f"{self.observed} > {self.target}"
        return f"{self.observed} > {current} replicas"

    def why_down(self, replicas: int, headroom: float) -> str:
        spare = f"with {headroom:.0%} headroom"
        if self.kind == "per_replica":
            return f"{self.observed} fits {replicas} x {self.target} {spare}"
        if self.kind == "level":
            return f"{self.observed} fits {replicas} replicas at {self.target} {spare}"
        return f"{self.observed} fits {replicas} replicas {spare}"


@dataclass(frozen=True)
class ScalingDecision:
    """A pool's decision: the count to scale to, why, and the state to pass next time.

    ``need`` is what the strongest signal asked for, in replicas, before steps, bounds and
    the floor: what the pool would need if it could be resized at once.
    """

    pool: Pool
    current: int
    desired: int
    reason: str
    floor: int                          # standby floor in force (0: none)
    state: PoolState = field(default_factory=PoolState)
    need: float = 0.0

    @property
    def direction(self) -> Direction:
        return _direction(self.desired, self.current)


@dataclass(frozen=True)
class AppDecision:
    """Both pools' decisions and the prefill:decode ratio the token mix asked for."""

    prefill: ScalingDecision
    decode: ScalingDecision
    prefill_per_decode: float | None    # None: mix not measurable or coupling off


def prefill_needs(load: PoolLoad, config: PrefillScalingConfig) -> list[Need]:
    """The prefill pool's load needs: queued prompt tokens and prompt throughput."""
    queued = load.total("queued_prefill_tokens")
    per_replica_rate = config.tokens_per_s_per_replica * config.target_utilisation
    prompt_rate = load.total("prompt_tokens_per_s")
    return [
        Need("queue", queued / config.target_queued_tokens_per_replica,
             f"queued prefill tokens {_qty(queued)}",
             f"{_qty(config.target_queued_tokens_per_replica)} target"),
        Need("throughput", prompt_rate / per_replica_rate,
             f"prompt {_qty(prompt_rate)} tokens/s", f"{_qty(per_replica_rate)} tokens/s"),
    ]


def decode_needs(load: PoolLoad, config: DecodeScalingConfig) -> list[Need]:
    """The decode pool's load needs: running sequences, KV-cache use, output throughput."""
    running = load.total("running_seqs")
    kv_mean = load.mean("kv_usage") or 0.0
    per_replica_rate = config.output_tokens_per_s_per_replica * config.target_utilisation
    output_rate = load.total("output_tokens_per_s")
    return [
        Need("sequences", running / config.target_running_seqs_per_replica,
             f"running seqs {_qty(running)}",
             f"{_qty(config.target_running_seqs_per_replica)} target"),
        Need("kv", load.total("kv_usage") / config.target_kv_usage,
             f"mean KV-cache use {kv_mean:.0%}", f"{config.target_kv_usage:.0%} target",
             kind="level"),
        Need("throughput", output_rate / per_replica_rate,
             f"output {_qty(output_rate)} tokens/s", f"{_qty(per_replica_rate)} tokens/s"),
    ]


def decide_prefill(
    view: PoolView, config: PrefillScalingConfig, slo: SLOConfig, now: Instant,
    companion: Need | None = None,
) -> ScalingDecision:
    """The prefill pool's decision from queued tokens, prompt throughput and p95 TTFT
    (against ``slo.ttft_p95_s``)."""
    latency = _Latency("p95 TTFT", view.load.mean("ttft_p95_s"), slo.ttft_p95_s)
    needs = [*prefill_needs(view.load, config), *([companion] if companion else [])]
    return _decide("prefill", view, config, epoch_seconds(now), needs, latency)


def decide_decode(
    view: PoolView, config: DecodeScalingConfig, slo: SLOConfig, now: Instant,
    companion: Need | None = None,
) -> ScalingDecision:
    """The decode pool's decision from running sequences, KV use, throughput and p95 ITL
    (against ``slo.itl_p95_s``)."""
    latency = _Latency("p95 ITL", view.load.mean("itl_p95_s"), slo.itl_p95_s)
    needs = [*decode_needs(view.load, config), *([companion] if companion else [])]
    return _decide("decode", view, config, epoch_seconds(now), needs, latency)


def mix_ratio(prefill: PoolLoad, decode: PoolLoad, config: AutoscalingConfig) -> float | None:
    """Prefill replicas per decode replica that the observed prompt/output mix calls for.

    None when either rate is below ``min_mix_tokens_per_s`` (an idle pool has no mix).
    """
    prompt_rate = prefill.total("prompt_tokens_per_s")
    output_rate = decode.total("output_tokens_per_s")
    if min(prompt_rate, output_rate) < max(config.min_mix_tokens_per_s, _EPS):
        return None
    p, d = config.prefill, config.decode
    prefill_demand = prompt_rate / (p.tokens_per_s_per_replica * p.target_utilisation)
    decode_demand = output_rate / (d.output_tokens_per_s_per_replica * d.target_utilisation)
    ratio = prefill_demand / decode_demand
    return min(config.max_prefill_per_decode, max(config.min_prefill_per_decode, ratio))


def decide_app(
    prefill: PoolView, decode: PoolView, config: AutoscalingConfig, slo: SLOConfig, now: Instant
) -> AppDecision:
    """Both pools sized together: a pool that scales up takes the other along, by the mix."""
    alone_prefill = decide_prefill(prefill, config.prefill, slo, now)
    alone_decode = decide_decode(decode, config.decode, slo, now)
    ratio = mix_ratio(prefill.load, decode.load, config) if config.couple_pools else None
    if ratio is None:
        return AppDecision(alone_prefill, alone_decode, None)
    keep = 1 - config.ratio_tolerance
    if alone_decode.direction == "up":
        companion = _companion("decode", alone_decode, ratio, keep)
        alone_prefill = decide_prefill(prefill, config.prefill, slo, now, companion)
    if alone_prefill.direction == "up" and alone_decode.direction != "up":
        companion = _companion("prefill", alone_prefill, 1 / ratio, keep)
        alone_decode = decide_decode(decode, config.decode, slo, now, companion)
    return AppDecision(alone_prefill, alone_decode, ratio)


# --- the rules shared by both pools ------------------------------------------------------


@dataclass(frozen=True)
class _Latency:
    name: str
    p95_s: float | None
    slo_s: float

    def need(self, current: int, max_factor: float) -> Need | None:
        """A relative step up when the SLO is broken; None when it is met or unknown."""
        if self.p95_s is None or self.p95_s <= self.slo_s:
            return None
        factor = min(self.p95_s / self.slo_s, max_factor)
        replicas = max(current + 1, current * factor)
        return Need("latency", replicas, f"{self.name} {self.p95_s:.2f} s",
                    f"{self.slo_s:.2f} s SLO", kind="level")

    def allows_down(self, hysteresis: float) -> bool:
        return self.p95_s is None or self.p95_s < (1 - hysteresis) * self.slo_s


@dataclass(frozen=True)
class _Proposal:
    desired: int
    why: str
    need: float
    down_wanted_since_s: float | None = None


def _decide(
    pool: Pool, view: PoolView, config: PoolScalingConfig, now_s: float,
    needs: Sequence[Need], latency: _Latency,
) -> ScalingDecision:
    bounds = view.bounds or config.bounds
    floor = standby_floor(config.standby, now_s)
    lower = _Lower.of(bounds, floor)
    proposal = _propose(view, config, now_s, needs, latency, lower)
    desired, reason = _bounded(proposal, view.current, bounds, lower)
    return ScalingDecision(
        pool=pool, current=view.current, desired=desired, reason=reason, floor=floor,
        state=_next_state(view, desired, now_s, proposal), need=proposal.need,
    )


def _propose(
    view: PoolView, config: PoolScalingConfig, now_s: float,
    needs: Sequence[Need], latency: _Latency, lower: _Lower,
) -> _Proposal:
    current = view.current
    slow = latency.need(current, config.max_upscale_factor)
    candidates = [*needs, *([slow] if slow else [])]
    best = _largest(candidates)
    wanted = math.ceil(best.replicas - _EPS)
    if wanted > current:
        wait = _up_wait(view, config, now_s)
        if wait is not None:
            return _Proposal(current, f"{best.why_up(current)}, but {wait}", best.replicas)
        # the highest landing of all needs: more load never lands lower, whichever wins
        landing = max(_landing(need, config.hysteresis) for need in candidates)
        step = max(current + 1, math.floor(current * config.max_upscale_factor + _EPS))
        factor, spare = f"x{config.max_upscale_factor:g}", f"{config.hysteresis:.0%} spare"
        if landing > step:
            capped = (f"step of at most {factor}" if wanted > step
                      else f"to {step}, its {spare} capped by the {factor} step")
            return _Proposal(step, f"{best.why_up(current)} ({capped})", best.replicas)
        landed = f" (to {landing}, {spare})" if landing > wanted else ""
        return _Proposal(landing, f"{best.why_up(current)}{landed}", best.replicas)
    if not view.load.reported:
        return _Proposal(current, "no metrics reported", best.replicas)
    # The companion only raises (see decide_app): the load to shrink to is the pool's own.
    own = [need for need in needs if need.signal != "ratio"]
    return _propose_down(view, config, now_s, _largest(own), latency, lower)


def _landing(need: Need, hysteresis: float) -> int:
    """Where a scale-up lands for ``need``: the level at which the scale-down rule holds
    (``hysteresis`` to spare), so the grown pool is not already in the band it would
    shrink from, and replicas that start for minutes while the load rises are not too
    few when they serve. Only the load needs, which the scale-down rule measures, get the
    spare: a latency need is a proportional step of its own, and a companion is a lower
    bound against starvation (the other pool's need before its spare, by the ratio),
    which this pool's own load needs raise with their spare once its load arrives."""
    if need.signal in ("latency", "ratio") or hysteresis <= 0:
        return math.ceil(need.replicas - _EPS)
    return math.ceil(need.replicas / (1 - hysteresis) - _EPS)


def _up_wait(view: PoolView, config: PoolScalingConfig, now_s: float) -> str | None:
    """Why a scale-up must wait for the last one to take effect; None: it need not."""
    state = view.state
    if view.running is not None and view.running < view.current:
        return f"{view.current - view.running} replica(s) still starting"
    if state.last_scale_up_s is None:
        return None
    if view.running is None:
        settled = state.last_scale_up_s
    else:  # None: they are all running as of this decision
        settled = state.ready_since_s if state.ready_since_s is not None else now_s
    left = config.upscale_cooldown_s - (now_s - settled)
    return f"the last scale-up is settling ({left:.0f} s left)" if left > _EPS else None


def _propose_down(
    view: PoolView, config: PoolScalingConfig, now_s: float, load: Need, latency: _Latency,
    lower: _Lower,
) -> _Proposal:
    current, state = view.current, view.state
    keep = math.ceil(load.replicas / (1 - config.hysteresis) - _EPS)
    if keep >= current:
        # keep > current: the load fits as it is, but not with the headroom; a scale-up
        # goes by the need without it, so the pool holds
        held = "" if keep == current else f", holding {current}"
        return _Proposal(current, f"{load.observed} needs {keep} replicas "
                                  f"with {config.hysteresis:.0%} headroom{held}", load.replicas)
    if not latency.allows_down(config.hysteresis):
        return _Proposal(current, f"{latency.name} {latency.p95_s:.2f} s within "
                                  f"{config.hysteresis:.0%} of {latency.slo_s:.2f} s SLO",
                         load.replicas)
    if lower.replicas >= current:  # no use waiting for a scale-down the bounds forbid
        return _Proposal(lower.replicas,
                         f"{lower.label} ({load.why_down(keep, config.hysteresis)})",
                         load.replicas)
    target = max(keep, current - config.max_downscale_step, lower.replicas)
    since = state.down_wanted_since_s if state.down_wanted_since_s is not None else now_s
    if now_s - since < config.downscale_delay_s:
        return _Proposal(current, f"down to {target} wanted for {now_s - since:.0f} s of "
                                  f"{config.downscale_delay_s:.0f} s delay", load.replicas, since)
    last_event = max((t for t in (state.last_scale_up_s, state.last_scale_down_s)
                      if t is not None), default=None)
    since_event = _since(last_event, now_s)
    if since_event is not None and since_event < config.downscale_cooldown_s:
        left = config.downscale_cooldown_s - since_event
        return _Proposal(current, f"down to {target} waits for cool-down ({left:.0f} s left)",
                         load.replicas, since)
    return _Proposal(target, load.why_down(target, config.hysteresis), load.replicas)


@dataclass(frozen=True)
class _Lower:
    """The least a pool may have now, and what sets it (bounds or standby floor)."""

    replicas: int
    label: str

    @classmethod
    def of(cls, bounds: ReplicaBounds, floor: int) -> _Lower:
        if floor > bounds.min_replicas:
            return cls(min(floor, bounds.max_replicas), f"standby floor {floor}")
        return cls(bounds.min_replicas, f"min_replicas {bounds.min_replicas}")


def _bounded(
    proposal: _Proposal, current: int, bounds: ReplicaBounds, lower: _Lower
) -> tuple[int, str]:
    if proposal.desired > bounds.max_replicas:
        desired = bounds.max_replicas
        why = f"{proposal.why} (capped at max_replicas {bounds.max_replicas})"
    elif proposal.desired < lower.replicas:
        desired, why = lower.replicas, f"{lower.label} ({proposal.why})"
    else:
        desired, why = proposal.desired, proposal.why
    return desired, f"{_direction(desired, current)}: {why}"


def _next_state(view: PoolView, desired: int, now_s: float, proposal: _Proposal) -> PoolState:
    state, current = view.state, view.current
    if desired > current:
        return PoolState(now_s, state.last_scale_down_s, None, None)
    ready = state.ready_since_s
    if ready is None and view.running is not None and view.running >= current:
        ready = now_s
    if desired < current:
        return PoolState(state.last_scale_up_s, now_s, None, ready)
    return PoolState(state.last_scale_up_s, state.last_scale_down_s,
                     proposal.down_wanted_since_s, ready)


def _companion(other: str, decision: ScalingDecision, per_other: float, keep: float) -> Need:
    # What the other pool really needs, not a rounding jump (1.01 needed -> 2 replicas), and
    # not more than it scales to now (a backlog's need is not a flow the other pool will see).
    base = min(decision.need, decision.desired)
    replicas = base * per_other * keep
    return Need("ratio", replicas,
                f"{other} scaling to {base:.1f} x {per_other:.2f} (token mix) x {keep:.2f} "
                f"= {replicas:.1f}", "", kind="replicas")


def _largest(needs: Sequence[Need]) -> Need:
    return max(needs, key=lambda need: need.replicas)


def _since(then: float | None, now_s: float) -> float | None:
    return None if then is None else now_s - then


def _direction(desired: int, current: int) -> Direction:
    return "up" if desired > current else "down" if desired < current else "hold"


def _qty(value: float) -> str:
    """41234 -> '41k': short enough for a log line, exact enough to act on."""
    if abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.0f}k"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}" if value == int(value) or abs(value) >= 10 else f"{value:.1f}"
