"""The cheapest cluster that meets the SLOs (pure).

For a model on an accelerator at a peak rate: how many replicas each pool needs, by
simulating a slice of the fleet (tools/planner/des.py) at the matching slice of the
traffic. The search starts from an analytic bracket (each pool's throughput by the step
cost model) and grows each pool until the simulated p95 TTFT and ITL meet the SLOs.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from cluster.config import DecodeRoutingConfig, PrefillRoutingConfig
from cluster.percentile import percentile
from tools.bench.workload import WorkloadSpec
from tools.planner.cost_model import Roofline, Transfer
from tools.planner.des import (
    AnswerReuse,
    ClusterSpec,
    EngineLimits,
    Outcome,
    RouterTier,
    SimRequest,
    SimResult,
    Simulation,
)
from tools.planner.model import prefill_pairs
from tools.planner.speculation import Speculation
from tools.planner.workload import diurnal_shape, first_turns, mean_lengths, requests

# Simulated seconds read for nothing: the slice starts empty, and its first requests
# meet idle engines no steady load would give them.
WARMUP_S = 10.0


@dataclass(frozen=True)
class Slo:
    ttft_p95_s: float = 0.5
    itl_p95_s: float = 0.05


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is for. Each pool's cost model carries its tensor parallelism; its
    limits are vLLM's batch limits (their KV capacity is the cost model's)."""

    prefill_cost: Roofline
    decode_cost: Roofline
    prefill: EngineLimits
    decode: EngineLimits
    transfer: Transfer
    workload: WorkloadSpec            # lengths (and seed); its rate is the peak rate
    slo: Slo = Slo()
    threshold_tokens: int = 256
    report_interval_s: float = 1.0
    sim_seconds: float = 40.0
    warmup_s: float = WARMUP_S
    slice_replicas: int = 32          # of the smaller pool simulated (docs/planning.md)
    # Cost levers (docs/cost.md): the share of requests the router's response cache
    # answers (the engines never see them) and of prompt tokens the engines' prefix
    # caches hold (a shared system prompt, an earlier turn).
    response_cache_hit: float = 0.0
    prefix_hit: float = 0.0
    answer_reuse: AnswerReuse = 1.0   # of an answer, repeated by the next turn's tokens
    # The router tier and its admission (None: every request admitted at once), with
    # ``routers_per_decode`` router replicas for each decode replica (its replicas field
    # is set per simulated slice)
    routers: RouterTier | None = None
    routers_per_decode: float = 0.0
    shared_router_view: bool = False   # des.ClusterSpec's: routers that see each other
    spread: bool = True                # router.routing.{prefill,decode}.spread
    speculation: Speculation | None = None   # the decode pool's (decode.speculative)

    def __post_init__(self) -> None:
        if not 0 <= self.response_cache_hit < 1 or not 0 <= self.prefix_hit < 1:
            raise ValueError("hit rates are in [0, 1)")

    @property
    def engine_rate(self) -> float:
        """Requests per second that reach the engines (a response-cache hit does not)."""
        return self.workload.rate * (1 - self.response_cache_hit)


@dataclass(frozen=True)
class Prediction:
    prefill_replicas: int
    decode_replicas: int
    simulated: tuple[int, int]        # replicas of each pool in the simulated slice
    ttft_s: dict[str, float]          # p50, p95, p99
    itl_s: dict[str, float]
    # p95 of the part of TTFT spent before the KV reached decode (prefill queue, compute,
    # transfer) and of the rest (waiting for a decode slot, the first step)
    before_decode_p95_s: float
    on_decode_p95_s: float
    prefill_busy: float               # share of time its engines step, while traffic arrives
    decode_busy: float
    refused: float = 0.0              # share of the requests admission turned away (their
    #                                   TTFT counts as infinite in the percentiles)

    @property
    def replicas(self) -> dict[str, int]:
        """Each pool's replicas, by pool name."""
        return {"prefill": self.prefill_replicas, "decode": self.decode_replicas}

    def meets(self, slo: Slo) -> bool:
        return self.ttft_s["p95"] <= slo.ttft_p95_s and self.itl_s["p95"] <= slo.itl_p95_s


def cluster_spec(inputs: PlanInputs, prefill_replicas: int, decode_replicas: int) -> ClusterSpec:
    kv_bytes = inputs.decode_cost.kv_bytes_per_token
    return ClusterSpec(
        prefill_replicas, decode_replicas, inputs.prefill_cost.step_time,
        inputs.decode_cost.step_time, lambda prompt: inputs.transfer.time(prompt * kv_bytes),
        prefill_limits=replace(inputs.prefill, kv_capacity_tokens=max(
            1, inputs.prefill_cost.kv_capacity_tokens())),
        decode_limits=replace(inputs.decode, kv_capacity_tokens=max(
            1, inputs.decode_cost.kv_capacity_tokens())),
        threshold_tokens=inputs.threshold_tokens, report_interval_s=inputs.report_interval_s,
        shared_router_view=inputs.shared_router_view,
        prefill_routing=PrefillRoutingConfig(spread=inputs.spread),
        decode_routing=DecodeRoutingConfig(spread=inputs.spread),
        speculation=inputs.speculation)


def slice_of(prefill_replicas: int, decode_replicas: int, slice_replicas: int
             ) -> tuple[int, int, float]:
    """Replicas of each pool to simulate and the share of the traffic they get."""
    fraction = min(1.0, slice_replicas / max(1, min(prefill_replicas, decode_replicas)))
    simulated_decode = max(1, round(decode_replicas * fraction))
    share = simulated_decode / decode_replicas
    return max(1, round(prefill_replicas * share)), simulated_decode, share


def predict(inputs: PlanInputs, prefill_replicas: int, decode_replicas: int) -> Prediction:
    """Simulate the slice of this cluster and read its percentiles after the warm-up."""
    result, simulated, window = run_slice(inputs, prefill_replicas, decode_replicas)
    return read(result, inputs, prefill_replicas, decode_replicas, simulated, window)


def run_slice(inputs: PlanInputs, prefill_replicas: int, decode_replicas: int
              ) -> tuple[SimResult, tuple[int, int], tuple[float, float]]:
    """The simulation of this cluster's slice at its share of the traffic: the result,
    each pool's simulated replicas, and the window of arrivals to read (the steady part)."""
    sim_p, sim_d, share = slice_of(prefill_replicas, decode_replicas, inputs.slice_replicas)
    rate = inputs.engine_rate * share
    ramp = conversation_ramp_s(inputs)
    spec = replace(inputs.workload, rate=rate,
                   num_requests=max(1, round(rate * (inputs.sim_seconds + ramp))))
    cluster = cluster_spec(inputs, sim_p, sim_d)
    if inputs.routers is not None:
        cluster = replace(cluster, routers=replace(inputs.routers, replicas=max(
            1, round(inputs.routers_per_decode * sim_d))))
    result = Simulation(cluster, requests(spec, inputs.prefix_hit, inputs.answer_reuse),
                        random.Random(spec.seed)).run()
    # With conversations, read until the last first turn: later turns after it come
    # without the first turns of their time, a load falling off
    end = result.last_arrival_s if ramp else math.inf
    return result, (sim_p, sim_d), (inputs.warmup_s + ramp, end)


def conversation_ramp_s(inputs: PlanInputs) -> float:
    """How long conversations take to reach their steady mix of turns: only first turns
    arrive at first, each later turn a think time and an answer after the one before.
    The simulation runs that much longer and is read only after it (0: single turns)."""
    workload = inputs.workload
    if workload.turns <= 1:
        return 0.0
    answer_s = mean_lengths(workload)[1] * inputs.slo.itl_p95_s
    return (workload.turns - 1) * (workload.think_s + answer_s)


def read(result: SimResult, inputs: PlanInputs, prefill_replicas: int,
         decode_replicas: int, simulated: tuple[int, int],
         window: tuple[float, float]) -> Prediction:
    """The percentiles of the requests that arrived in ``window`` (the steady part of the
    run) and of the steps in it."""
    start, end = window
    measured = arrived_in(result, window)
    ttfts = sorted(o.ttft_s if o.ttft_s is not None else math.inf for _, o in measured)
    gaps = [(took, count) for at, took, count in result.token_gaps if start <= at <= end]
    span = max(result.last_arrival_s, 1e-9)
    before = sorted(o.ready_s or 0.0 for _, o in measured)
    on_decode = sorted((o.ttft_s if o.ttft_s is not None else math.inf) - (o.ready_s or 0.0)
                       for _, o in measured)
    return Prediction(
        prefill_replicas, decode_replicas, simulated,
        {name: percentile(ttfts, q) for name, q in (("p50", 50), ("p95", 95), ("p99", 99))},
        {name: weighted_percentile(gaps, q) for name, q in
         (("p50", 50), ("p95", 95), ("p99", 99))},
        percentile(before, 95) or 0.0, percentile(on_decode, 95) or 0.0,
        result.busy_s["prefill"] / (span * max(1, simulated[0])),
        result.busy_s["decode"] / (span * max(1, simulated[1])),
        sum(o.path == "refused" for _, o in measured) / max(1, len(measured)))


def arrived_in(result: SimResult, window: tuple[float, float]
               ) -> list[tuple[SimRequest, Outcome]]:
    """The requests of ``result`` that arrived in ``window``, with their outcomes."""
    start, end = window
    return [(request, outcome) for request, outcome, arrival in zip(
        result.requests, result.outcomes, result.arrivals, strict=True)
        if start <= arrival <= end]


def weighted_percentile(samples: list[tuple[float, int]], q: float) -> float:
    """The ``q``-th percentile of values each counted ``weight`` times."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    total = sum(weight for _, weight in ordered)
    target, seen = total * q / 100, 0
    for value, weight in ordered:
        seen += weight
        if seen >= target:
            return value
    return ordered[-1][0]


# ---------------------------------------------------------------------------------------
# The search


def bracket(inputs: PlanInputs) -> tuple[int, int]:
    """Fewest replicas of each pool whose throughput covers the peak, by the cost model
    alone (no queueing): prefill at full steps of ``max_num_batched_tokens``; decode at
    the largest batch whose step stays within the ITL SLO."""
    mean_prompt, mean_output = mean_lengths(inputs.workload)
    rate = inputs.engine_rate
    budget = inputs.prefill.max_num_batched_tokens
    computed = mean_prompt * (1 - inputs.prefix_hit)
    chunks = max(1.0, budget / computed)
    pairs = chunks * prefill_pairs(int(computed), int(mean_prompt - computed))
    step = inputs.prefill_cost.step_time(budget, pairs, int(chunks * mean_prompt))
    prefill = math.ceil(rate * computed / (budget / step))
    context = mean_prompt + mean_output / 2
    batch = best_decode_batch(inputs, context)
    step, gained = decode_step(inputs, batch, context)
    decode = math.ceil(rate * mean_output / (gained / step))
    return max(1, prefill), max(1, decode)


def best_decode_batch(inputs: PlanInputs, context: float) -> int:
    """The largest decode batch (within ``max_num_seqs`` and the KV cache) whose step
    takes at most the ITL SLO."""
    limit = min(inputs.decode.max_num_seqs,
                int(inputs.decode_cost.kv_capacity_tokens() // max(1.0, context)))
    best = 1
    for batch in range(1, max(1, limit) + 1):
        if decode_step(inputs, batch, context)[0] > inputs.slo.itl_p95_s:
            break
        best = batch
    return best


def decode_step(inputs: PlanInputs, batch: int, context: float) -> tuple[float, float]:
    """A decode step of ``batch`` sequences of ``context`` tokens each, on average: its
    seconds, and the tokens it gains them (``batch``; more when speculating, for a step
    that also verifies the drafts of the sequences that drafted)."""
    speculation = inputs.speculation
    per_seq = 1 + (speculation.drafts_per_step if speculation else 0)
    step = inputs.decode_cost.step_time(round(batch * per_seq), batch * context * per_seq,
                                        int(batch * context))
    return step, batch * (speculation.tokens_per_step if speculation else 1)


@dataclass(frozen=True)
class Plan:
    inputs: PlanInputs
    prediction: Prediction
    tried: tuple[Prediction, ...]

    @property
    def gpus(self) -> tuple[int, int]:
        return (self.prediction.prefill_replicas * self.inputs.prefill_cost.tp,
                self.prediction.decode_replicas * self.inputs.decode_cost.tp)

    def dollars_per_hour(self) -> float:
        prefill, decode = self.gpus
        return ((prefill * self.inputs.prefill_cost.accelerator.price_per_hour)
                + decode * self.inputs.decode_cost.accelerator.price_per_hour)

    def gpus_by_hour(self, peak_to_mean: float,
                     night_share: float = 0.05) -> list[tuple[int, int]]:
        """Each hour's GPUs of each pool (prefill, decode), scaled to that hour's rate (the
        autoscalers' targets are per replica, so replicas follow the rate), at least one
        replica each."""
        return [(max(1, math.ceil(self.prediction.prefill_replicas * share))
                 * self.inputs.prefill_cost.tp,
                 max(1, math.ceil(self.prediction.decode_replicas * share))
                 * self.inputs.decode_cost.tp)
                for share in diurnal_shape(peak_to_mean, night_share)]

    def gpu_hours_per_day(self, peak_to_mean: float, night_share: float = 0.05) -> float:
        """GPU-hours a day with each pool scaled to each hour's rate (``gpus_by_hour``)."""
        return sum(map(sum, self.gpus_by_hour(peak_to_mean, night_share)))


def prefill_alone_s(cost: Roofline, budget: int, prompt_tokens: int,
                    cached_tokens: int = 0) -> float:
    """Seconds an idle engine of ``cost`` and a ``budget`` of tokens a step takes to
    compute a prompt of ``prompt_tokens`` past its ``cached_tokens``: its chunks, each
    step after the ones before, accounted as the simulator steps them (des_engine.py).
    No TTFT of that prompt can be shorter, however large the pool."""
    done = min(cached_tokens, prompt_tokens - 1)   # the last token is always computed
    seconds = 0.0
    while done < prompt_tokens:
        chunk = min(budget, prompt_tokens - done)
        seconds += cost.step_time(chunk, prefill_pairs(chunk, done), done)
        done += chunk
    return seconds


def ttft_floor(inputs: PlanInputs, samples: int = 4_000) -> tuple[float, int, float]:
    """(A bound under any cluster's p95 TTFT, the prompt length at it, the percentile of
    first turns it is): each first turn's prompt computed alone on an idle engine
    (``prefill_alone_s``; its prefix-cache share and its group's shared head taken as
    cached; a prompt under the threshold on whichever engine is faster), at the
    percentile of first turns that bounds the p95 of all requests: at most 5% of them
    lie above it, and first turns are at least ``1 / turns`` of them (later turns,
    whose histories may be cached, are left out). Queueing, the transfer and the first
    decode step only add to it."""
    workload = inputs.workload
    q = 100 - 5 * max(1, workload.turns)
    if q <= 0:
        return 0.0, 0, 0.0
    engines = {"prefill": (inputs.prefill_cost, inputs.prefill.max_num_batched_tokens),
               "decode": (inputs.decode_cost, inputs.decode.max_num_batched_tokens)}
    floors, lengths = [], []
    for request in first_turns(replace(workload, num_requests=samples), inputs.prefix_hit):
        cached = request.cached_tokens + request.group_tokens
        where = (["prefill", "decode"] if request.prompt_tokens < inputs.threshold_tokens
                 else ["prefill"])
        floors.append(min(prefill_alone_s(*engines[pool], request.prompt_tokens, cached)
                          for pool in where))
        lengths.append(request.prompt_tokens)
    return percentile(floors, q), percentile(lengths, q), q


def unreachable_ttft(inputs: PlanInputs) -> str | None:
    """Why no pool size can meet the TTFT SLO (None when one may): the workload's long
    prompts alone, on idle engines, already take longer (``ttft_floor``)."""
    floor, prompt, q = ttft_floor(inputs)
    if floor <= inputs.slo.ttft_p95_s:
        return None
    return (f"no cluster can meet the p95 TTFT SLO of {inputs.slo.ttft_p95_s * 1000:.0f} "
            f"ms: the p{q:g} of the workload's first prompts ({prompt:,} tokens) alone "
            f"takes {floor * 1000:.0f} ms to prefill on an idle TP{inputs.prefill_cost.tp} "
            "replica, before any queueing, transfer or decode step (a larger --prefill-tp, "
            "a prefix cache's share, or a looser --ttft-p95)")


def search(inputs: PlanInputs, growth: float = 1.08, max_steps: int = 40) -> Plan:
    """The first cluster, growing from the bracket, whose slice meets the SLOs, then each
    pool shrunk while they still hold. A pool grows while the part of the latency it owns
    misses: the decode pool for the ITL, and for the TTFT whichever of the two parts of
    the TTFT (before the KV reaches decode; waiting for a decode slot and the first step)
    is the larger at p95. Refused at once (RuntimeError) when the TTFT SLO is out of any
    cluster's reach (``unreachable_ttft``): the search would grow the prefill pool for its
    40 steps, simulating ever larger slices, and fail."""
    refusal = unreachable_ttft(inputs)
    if refusal is not None:
        raise RuntimeError(refusal)
    prefill, decode = bracket(inputs)
    tried = []
    for _ in range(max_steps):
        prediction = predict(inputs, prefill, decode)
        tried.append(prediction)
        if prediction.meets(inputs.slo):
            break
        grow_decode = prediction.itl_s["p95"] > inputs.slo.itl_p95_s
        if prediction.ttft_s["p95"] > inputs.slo.ttft_p95_s:
            if prediction.before_decode_p95_s >= prediction.on_decode_p95_s:
                prefill = max(prefill + 1, math.ceil(prefill * growth))
            else:
                grow_decode = True
        if grow_decode:
            decode = max(decode + 1, math.ceil(decode * growth))
    else:
        raise RuntimeError(f"no cluster met the SLOs within {max_steps} steps; last: "
                           f"{tried[-1]}")
    best = tried[-1]
    for pool in ("prefill", "decode"):
        while True:
            smaller = (best.prefill_replicas - (pool == "prefill"),
                       best.decode_replicas - (pool == "decode"))
            if min(smaller) < 1:
                break
            shrunk = math.floor(getattr(best, f"{pool}_replicas") / growth ** 0.5)
            candidate = (shrunk, best.decode_replicas) if pool == "prefill" \
                else (best.prefill_replicas, shrunk)
            if min(candidate) < 1 or candidate == (best.prefill_replicas,
                                                   best.decode_replicas):
                break
            prediction = predict(inputs, *candidate)
            tried.append(prediction)
            if not prediction.meets(inputs.slo):
                break
            best = prediction
    return Plan(inputs, best, tuple(tried))


def lever_variants(inputs: PlanInputs, prefix_hit: float, response_cache_hit: float,
                   speculations: Sequence[Speculation] = ()) -> dict[str, PlanInputs]:
    """``inputs`` as given, and with each cost lever added alone: fp8 weights and KV cache
    on both pools, a prefix-cache hit rate, a response-cache hit rate, and speculative
    decoding on the decode pool at each of ``speculations``."""
    def fp8(cost: Roofline) -> Roofline:
        return replace(cost, compute_dtype="fp8", kv_dtype="fp8")

    return {
        "as given": inputs,
        "fp8 weights and KV": replace(inputs, prefill_cost=fp8(inputs.prefill_cost),
                                      decode_cost=fp8(inputs.decode_cost)),
        f"prefix cache {prefix_hit:.0%} of prompt tokens": replace(inputs,
                                                                    prefix_hit=prefix_hit),
        f"response cache {response_cache_hit:.0%} of requests": replace(
            inputs, response_cache_hit=response_cache_hit),
        **{speculation_name(speculation): replace(inputs, speculation=speculation)
           for speculation in speculations},
    }


def speculation_name(speculation: Speculation) -> str:
    """A lever table's row name for ``speculation``."""
    drafting = ("" if speculation.drafting_share == 1 else
                f" on {speculation.drafting_share:.0%} of steps")
    return (f"speculation, {speculation.draft_tokens} drafts{drafting}, "
            f"{speculation.accepted_share:.0%} accepted")


# ---------------------------------------------------------------------------------------
# The configurations: tensor parallelism of each pool and the disaggregation threshold


def configurations(inputs: PlanInputs, thresholds: Sequence[int], prefill_tps: Sequence[int],
                   decode_tps: Sequence[int]) -> dict[str, PlanInputs | str]:
    """``inputs`` with each threshold and each pool's tensor parallelism, by name
    ("threshold 256, TP4 + TP8"); instead of inputs, why a configuration cannot serve:
    an engine whose weights leave no room for one whole sequence's KV. The KV link of a
    prefill replica grows with its GPUs, as the inputs' link does with theirs."""
    link_per_gpu = inputs.transfer.bandwidth / inputs.prefill_cost.tp
    longest = inputs.workload.max_model_len
    result: dict[str, PlanInputs | str] = {}
    for threshold, prefill_tp, decode_tp in itertools.product(thresholds, prefill_tps,
                                                              decode_tps):
        name = f"threshold {threshold}, TP{prefill_tp} + TP{decode_tp}"
        prefill = replace(inputs.prefill_cost, tp=prefill_tp)
        decode = replace(inputs.decode_cost, tp=decode_tp)
        if min(prefill.kv_capacity_tokens(), decode.kv_capacity_tokens()) < longest:
            result[name] = f"the weights leave room for under {longest:,} tokens of KV"
            continue
        result[name] = replace(inputs, prefill_cost=prefill, decode_cost=decode,
                               threshold_tokens=threshold,
                               transfer=replace(inputs.transfer,
                                                bandwidth=link_per_gpu * prefill_tp))
    return result


def cheapest(plans: Mapping[str, Plan | str]) -> str:
    """The name of the plan of least dollars per hour at peak (then fewest GPU-hours
    held, then lowest p95 TTFT); a configuration that has no plan (a reason) is never it."""
    found = {name: plan for name, plan in plans.items() if isinstance(plan, Plan)}
    if not found:
        raise RuntimeError("no configuration met the SLOs: " + "; ".join(
            f"{name}: {reason}" for name, reason in plans.items()))
    return min(found, key=lambda name: (found[name].dollars_per_hour(),
                                        sum(found[name].gpus),
                                        found[name].prediction.ttft_s["p95"]))
