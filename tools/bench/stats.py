"""What a benchmark run measured, summarised (pure)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from cluster.percentile import percentile
from cluster.slo import SLOConfig


@dataclass
class RequestRecord:
    """One request as the load generator saw it (times in seconds since the run start)."""

    index: int
    kind: str
    prompt_tokens: int
    sent_at: float
    status: int | None = None
    error: str | None = None        # kind of failure, e.g. "http_503", "timeout"
    first_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    output_tokens: int = 0
    turn: int = 1                   # its place in its conversation (1: a first message)
    follows: int | None = None      # the request of the turn before it
    prefix_group: int = -1          # the shared head it starts with (-1: none)

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_token_at is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def e2e(self) -> float | None:
        return self.token_times[-1] - self.sent_at if self.token_times else None

    @property
    def inter_token_gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        gaps = self.inter_token_gaps
        return sum(gaps) / len(gaps) if gaps else None


def _percentiles(values: list[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 95, 99)}


@dataclass(frozen=True)
class SLO:
    """What a request must meet to count as goodput: its TTFT and its mean time per output
    token. Built from a config's ``slo`` section (:meth:`from_config`)."""

    ttft_s: float
    tpot_s: float

    @classmethod
    def from_config(cls, slo: SLOConfig, ttft_s: float | None = None,
                    tpot_s: float | None = None) -> SLO:
        """``slo.ttft_p95_s`` and ``slo.tpot_s``, each replaced where given (CLI flags)."""
        return cls(ttft_s=slo.ttft_p95_s if ttft_s is None else ttft_s,
                   tpot_s=slo.tpot_s if tpot_s is None else tpot_s)


def summarise(records: list[RequestRecord], duration_s: float, slo: SLO,
              kind: str | None = None, later_turns: bool = False) -> dict:
    """Latency percentiles, throughput, goodput and errors; ``kind`` filters short/long,
    ``later_turns`` keeps only the turns after a conversation's first."""
    chosen = [r for r in records if (kind is None or r.kind == kind)
              and (not later_turns or r.turn > 1)]
    ok = [r for r in chosen if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    itls = [gap for r in ok for gap in r.inter_token_gaps]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    good = [r for r in ok if r.ttft <= slo.ttft_s and (r.tpot is None or r.tpot <= slo.tpot_s)]
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(chosen),
        "completed": len(ok),
        "errors": dict(Counter(r.error for r in chosen if r.error)),
        "ttft_s": _percentiles(ttfts),
        "itl_s": _percentiles(itls),
        "e2e_s": _percentiles(e2es),
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens_per_s": output_tokens / duration_s if duration_s > 0 else 0.0,
        "requests_per_s": len(ok) / duration_s if duration_s > 0 else 0.0,
        "goodput_requests_per_s": len(good) / duration_s if duration_s > 0 else 0.0,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
    }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


@dataclass(frozen=True)
class TimelineBin:
    """One window of a run, by when its requests were sent: how fast they arrived, and
    the p95 TTFT and p95 inter-token gap of those of them that were answered (None:
    none was, or none streamed two tokens)."""

    start_s: float
    arrivals_per_s: float
    ttft_p95_s: float | None
    itl_p95_s: float | None


def timeline(records: list[RequestRecord], window_s: float) -> list[TimelineBin]:
    """``records`` in consecutive windows of ``window_s`` seconds from the first send to
    the last: a trace replay's arrival rate beside the latencies it met, over time."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, not {window_s}")
    if not records:
        return []
    first = min(r.sent_at for r in records)
    count = int((max(r.sent_at for r in records) - first) // window_s) + 1
    windows: list[list[RequestRecord]] = [[] for _ in range(count)]
    for record in records:
        windows[int((record.sent_at - first) // window_s)].append(record)
    return [TimelineBin(first + i * window_s, len(sent) / window_s,
                        percentile([r.ttft for r in sent if r.ok], 95),
                        percentile([g for r in sent if r.ok for g in r.inter_token_gaps], 95))
            for i, sent in enumerate(windows)]


def timeline_window(records: list[RequestRecord], windows: int = 30) -> float:
    """A timeline's window, whole seconds: about ``windows`` of them over the span of the
    records' sends, at least 1 s."""
    if not records:
        return 1.0
    span = max(r.sent_at for r in records) - min(r.sent_at for r in records)
    return float(max(1, round(span / windows)))
