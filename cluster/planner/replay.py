"""A recorded ``pdserve bench`` run replayed through the simulator (pure): the same
arrivals and lengths on the served config's pools, timed by the calibrated step costs.

What the engines' step costs leave out is the serving layer: the hops of a request
through the proxy, the router and the replicas (docs/benchmarks.md: tens of ms), and the
relaying processes that share the decode engine's core. Two constants stand for them,
fitted on one run (the first trace) and then held for the others, which the simulation
predicts: a time added to every TTFT, and a factor on the decode engine's steps.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cluster.percentile import percentile
from cluster.planner.cost_model import Transfer
from cluster.planner.des import (
    AnswerReuse,
    ClusterSpec,
    EngineLimits,
    SimRequest,
    Simulation,
    repeated_tokens,
)
from cluster.planner.fitted import FittedCost


@dataclass(frozen=True)
class Served:
    """The served cluster: pools, path threshold, and each pool's calibration."""

    prefill_replicas: int
    decode_replicas: int
    threshold_tokens: int
    prefill: Mapping[str, Any]       # a pool's entry of the calibration file
    decode: Mapping[str, Any]
    transfer_s: float = 0.0         # each prompt's KV transfer, when none is measured
    transfer: Transfer | None = None  # measured (``pdserve bench transfer``): by bytes
    kv_bytes_per_token: int = 0
    block_size: int = 16             # engine.block_size
    routing: Mapping[str, Any] = field(default_factory=dict)  # router.routing: {prefill,
    #                                  decode: their configs} (absent: the defaults)

    def transfer_time(self, prompt_tokens: int) -> float:
        """One prompt's KV transfer between the pools."""
        if self.transfer is None:
            return self.transfer_s
        return self.transfer.time(prompt_tokens * self.kv_bytes_per_token)


@dataclass(frozen=True)
class Latencies:
    ttft_p50: float
    ttft_p95: float
    decode_p50: float               # first token to last: the answer's streaming time
    e2e_p50: float
    # the simulation's: prompt tokens per pool and source (as `engine_work` counts them)
    prompt_tokens: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def _answered(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records of requests that got an answer (a first token, and tokens)."""
    return [r for r in records if r.get("first_token_at") is not None and r["output_tokens"]]


def trace_requests(records: Sequence[Mapping[str, Any]], shared_prefix_tokens: int = 0,
                   answer_reuse: AnswerReuse = 1.0) -> list[SimRequest]:
    """The requests of a run's records that got an answer, as sent (open loop: a later
    turn at the time it was sent), each with the KV blocks it shares: its group's head of
    ``shared_prefix_tokens`` (the run's workload) and its conversation's earlier turns,
    of whose answers it repeats ``answer_reuse`` token for token (a share, or shares
    each later turn draws one of, seeded)."""
    if not any(r.get("follows") is not None for r in records):
        return [_as_sent(r, shared_prefix_tokens, -1) for r in _answered(records)]
    requests: dict[int, SimRequest] = {}
    rng = random.Random(0)
    for record in sorted(records, key=lambda r: r["index"]):
        request = _as_sent(record, shared_prefix_tokens, record["index"])
        earlier = requests.get(record.get("follows"))
        if earlier is not None:
            repeated = repeated_tokens(earlier, answer_reuse, rng)
            request = replace(request, conversation=earlier.conversation,
                              versions=earlier.next_versions(repeated))
        requests[record["index"]] = request
    return [requests[r["index"]] for r in _answered(records)]


def _as_sent(record: Mapping[str, Any], shared_prefix_tokens: int,
             conversation: int) -> SimRequest:
    group = record.get("prefix_group", -1)
    return SimRequest(record["sent_at"], record["prompt_tokens"], record["output_tokens"],
                      group=group, group_tokens=shared_prefix_tokens if group >= 0 else 0,
                      conversation=conversation)


def measured(records: Sequence[Mapping[str, Any]]) -> Latencies:
    answered = _answered(records)
    ttfts = [r["first_token_at"] - r["sent_at"] for r in answered]
    ends = [(r["token_times"] or [r["first_token_at"]])[-1] for r in answered]
    return Latencies(percentile(ttfts, 50), percentile(ttfts, 95),
                     percentile([end - r["first_token_at"] for end, r in
                                 zip(ends, answered, strict=True)], 50),
                     percentile([end - r["sent_at"] for end, r in
                                 zip(ends, answered, strict=True)], 50))


def step_cost(pool: Mapping[str, Any], slowdown: float = 1.0):
    """A pool's calibrated step time (its ``cost`` entry), times ``slowdown``."""
    fitted = FittedCost(**pool["cost"])
    return lambda new, pairs, context: slowdown * fitted.step_time(new, pairs, context)


def _limits(pool: Mapping[str, Any]) -> EngineLimits:
    return EngineLimits(pool["max_num_batched_tokens"], pool["max_num_seqs"],
                        max(1, pool["kv_capacity_tokens"]))


def simulate(served: Served, requests: Sequence[SimRequest], ttft_offset_s: float = 0.0,
             decode_slowdown: float = 1.0, seed: int = 0) -> Latencies:
    spec = ClusterSpec(served.prefill_replicas, served.decode_replicas,
                       step_cost(served.prefill), step_cost(served.decode, decode_slowdown),
                       served.transfer_time, prefill_limits=_limits(served.prefill),
                       decode_limits=_limits(served.decode),
                       threshold_tokens=served.threshold_tokens, block_size=served.block_size,
                       prefill_routing=served.routing.get("prefill"),
                       decode_routing=served.routing.get("decode"))
    result = Simulation(spec, requests, random.Random(seed)).run()
    done = [o for o in result.outcomes if o.e2e_s is not None]
    ttfts = [o.ttft_s + ttft_offset_s for o in done]
    return Latencies(percentile(ttfts, 50), percentile(ttfts, 95),
                     percentile([o.e2e_s - o.ttft_s for o in done], 50),
                     percentile([o.e2e_s + ttft_offset_s for o in done], 50),
                     result.prompt_tokens)


def fit_offsets(served: Served, records: Sequence[Mapping[str, Any]],
                shared_prefix_tokens: int = 0, answer_reuse: AnswerReuse = 1.0
                ) -> tuple[float, float]:
    """(TTFT offset, decode slowdown) that make the simulation's medians those of
    ``records``: the slowdown first (it moves the TTFT too, by queueing), a few rounds."""
    requests = trace_requests(records, shared_prefix_tokens, answer_reuse)
    truth = measured(records)
    offset, slowdown = 0.0, 1.0
    for _ in range(4):
        seen = simulate(served, requests, offset, slowdown)
        slowdown *= truth.decode_p50 / max(seen.decode_p50, 1e-9)
        seen = simulate(served, requests, 0.0, slowdown)
        offset = max(0.0, truth.ttft_p50 - seen.ttft_p50)
    return offset, slowdown
