"""Replay a recorded day of load through the pool policies with a fake clock.

``data/load_day.csv`` (made by ``tools/experiments/make_load_day.py``) holds one row a minute:
requests/s and mean prompt/output tokens of a chat product's Wednesday in Berlin. A small
deterministic plant turns it into what replicas would report, given how many replicas are
running (new ones start three minutes after they are asked for):

* prefill: an M/M/1-like queue per replica (utilisation u, wait ~ 2 x service x u/(1-u)),
  plus a fluid backlog when demand exceeds capacity;
* decode: inter-token latency grows with the batch (ITL = 20 ms + 0.2 ms per running
  sequence), running sequences follow Little's law, KV use follows the tokens they hold.

The policy sees exactly what the Serve shell would give it: the current target, per-replica
reports of running replicas, and its own state from the previous decision.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest

from cluster.autoscaling.config import (
    AutoscalingConfig,
    DecodeScalingConfig,
    PrefillScalingConfig,
    StandbySchedule,
    StandbyWindow,
)
from cluster.autoscaling.policy import AppDecision, PoolLoad, PoolState, PoolView, decide_app
from cluster.slo import SLOConfig

DATA = Path(__file__).parent / "data" / "load_day.csv"

STARTUP_S = 180                 # a new replica serves three minutes after it is asked for
PREFILL_TOKENS_PER_S = 16000    # what one prefill replica really prefills
ITL_BASE_S, ITL_PER_SEQ_S = 0.020, 0.0002
MAX_SEQS = 256                  # max_num_seqs of a decode engine
KV_TOKENS = 131072              # KV-cache capacity of a decode replica, in tokens


def _schedule(prefill_floor: int, decode_floor: int) -> tuple[StandbySchedule, StandbySchedule]:
    def one(floor: int) -> StandbySchedule:
        return StandbySchedule(timezone="Europe/Berlin", ramp_minutes=30, windows=[
            StandbyWindow(start="17:00", end="23:00", min_replicas=floor)])
    return one(prefill_floor), one(decode_floor)


PREFILL_STANDBY, DECODE_STANDBY = _schedule(prefill_floor=8, decode_floor=24)
CONFIG = AutoscalingConfig(
    prefill=PrefillScalingConfig(
        min_replicas=1, max_replicas=24, tokens_per_s_per_replica=PREFILL_TOKENS_PER_S,
        target_queued_tokens_per_replica=8000, standby=PREFILL_STANDBY),
    decode=DecodeScalingConfig(
        min_replicas=2, max_replicas=40, output_tokens_per_s_per_replica=2800,
        target_utilisation=0.8, target_running_seqs_per_replica=96, standby=DECODE_STANDBY),
)
SLO = SLOConfig()  # the defaults: p95 TTFT 0.5 s, p95 ITL 0.05 s


@dataclass(frozen=True)
class Minute:
    at: datetime
    requests_per_s: float
    prompt_tokens: float
    output_tokens: float

    @property
    def hhmm(self) -> str:
        return self.at.strftime("%H:%M")


def load_day() -> list[Minute]:
    with DATA.open() as file:
        return [Minute(datetime.fromisoformat(row["time"]), float(row["requests_per_s"]),
                       float(row["prompt_tokens"]), float(row["output_tokens"]))
                for row in csv.DictReader(file)]


@dataclass
class Replicas:
    """A pool's replicas: downs are immediate, ups serve after STARTUP_S."""

    running: int
    pending: list[tuple[float, int]] = field(default_factory=list)

    @property
    def target(self) -> int:
        return self.running + sum(count for _, count in self.pending)

    def scale_to(self, target: int, now: float) -> None:
        if target > self.target:
            self.pending.append((now + STARTUP_S, target - self.target))
        while self.target > target:
            if self.pending:
                ready, count = self.pending.pop()
                if count > self.target - target:
                    self.pending.append((ready, count - (self.target - target)))
            else:
                self.running = target

    def advance(self, now: float) -> None:
        self.running += sum(count for ready, count in self.pending if ready <= now)
        self.pending = [(ready, count) for ready, count in self.pending if ready > now]


@dataclass
class Plant:
    prefill: Replicas
    decode: Replicas
    backlog_tokens: float = 0.0

    def prefill_load(self, minute: Minute) -> tuple[PoolLoad, float]:
        """What prefill replicas report, and the p95 TTFT they report."""
        n = self.prefill.running
        demand = minute.requests_per_s * minute.prompt_tokens
        capacity = n * PREFILL_TOKENS_PER_S
        self.backlog_tokens = max(0.0, self.backlog_tokens + (demand - capacity) * 60)
        u = min(demand / capacity, 0.95) if capacity else 0.95
        service = minute.prompt_tokens / PREFILL_TOKENS_PER_S
        ttft = service * (1 + 2 * u / (1 - u)) + (self.backlog_tokens / capacity if n else 0)
        in_system = n * u / (1 - u) * minute.prompt_tokens + self.backlog_tokens
        served = min(demand, capacity)
        load = PoolLoad.spread(n, queued_prefill_tokens=in_system, ttft_p95_s=ttft,
                               prompt_tokens_per_s=served) if n else PoolLoad()
        return load, ttft

    def decode_load(self, minute: Minute) -> tuple[PoolLoad, float]:
        """What decode replicas report, and the p95 ITL they report."""
        n = self.decode.running
        arrivals = minute.requests_per_s * minute.output_tokens   # seq-seconds per ITL second
        headroom = 1 - arrivals * ITL_PER_SEQ_S / n if n else 0
        running = arrivals * ITL_BASE_S / headroom if headroom > 0 else math.inf
        running = min(running, n * MAX_SEQS)
        itl = ITL_BASE_S + ITL_PER_SEQ_S * running / n if n else math.inf
        kv = min(1.0, running / n * (minute.prompt_tokens + minute.output_tokens / 2)
                 / KV_TOKENS) if n else 0.0
        output = min(minute.requests_per_s * minute.output_tokens, running / itl) if n else 0
        load = PoolLoad.spread(n, running_seqs=running, kv_usage=kv, itl_p95_s=1.2 * itl,
                               output_tokens_per_s=output) if n else PoolLoad()
        return load, 1.2 * itl


@dataclass(frozen=True)
class Tick:
    minute: Minute
    decision: AppDecision
    ttft_p95_s: float
    itl_p95_s: float
    prefill_running: int
    decode_running: int


def replay(config: AutoscalingConfig = CONFIG) -> list[Tick]:
    """The day, one decision a minute, each applied to the plant."""
    plant = Plant(Replicas(config.prefill.min_replicas), Replicas(config.decode.min_replicas))
    prefill_state = decode_state = PoolState()
    ticks = []
    for minute in load_day():
        now = minute.at.timestamp()
        plant.prefill.advance(now)
        plant.decode.advance(now)
        prefill_load, ttft = plant.prefill_load(minute)
        decode_load, itl = plant.decode_load(minute)
        decision = decide_app(
            PoolView(plant.prefill.target, prefill_load, prefill_state,
                     running=plant.prefill.running),
            PoolView(plant.decode.target, decode_load, decode_state,
                     running=plant.decode.running),
            config, SLO, minute.at)
        plant.prefill.scale_to(decision.prefill.desired, now)
        plant.decode.scale_to(decision.decode.desired, now)
        prefill_state, decode_state = decision.prefill.state, decision.decode.state
        ticks.append(Tick(minute, decision, ttft, itl, plant.prefill.running,
                          plant.decode.running))
    return ticks


@pytest.fixture(scope="module")
def day() -> list[Tick]:
    return replay()


def _at(ticks: list[Tick], hhmm: str) -> Tick:
    return next(t for t in ticks if t.minute.hhmm == hhmm)


def _between(ticks: list[Tick], start: str, end: str) -> list[Tick]:
    return [t for t in ticks if start <= t.minute.hhmm < end]


def test_the_recorded_day_is_what_the_scenario_says():
    minutes = load_day()
    assert len(minutes) == 24 * 60 and DATA.stat().st_size < 200_000
    assert all(b.at.timestamp() - a.at.timestamp() == 60 for a, b in pairwise(minutes))

    def mean_rps(start: str, end: str) -> float:
        chosen = [m.requests_per_s for m in minutes if start <= m.hhmm < end]
        return sum(chosen) / len(chosen)

    assert mean_rps("19:00", "22:00") > 3 * mean_rps("13:00", "16:00")   # the evening peak
    assert mean_rps("11:00", "11:20") > 2.5 * mean_rps("10:40", "11:00")  # the spike
    summaries = [m for m in minutes if "07:00" <= m.hhmm < "09:30"]
    assert all(m.prompt_tokens > 1400 and m.output_tokens < 120 for m in summaries)


def test_replicas_stay_within_bounds_every_minute(day):
    for tick in day:
        for decision, pool in ((tick.decision.prefill, CONFIG.prefill),
                               (tick.decision.decode, CONFIG.decode)):
            assert pool.min_replicas <= decision.desired <= pool.max_replicas, tick.minute.hhmm
            assert decision.desired >= min(decision.floor, pool.max_replicas)


def test_standby_floor_is_ramped_in_ahead_of_the_window_and_held_during_it(day):
    # Without the schedule the pools would be much smaller before 17:00: the floor, not
    # the load, is what warms the capacity.
    bare = replay(CONFIG.model_copy(update={
        "prefill": CONFIG.prefill.model_copy(update={"standby": None}),
        "decode": CONFIG.decode.model_copy(update={"standby": None})}))
    assert _at(bare, "16:50").decision.prefill.desired <= 4
    assert _at(bare, "16:50").decision.decode.desired <= 12

    assert _at(day, "16:00").decision.prefill.floor == 0            # ramp not begun
    halfway = _at(day, "16:45").decision
    assert (halfway.prefill.floor, halfway.decode.floor) == (4, 12)  # 8 / 24 half ramped
    assert halfway.prefill.desired >= 4 and halfway.decode.desired >= 12
    # Replicas asked for at the end of the ramp are serving when the window opens.
    assert _at(day, "17:00").prefill_running >= 7
    assert _at(day, "17:00").decode_running >= 21
    for tick in _between(day, "17:00", "23:00"):
        assert tick.decision.prefill.desired >= 8, tick.minute.hhmm
        assert tick.decision.decode.desired >= 24, tick.minute.hhmm
    assert _at(day, "23:59").decision.prefill.floor == 0


def test_prefill_scales_up_within_two_minutes_of_a_ttft_breach(day):
    slo = SLO.ttft_p95_s
    breaches = [i for i, t in enumerate(day)
                if t.ttft_p95_s > slo and (i == 0 or day[i - 1].ttft_p95_s <= slo)]
    assert len(breaches) >= 2, "the replay must contain TTFT breaches to test this"
    for i in breaches:
        # More capacity than was serving when the breach began is on its way (replicas
        # still starting from an earlier decision count).
        serving = day[i - 1].prefill_running if i else CONFIG.prefill.min_replicas
        assert any(t.decision.prefill.desired > serving for t in day[i:i + 3]), (
            day[i].minute.hhmm, [t.decision.prefill.reason for t in day[i:i + 3]])
    spike = day.index(_at(day, "11:00"))
    assert spike in breaches
    assert day[spike].decision.prefill.direction == "up"
    assert "queued prefill tokens" in day[spike].decision.prefill.reason


def test_the_spike_is_absorbed_within_fifteen_minutes(day):
    spike = _between(day, "11:00", "11:20")
    assert max(t.ttft_p95_s for t in spike) > SLO.ttft_p95_s
    assert all(t.ttft_p95_s <= SLO.ttft_p95_s
               for t in _between(day, "11:15", "11:20"))


def test_scale_downs_respect_the_cool_down(day):
    for pool in ("prefill", "decode"):
        config = getattr(CONFIG, pool)
        last_event: float | None = None
        downs = 0
        for tick in day:
            decision = getattr(tick.decision, pool)
            now = tick.minute.at.timestamp()
            if decision.direction == "down":
                downs += 1
                assert last_event is None or now - last_event >= config.downscale_cooldown_s, (
                    pool, tick.minute.hhmm)
                assert decision.current - decision.desired <= config.max_downscale_step
            if decision.direction != "hold":
                last_event = now
        assert downs >= 3, f"{pool} never scaled down: nothing was tested"


def test_prefill_to_decode_ratio_follows_the_token_mix(day):
    def ratio(ticks: list[Tick]) -> float:
        return (sum(t.decision.prefill.desired for t in ticks)
                / sum(t.decision.decode.desired for t in ticks))

    summaries = ratio(_between(day, "08:00", "09:30"))   # 1600 prompt / 100 output tokens
    chat = ratio(_between(day, "13:00", "16:00"))        # 500 / 300
    assert summaries > 2 * chat, (summaries, chat)
    measured = [t.decision.prefill_per_decode for t in _between(day, "08:00", "09:30")]
    assert all(r is not None and r > 2 for r in measured)


def test_replay_is_deterministic(day):
    again = replay()
    assert [(t.decision.prefill.desired, t.decision.decode.desired) for t in again] == [
        (t.decision.prefill.desired, t.decision.decode.desired) for t in day]
