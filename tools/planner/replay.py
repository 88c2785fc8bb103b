"""A recorded ``pdserve bench`` run replayed through the simulator (pure): the same
arrivals and lengths on the served config's pools, timed by the calibrated step costs.

What the engines' step costs leave out is the serving layer: the hops of a request
through the proxy, the router and the replicas (docs/benchmarks.md: tens of ms), and the
relaying processes that share the decode engine's core. ``ServingCost``
(tools/planner/serving_cost.py) stands for them: fitted on some runs
(``fit_serving``), it predicts the others. It grows with the tokens streamed per second,
which a replay finds as a fixed point: the load slows the decode steps, which lowers the
load.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cluster.percentile import percentile
from tools.planner.cost_model import Transfer
from tools.planner.des import (
    AnswerReuse,
    ClusterSpec,
    EngineLimits,
    SimRequest,
    SimResult,
    Simulation,
    repeated_tokens,
)
from tools.planner.fitted import FittedCost
from tools.planner.serving_cost import (
    LoadPoint,
    ServingCost,
    fit_serving_cost,
    residual_slope,
    streamed_per_s,
)

NO_SERVING_COST = ServingCost()

# A replay's streamed tokens/s is a fixed point: at most this many simulations, stopping
# once the rate moves by under FIXED_POINT_TOLERANCE of itself.
FIXED_POINT_ROUNDS = 8
FIXED_POINT_TOLERANCE = 0.01


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
    streamed_per_s: float = 0.0     # tokens streamed per second (``streamed_per_s``)
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
                                 zip(ends, answered, strict=True)], 50),
                     streamed_per_s(min(r["sent_at"] for r in answered), max(ends),
                                    sum(r["output_tokens"] for r in answered)))


def step_cost(pool: Mapping[str, Any], slowdown: float = 1.0):
    """A pool's calibrated step time (its ``cost`` entry), times ``slowdown``."""
    fitted = FittedCost(**pool["cost"])
    return lambda new, pairs, context: slowdown * fitted.step_time(new, pairs, context)


def _limits(pool: Mapping[str, Any]) -> EngineLimits:
    return EngineLimits(pool["max_num_batched_tokens"], pool["max_num_seqs"],
                        max(1, pool["kv_capacity_tokens"]))


def _spec(served: Served, decode_factor: float) -> ClusterSpec:
    return ClusterSpec(served.prefill_replicas, served.decode_replicas,
                       step_cost(served.prefill), step_cost(served.decode, decode_factor),
                       served.transfer_time, prefill_limits=_limits(served.prefill),
                       decode_limits=_limits(served.decode),
                       threshold_tokens=served.threshold_tokens, block_size=served.block_size,
                       prefill_routing=served.routing.get("prefill"),
                       decode_routing=served.routing.get("decode"))


def _engines(served: Served, requests: Sequence[SimRequest], decode_factor: float,
             seed: int) -> tuple[SimResult, float]:
    """The engines' part of a replay, and the tokens/s it streamed."""
    result = Simulation(_spec(served, decode_factor), requests, random.Random(seed)).run()
    done = [(r, o) for r, o in zip(result.requests, result.outcomes, strict=True)
            if o.e2e_s is not None]
    if not done:
        return result, 0.0
    return result, streamed_per_s(min(r.arrival_s for r, _ in done),
                                  max(r.arrival_s + o.e2e_s for r, o in done),
                                  sum(r.output_tokens for r, _ in done))


def simulate(served: Served, requests: Sequence[SimRequest],
             cost: ServingCost = NO_SERVING_COST, seed: int = 0) -> Latencies:
    """The replay's latencies with the serving layer's ``cost`` at the load it streams:
    each round simulates at the last round's rate (halfway to it, so that the slowdown
    and the rate settle rather than swing)."""
    rate = 0.0
    for _ in range(FIXED_POINT_ROUNDS):
        result, seen_rate = _engines(served, requests, cost.decode_factor(rate), seed)
        settled = abs(seen_rate - rate) <= FIXED_POINT_TOLERANCE * max(seen_rate, 1e-9)
        if settled or (cost.decode_load_s == 0 and cost.ttft_load_s == 0):
            break
        rate = (rate + seen_rate) / 2 if rate else seen_rate
    rate = seen_rate        # what the simulation that is read streamed
    done = [(r, o) for r, o in zip(result.requests, result.outcomes, strict=True)
            if o.e2e_s is not None]
    added = [cost.ttft_added(r.prompt_tokens, rate) for r, _ in done]
    ttfts = [o.ttft_s + a for (_, o), a in zip(done, added, strict=True)]
    return Latencies(percentile(ttfts, 50), percentile(ttfts, 95),
                     percentile([o.e2e_s - o.ttft_s for _, o in done], 50),
                     percentile([o.e2e_s + a for (_, o), a in zip(done, added, strict=True)],
                                50),
                     rate, result.prompt_tokens)


def load_point(served: Served, records: Sequence[Mapping[str, Any]],
               shared_prefix_tokens: int = 0, answer_reuse: AnswerReuse = 1.0) -> LoadPoint:
    """What one recorded run says about the serving layer at its load: the decode
    slowdown that makes the simulated decode p50 the measured one (a few rounds: the
    slowdown moves the batching), then how its TTFT residuals grow with the prompt, and
    the time at no prompt that makes its TTFT p50 the measured one."""
    requests = trace_requests(records, shared_prefix_tokens, answer_reuse)
    truth = measured(records)
    slowdown = 1.0
    for _ in range(4):
        result, _ = _engines(served, requests, slowdown, 0)
        seen = [o.e2e_s - o.ttft_s for o in result.outcomes if o.e2e_s is not None]
        slowdown *= truth.decode_p50 / max(percentile(seen, 50), 1e-9)
    result, _ = _engines(served, requests, slowdown, 0)
    prompts, simulated, residuals = [], [], []
    for record, request, outcome in zip(_answered(records), requests, result.outcomes,
                                        strict=True):
        if outcome.ttft_s is not None:
            prompts.append(request.prompt_tokens)
            simulated.append(outcome.ttft_s)
            residuals.append(record["first_token_at"] - record["sent_at"] - outcome.ttft_s)
    per_prompt_token_s = residual_slope(prompts, residuals)
    # the intercept that makes the TTFT p50 the measured one (a shift moves a percentile
    # by itself): the medians of request-by-request residuals need not add up to it
    ttft_s = max(0.0, truth.ttft_p50 - percentile(
        [t + per_prompt_token_s * p for t, p in zip(simulated, prompts, strict=True)], 50))
    return LoadPoint(truth.streamed_per_s, slowdown, ttft_s, per_prompt_token_s)


def fit_serving(served: Served, runs: Sequence[tuple[Sequence[Mapping[str, Any]], int]],
                answer_reuse: AnswerReuse = 1.0) -> ServingCost:
    """The serving cost fitted on ``runs`` (each: its records and its shared head's
    tokens): constants from one load, their growth with load from two or more."""
    return fit_serving_cost([load_point(served, records, head, answer_reuse)
                             for records, head in runs])
