"""What a simulation measured (pure): each request's outcome and the cluster's figures."""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.planner.des_requests import SimRequest


@dataclass
class Outcome:
    """One request's times (seconds after its arrival), or why it did not finish: its
    path is "refused" when admission turned it away (429 or, after waiting, 503)."""

    path: str
    ttft_s: float | None = None
    e2e_s: float | None = None
    prefill_done_s: float | None = None
    ready_s: float | None = None        # its prompt's KV reached (or its prompt reached)
    #                                     the decode pool
    decode_s: float | None = None       # admitted to a decode engine until finished
    decode_replica: str | None = None   # the decode engine that answered it


@dataclass
class SimResult:
    """What one simulation measured: each request's outcome, the token gaps, the pools'
    busy time, the reports the routers read and the prompt tokens per source."""

    requests: list[SimRequest]
    outcomes: list[Outcome]
    # (step end, step seconds, sequences that got a token in it): the inter-token gaps
    token_gaps: list[tuple[float, float, int]]
    busy_s: dict[str, float]                    # pool -> engine-seconds busy until the
    #                                             last first-turn arrival
    last_arrival_s: float
    decode_concurrency_integral: float          # ∫ sequences in decode engines dt
    horizon_s: float
    arrivals: list[float] = field(default_factory=list)   # each request's, as it came
    # Prompt tokens per pool: computed by its engines, found in their prefix caches, and
    # (decode) pulled from the prefill pool; the engines' counters of `pdserve bench`
    # (tools/bench/engine_work.py)
    prompt_tokens: dict[str, dict[str, int]] = field(default_factory=dict)
    # What the replicas report, as each pool's mean over its replicas, at every refresh
    # of the router's snapshot (at most one a report interval, at routing instants):
    # (time, pool, queued prompt tokens, running sequences, KV-cache use 0..1)
    reports: list[tuple[float, str, float, float, float]] = field(default_factory=list)
    preemptions: int = 0                        # by the decode engines (recompute)

    def finished(self) -> list[Outcome]:
        """The outcomes of the requests that finished."""
        return [o for o in self.outcomes if o.e2e_s is not None]
