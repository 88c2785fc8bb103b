"""The planner's traffic from a recorded trace (pure: seeded, no I/O): a public request
trace's lengths and burstiness (tools/bench/trace.py parses it) in place of the drawn
reference workload's lognormals and Poisson arrivals.

Lengths: the trace's own (prompt, output) pairs, fitted to the planner's
``max_model_len`` (``fit_to_window``'s "clip": the prompt shortened, counted), each request
drawing one pair uniformly, so the joint distribution (a long prompt's short answer, say)
and its tail are the trace's.

Arrivals: a gamma renewal process with the trace's squared coefficient of variation of
inter-arrival times (CV^2; 1 is Poisson), at whatever rate the planner asks for. Why
this and not the trace's own arrivals time-scaled to that rate: a renewal process's
CV^2 is also the index of dispersion of its counts over any window of many arrivals,
whatever the rate, so the simulated slice (a share of the peak) gets the burstiness the
whole fleet would, the same at any ``--slice-replicas``, as merging independent users
like the trace's would give. Time-scaling instead squeezes the trace's hour into the
simulated seconds by a factor set by the slice's share (150x to 1,000x for Azure's
conversation trace at the reference peak), turning its minute-long swings of rate (the
day's curve, which the reference peak and ``--peak-to-mean`` already describe) into
bursts a second long, and a trace of 19,000 requests covers only ~20 simulated seconds
before it must loop. What the renewal
process drops is the correlation between successive gaps, the trace's slower swings:
``peak_to_mean`` (of its 10 s counts) reports them beside the CV^2. docs/planning.md,
"On a real trace".
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields

from tools.bench.trace import TraceRequest, fit_to_window, mean_rate
from tools.bench.workload import WorkloadSpec

PEAK_WINDOW_S = 10.0   # the window whose counts' peak over mean is reported


@dataclass(frozen=True)
class TraceTraffic:
    """A trace as the planner's traffic: its requests' lengths (fitted to
    ``max_model_len``, ``clipped`` of them shortened) and its arrivals' burstiness."""

    name: str
    lengths: tuple[tuple[int, int], ...]   # each request's (prompt, output) tokens
    max_model_len: int
    clipped: int
    interarrival_cv2: float
    peak_to_mean: float | None             # of its counts per PEAK_WINDOW_S; None: shorter
    recorded_rate: float | None            # requests/s as recorded

    @property
    def requests(self) -> int:
        return len(self.lengths)

    def mean_lengths(self) -> tuple[float, float]:
        """Mean prompt and output tokens (after fitting)."""
        return (statistics.fmean(p for p, _ in self.lengths),
                statistics.fmean(o for _, o in self.lengths))

    def draw_lengths(self, rng: random.Random) -> tuple[int, int]:
        """One request's (prompt, output) tokens: a recorded pair, uniformly."""
        return rng.choice(self.lengths)

    def arrival_times(self, rate: float, count: int, rng: random.Random) -> list[float]:
        """``count`` arrivals at ``rate`` with the trace's burstiness (``gamma_arrivals``)."""
        return gamma_arrivals(rate, self.interarrival_cv2, count, rng)


def traffic_from(requests: Sequence[TraceRequest], name: str,
                 max_model_len: int) -> TraceTraffic:
    """The traffic of a parsed trace (``read_trace``), its lengths clipped to fit
    ``max_model_len``. Raises ValueError for a trace with no rate to measure."""
    arrivals = [r.arrival_s for r in requests]
    cv2 = interarrival_cv2(arrivals)
    fitted, report = fit_to_window(requests, max_model_len, "clip")
    return TraceTraffic(name, tuple((r.prompt_tokens, r.output_tokens) for r in fitted),
                        max_model_len, report.clipped, cv2,
                        peak_to_mean(arrivals, PEAK_WINDOW_S), mean_rate(requests))


def interarrival_cv2(arrivals: Sequence[float]) -> float:
    """The squared coefficient of variation of the gaps between sorted ``arrivals``
    (simultaneous arrivals count as gaps of 0). Raises ValueError with no positive mean."""
    ordered = sorted(arrivals)
    gaps = [later - earlier for earlier, later in itertools.pairwise(ordered)]
    mean = statistics.fmean(gaps) if gaps else 0.0
    if mean <= 0:
        raise ValueError("a trace needs two or more arrivals spread over time to measure "
                         "its burstiness")
    return statistics.pvariance(gaps, mu=mean) / mean**2


def peak_to_mean(arrivals: Sequence[float], window_s: float) -> float | None:
    """The largest count of arrivals in a whole window of ``window_s`` (from the first
    arrival on) over the mean count; None when the arrivals span no whole window."""
    start = min(arrivals)
    windows = int((max(arrivals) - start) // window_s)
    if windows < 1:
        return None
    counts = [0] * windows
    for at in arrivals:
        index = int((at - start) // window_s)
        if index < windows:        # the last, partial window would read low
            counts[index] += 1
    return max(counts) / statistics.fmean(counts)


def gamma_arrivals(rate: float, cv2: float, count: int, rng: random.Random) -> list[float]:
    """``count`` arrival times of a renewal process whose gaps are gamma distributed
    with mean ``1 / rate`` and squared coefficient of variation ``cv2`` (shape
    ``1 / cv2``; 1 is Poisson, 0 evenly spaced), then stretched so that their mean rate
    is ``rate`` exactly: at a CV^2 of 170 (Azure's code trace) even 40,000 gaps' mean
    strays by 7%, which would size for another rate. Stretching keeps the CV^2."""
    if not rate > 0 or cv2 < 0 or count < 0:
        raise ValueError(f"need rate > 0, cv2 >= 0, count >= 0: not {rate}, {cv2}, {count}")
    if cv2 == 0:
        gaps = [1 / rate] * count
    else:
        shape = 1 / cv2
        gaps = [rng.gammavariate(shape, 1 / (rate * shape)) for _ in range(count)]
    total = math.fsum(gaps)
    stretch = count / rate / total if total > 0 else 1.0
    times, now = [], 0.0
    for gap in gaps:
        now += gap * stretch
        times.append(now)
    return times


@dataclass(frozen=True)
class TraceWorkloadSpec(WorkloadSpec):
    """A ``WorkloadSpec`` whose requests' lengths and arrivals come from ``trace``
    (tools/planner/workload.py draws them); its other fields (rate, seed, shared heads,
    scale, max_model_len) mean what they do for the drawn workloads. One turn per
    request: a trace's prompts already carry their conversations' histories."""

    trace: TraceTraffic | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.trace is None:
            raise ValueError("a TraceWorkloadSpec needs its trace")
        if self.trace.max_model_len != self.max_model_len:
            raise ValueError(f"the trace was fitted to {self.trace.max_model_len} tokens, "
                             f"the workload's max_model_len is {self.max_model_len}")
        if self.turns != 1:
            raise ValueError("a trace's requests are whole turns, their histories in their "
                             f"prompts: plan it with one turn, not {self.turns}")


def with_trace(spec: WorkloadSpec, requests: Sequence[TraceRequest],
               name: str) -> TraceWorkloadSpec:
    """``spec`` with the lengths (fitted to its ``max_model_len``) and the burstiness of
    the parsed trace ``requests``, named ``name``."""
    own = {field.name: getattr(spec, field.name) for field in fields(WorkloadSpec)}
    return TraceWorkloadSpec(**own, trace=traffic_from(requests, name, spec.max_model_len))


def trace_of(spec: WorkloadSpec) -> TraceTraffic | None:
    """The trace ``spec`` draws from, or None for a drawn workload."""
    return spec.trace if isinstance(spec, TraceWorkloadSpec) else None
