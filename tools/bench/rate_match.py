"""Rate-matched comparison (pure: judging, searching and tabulating, no I/O): the highest
rate at which each setup still meets the SLO, and its goodput per engine core.

``pdserve bench compare --trace`` replays one trace slice against each setup at rates this
module chooses: ``RateSearch`` brackets the rate where the SLO stops holding (doubling
while it holds, halving while it fails) and then bisects the bracket; ``HoldRule`` judges
one probe's summary (tools/bench/stats.py ``summarise``); ``engine_cores`` counts the
cores a setup's engines run on; ``matched_rows`` and ``matched_table`` set the setups side
by side, each one's goodput per engine core against the first's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.slo import SLOConfig

# The search's defaults (``pdserve bench compare``'s flags read them from here).
DEFAULT_START_RATE = 1.0
DEFAULT_MAX_PROBES = 6
DEFAULT_TOLERANCE = 1.2  # done when the bracket's ends are within this factor
# The widest rates a search goes to: far beyond what one machine serves either way, so
# only a setup that never holds (or never fails) reaches them.
MIN_RATE = 1e-3
MAX_RATE = 1e3

History = Sequence[tuple[float, bool]]  # each probe: (offered rate, req/s; SLO held)


# ---- the SLO's judgement of one probe ------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """Whether one probe held the SLO, and each bound it broke, in words."""

    held: bool
    broken: tuple[str, ...] = ()


@dataclass(frozen=True)
class HoldRule:
    """When "the SLO holds" at a rate: the probe's p95 TTFT and p95 ITL (every gap
    between tokens of every answered request, ``summarise``'s ``itl_s``) are within the
    config's ``slo.ttft_p95_s`` and ``slo.itl_p95_s``, and at least ``min_answered`` of
    its requests were answered (1.0: every one, no errors).

    Chosen over a share of requests meeting per-request bounds (the goodput count)
    because these are the bounds the pools are scaled for (cluster/slo.py): the rate
    found is the one the cluster's own objectives allow. A probe without inter-token gaps
    (every answer one token long) has no ITL to break."""

    ttft_p95_s: float
    itl_p95_s: float
    min_answered: float = 1.0

    def __post_init__(self) -> None:
        if not (self.ttft_p95_s > 0 and self.itl_p95_s > 0):
            raise ValueError("the TTFT and ITL bounds must be > 0")
        if not 0 < self.min_answered <= 1:
            raise ValueError(f"min_answered is a share in (0, 1], not {self.min_answered}")

    @classmethod
    def from_config(cls, slo: SLOConfig, ttft_p95_s: float | None = None,
                    itl_p95_s: float | None = None, min_answered: float = 1.0) -> HoldRule:
        """The config's ``slo`` bounds, each replaced where given (CLI flags)."""
        return cls(slo.ttft_p95_s if ttft_p95_s is None else ttft_p95_s,
                   slo.itl_p95_s if itl_p95_s is None else itl_p95_s, min_answered)

    def judge(self, summary: dict) -> Verdict:
        """The verdict on one ``summarise`` dict (a probe's "all" requests)."""
        broken = []
        requests, answered = summary["requests"], summary["completed"]
        if requests == 0 or answered < self.min_answered * requests:
            errors = ", ".join(f"{n} {kind}" for kind, n in sorted(summary["errors"].items()))
            broken.append(f"{answered}/{requests} answered" + (f" ({errors})" if errors else ""))
        ttft, itl = summary["ttft_s"]["p95"], summary["itl_s"]["p95"]
        if ttft is None or ttft > self.ttft_p95_s:
            broken.append(f"TTFT p95 {_ms(ttft)} > {_ms(self.ttft_p95_s)}")
        if itl is not None and itl > self.itl_p95_s:
            broken.append(f"ITL p95 {_ms(itl)} > {_ms(self.itl_p95_s)}")
        return Verdict(not broken, tuple(broken))

    def describe(self) -> str:
        answered = ("every request answered" if self.min_answered == 1
                    else f">= {self.min_answered:.0%} answered")
        return (f"p95 TTFT <= {_ms(self.ttft_p95_s)}, p95 ITL <= {_ms(self.itl_p95_s)}, "
                f"{answered}")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def probe_line(setup: str, rate: float, summary: dict, verdict: Verdict) -> str:
    """One probe as a line: its rate, p95 TTFT and ITL, answered, goodput and verdict."""
    outcome = "held" if verdict.held else f"failed: {'; '.join(verdict.broken)}"
    return (f"{setup} @ {rate:.3g} req/s: TTFT p95 {_ms(summary['ttft_s']['p95'])}, "
            f"ITL p95 {_ms(summary['itl_s']['p95'])}, "
            f"{summary['completed']}/{summary['requests']} answered, "
            f"goodput {summary['goodput_requests_per_s']:.3g} req/s: {outcome}")


# ---- the search ----------------------------------------------------------------------

@dataclass(frozen=True)
class RateSearch:
    """Bracket, then bisect: the highest rate at which the SLO holds, to within
    ``tolerance`` (a factor), in at most ``max_probes`` probes.

    From ``start``, double while the SLO holds (up to ``max_rate``) and halve while it
    fails (down to ``min_rate``); once a held rate lies below a failed one, probe their
    geometric mean (rates are scales: the middle of 1 and 4 is 2), until the lowest failed
    rate above the highest held one is within ``tolerance`` of it. A fail below the
    highest held rate (noise: the SLO need not fail monotonically) is not a bracket's
    end, so each probe is a new rate and the search ends within its budget."""

    start: float = DEFAULT_START_RATE
    max_probes: int = DEFAULT_MAX_PROBES
    tolerance: float = DEFAULT_TOLERANCE
    min_rate: float = MIN_RATE
    max_rate: float = MAX_RATE

    def __post_init__(self) -> None:
        if not 0 < self.min_rate <= self.start <= self.max_rate:
            raise ValueError(f"the start rate must lie in [{self.min_rate:g}, "
                             f"{self.max_rate:g}] req/s, not {self.start:g}")
        if self.max_probes < 1:
            raise ValueError(f"max_probes must be at least 1, not {self.max_probes}")
        if not self.tolerance > 1:
            raise ValueError(f"tolerance is a factor > 1, not {self.tolerance}")

    def next_rate(self, history: History) -> float | None:
        """The rate to probe next, given every probe so far; None when done."""
        if len(history) >= self.max_probes:
            return None
        if not history:
            return self.start
        low, high = bracket(history)
        if low is None:   # nothing held yet: halve below the lowest failure
            return None if high <= self.min_rate else max(high / 2, self.min_rate)
        if high is None:  # nothing failed above the best yet: double it
            return None if low >= self.max_rate else min(low * 2, self.max_rate)
        return None if high <= low * self.tolerance else math.sqrt(low * high)


def bracket(history: History) -> tuple[float | None, float | None]:
    """(the highest rate that held, the lowest rate above it that failed); either None
    where there is none."""
    held = [rate for rate, ok in history if ok]
    low = max(held) if held else None
    failed = [rate for rate, ok in history if not ok and (low is None or rate > low)]
    return low, (min(failed) if failed else None)


def best(history: History) -> float | None:
    """The highest rate at which the SLO held (None: it never did)."""
    return bracket(history)[0]


def shown_rate(history: History) -> float | None:
    """The rate whose probe stands for a setup in a plot over time: its highest rate
    that held, else (none held) its lowest probed; None before any probe."""
    held = best(history)
    return held if held is not None else min((rate for rate, _ in history), default=None)


# ---- engine cores --------------------------------------------------------------------

@dataclass(frozen=True)
class EnginePool:
    """Engines of one setup: their CPU binding (``VLLM_CPU_OMP_THREADS_BIND``; None: not
    bound), how many replicas, and the CPUs each reserves (Ray's ``num_cpus``)."""

    bind: str | None
    replicas: int = 1
    num_cpus: float = 1.0


def bound_cores(bind: str | None) -> frozenset[int] | None:
    """The cores a ``VLLM_CPU_OMP_THREADS_BIND`` value names ("0", "0-3", "0,2",
    "0-3|4-7": one list per tensor-parallel rank); None for "auto", "nobind", nothing, or
    anything else it cannot read."""
    if not bind:
        return None
    cores: set[int] = set()
    for part in bind.replace("|", ",").split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return None
        cores.update(range(int(first), int(last if dash else first) + 1))
    return frozenset(cores) or None


def engine_cores(pools: Sequence[EnginePool]) -> tuple[float, str]:
    """The cores a setup's engines run on, and how they were counted: the distinct cores
    of the pools' bindings when every pool is bound (replicas bound alike share their
    cores, and a colocated engine bound to two pools' cores counts those), else the CPUs
    the replicas reserve (replicas x num_cpus: what they stand for on a machine)."""
    binds = [bound_cores(pool.bind) for pool in pools]
    if pools and all(cores is not None for cores in binds):
        return float(len(frozenset().union(*binds))), "bound"
    return float(sum(pool.replicas * pool.num_cpus for pool in pools)), "reserved"


# ---- the side-by-side table ----------------------------------------------------------

@dataclass(frozen=True)
class Matched:
    """One setup's search result: the rate it matched (the highest that held, None if
    none did), the lowest failed rate above it, the goodput measured at the matched rate
    (req/s meeting the per-request SLO) and its engine cores."""

    setup: str
    rate: float | None
    ceiling: float | None
    goodput: float | None
    engine_cores: float


def per_core(value: float | None, cores: float) -> float | None:
    """``value`` per engine core (None without a value or cores)."""
    return None if value is None or cores <= 0 else value / cores


def matched_rows(results: Sequence[Matched]) -> list[dict]:
    """Each setup's figures, JSON-ready: matched rate and goodput, each per engine core,
    and goodput per core against the first setup's (None where it has none)."""
    rows = []
    for result in results:
        goodput_per_core = per_core(result.goodput, result.engine_cores)
        rows.append({"setup": result.setup, "rate": result.rate, "ceiling": result.ceiling,
                     "goodput": result.goodput, "engine_cores": result.engine_cores,
                     "rate_per_core": per_core(result.rate, result.engine_cores),
                     "goodput_per_core": goodput_per_core})
    first = rows[0]["goodput_per_core"] if rows else None
    for row in rows:
        value = row["goodput_per_core"]
        row["vs_first"] = None if value is None or not first else value / first
    return rows


def matched_table(title: str, rows: Sequence[dict]) -> str:
    """``matched_rows`` as text: one line per setup, ratios to the first (>1 is better)."""
    first = rows[0]["setup"] if rows else "-"
    lines = [title,
             f"  {'setup':<22}{'matched req/s':>14}{'failed at':>11}{'goodput':>9}"
             f"{'cores':>7}{'goodput/core':>14}{f'vs {first}':>14}"]
    for row in rows:
        cells = [_num(row["rate"]), _num(row["ceiling"]), _num(row["goodput"]),
                 f"{row['engine_cores']:g}", _num(row["goodput_per_core"]),
                 "-" if row["vs_first"] is None else f"{row['vs_first']:.2f}x"]
        lines.append(f"  {row['setup']:<22}{cells[0]:>14}{cells[1]:>11}{cells[2]:>9}"
                     f"{cells[3]:>7}{cells[4]:>14}{cells[5]:>14}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
