"""The planner (tools/planner/, pure): the model's sizes, the step cost model against an
independent closed-form roofline, the simulator against queueing theory, and the search.

The closed-form figures are those of ../shared/notes/cost-levers-planner.md (B2), worked
out by hand for Llama-3.1-70B on H100s: 70.55 B parameters, 320 KiB of bf16 KV per token,
70.9 TFLOP per 500-token prefill, 745 H100s of prefill at 50% MFU for 5,200 requests/s,
and a TP4 decode step of 46 ms at a batch of 608 (~476 H100s).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from cluster.config import parse_config
from tools.bench.workload import WorkloadSpec
from tools.planner.cost_model import Roofline, Transfer, measured_transfer
from tools.planner.des import ClusterSpec, EngineLimits, SimRequest, Simulation
from tools.planner.fitted import FittedCost, StepSample, fit, relative_errors
from tools.planner.hardware import CATALOG
from tools.planner.model import LLAMA_3_1_70B, ModelShape, prefill_pairs
from tools.planner.output import config_document, figures
from tools.planner.replay import (
    Served,
    fit_serving,
    measured,
    simulate,
    step_cost,
    trace_requests,
)
from tools.planner.search import (
    PlanInputs,
    Slo,
    bracket,
    cheapest,
    configurations,
    predict,
    prefill_alone_s,
    search,
    slice_of,
    ttft_floor,
    unreachable_ttft,
    weighted_percentile,
)
from tools.planner.serving_cost import (
    MAX_BUSY,
    LoadPoint,
    ServingCost,
    fit_serving_cost,
    residual_slope,
)
from tools.planner.workload import diurnal_shape, requests

REPO = Path(__file__).resolve().parents[2]
LLAMA = ModelShape.from_hf_config(LLAMA_3_1_70B)
H100 = CATALOG["h100"]


def test_llama_70b_has_the_published_size_and_kv_per_token():
    assert LLAMA.params == pytest.approx(70.55e9, rel=1e-3)
    assert LLAMA.kv_bytes_per_token("bf16") == 320 * 1024
    assert LLAMA.kv_bytes_per_token("fp8") == 160 * 1024
    flops = LLAMA.matmul_flops(500) + LLAMA.attention_flops(prefill_pairs(500))
    assert flops == pytest.approx(70.9e12, rel=0.02)   # the embedding lookup is no matmul


def test_the_roofline_reproduces_the_independent_closed_form_within_ten_percent():
    # MFU 0.5, MBU 0.8, 3 ms a step; the closed form has no all-reduce term
    decode = Roofline(LLAMA, H100, tp=4, allreduce_efficiency=0)
    batch, context = 608, 650
    step = decode.step_time(batch, batch * context, batch * context)
    assert step == pytest.approx(0.046, rel=0.05)
    decode_gpus = 5200 * 300 / (batch / step) * 4
    assert decode_gpus == pytest.approx(476, rel=0.10)
    prefill = Roofline(LLAMA, H100, tp=4, allreduce_efficiency=0)
    step = prefill.step_time(2048, 4 * prefill_pairs(512), 0)
    prefill_gpus = 5200 * 500 / (2048 / step) * 4
    assert prefill_gpus == pytest.approx(745, rel=0.10)


def test_tensor_parallel_all_reduces_cost_two_a_layer_and_grow_with_tp_and_tokens():
    """Ring all-reduces of a step's activations, 160 for Llama-3.1-70B: each moves
    2 (tp - 1) / tp of n x 8192 bf16 values at 0.8 x 450 GB/s after 8 us."""
    def ring(tp: int, tokens: int) -> float:
        return 160 * (8e-6 + 2 * (tp - 1) / tp * tokens * 8192 * 2 / (0.8 * 450e9))

    four, eight = Roofline(LLAMA, H100, tp=4), Roofline(LLAMA, H100, tp=8)
    assert four.allreduce_s(608) == pytest.approx(ring(4, 608))
    assert eight.allreduce_s(608) == pytest.approx(ring(8, 608))
    assert eight.allreduce_s(608) > four.allreduce_s(608)
    assert four.allreduce_s(2048) > 3 * four.allreduce_s(256)
    assert Roofline(LLAMA, H100, tp=1).allreduce_s(608) == 0
    bare = Roofline(LLAMA, H100, tp=4, allreduce_efficiency=0)
    assert four.step_time(608, 608 * 650, 608 * 650) == pytest.approx(
        bare.step_time(608, 608 * 650, 608 * 650) + ring(4, 608))


def test_a_small_decode_step_is_bound_by_memory_and_a_large_one_by_compute():
    decode = Roofline(LLAMA, H100, tp=4, step_overhead_s=0, allreduce_efficiency=0)
    weights_read = LLAMA.weight_bytes("bf16") / (4 * H100.memory_bandwidth * 0.8)
    assert decode.step_time(1, 500, 500) == pytest.approx(weights_read, rel=0.01)
    assert decode.step_time(2000, 2000 * 600, 2000 * 600) > 3 * weights_read


def test_a_dtype_the_accelerator_lacks_is_refused():
    with pytest.raises(ValueError, match="no fp8"):
        Roofline(LLAMA, CATALOG["a100"], compute_dtype="fp8")


def test_the_kv_capacity_is_what_the_weights_leave():
    assert Roofline(LLAMA, H100, tp=1).kv_capacity_tokens() == 0     # 141 GB in 72 GB
    four = Roofline(LLAMA, H100, tp=4).kv_capacity_tokens()
    assert four == pytest.approx((4 * 80e9 * 0.9 - LLAMA.weight_bytes("bf16")) / 327680,
                                 abs=1)


# -- the simulator against queueing theory ---------------------------------------------


def constant(seconds: float):
    return lambda new_tokens, pairs, context: seconds


def poisson(rate: float, count: int, prompt: int, output: int, seed: int) -> list[SimRequest]:
    rng, now, result = random.Random(seed), 0.0, []
    for _ in range(count):
        now += rng.expovariate(rate)
        result.append(SimRequest(now, prompt, output))
    return result


@pytest.mark.parametrize("load", [0.5, 0.7])
def test_one_prefill_replica_with_a_fixed_prompt_is_an_md1_queue(load):
    """Poisson arrivals, a deterministic service of D: the mean time to the end of the
    prefill is D + rho D / (2 (1 - rho)) (Pollaczek-Khinchine), within 2%. With 100,000
    arrivals the estimate's own noise is under 1% at these loads (±2% at 0.8, measured
    over five seeds: docs/planning.md), so a miss is the simulator's."""
    service = 0.1
    spec = ClusterSpec(1, 1, constant(service), constant(0.001), lambda tokens: 0.0,
                       prefill_limits=EngineLimits(max_num_batched_tokens=1000),
                       report_interval_s=0)
    result = Simulation(spec, poisson(load / service, 100_000, 1000, 1, seed=3)).run()
    measured = statistics.mean(o.prefill_done_s for o in result.outcomes)
    assert measured == pytest.approx(service * (1 + load / (2 * (1 - load))), rel=0.02)


def test_decode_keeps_littles_law():
    """Sequences held by the decode engines, averaged over time, equal the arrival rate
    times the time each spends there."""
    spec = ClusterSpec(0, 2, constant(0.0), lambda new, pairs, context: 0.002 + 1e-5 * new,
                       lambda tokens: 0.0, decode_limits=EngineLimits(512, 64),
                       report_interval_s=0.5)
    result = Simulation(spec, poisson(40, 4000, 100, 50, seed=4)).run()
    finished = result.finished()
    assert len(finished) == 4000 and {o.path for o in finished} == {"decode_local"}
    held = result.decode_concurrency_integral / result.horizon_s
    rate = len(finished) / result.horizon_s
    assert held == pytest.approx(rate * statistics.mean(o.decode_s for o in finished),
                                 rel=0.02)


def test_every_request_finishes_with_each_token_counted_once():
    spec = ClusterSpec(2, 2, lambda n, p, c: 0.001 * n ** 0.5, lambda n, p, c: 0.003,
                       lambda tokens: 0.001, threshold_tokens=64)
    work = [SimRequest(i * 0.01, 10 + (i * 37) % 200, 1 + i % 9) for i in range(500)]
    result = Simulation(spec, work).run()
    assert all(o.e2e_s is not None and o.ttft_s <= o.e2e_s for o in result.outcomes)
    assert {o.path for o in result.outcomes} == {"decode_local", "disaggregated"}
    gaps = sum(count for _, _, count in result.token_gaps)
    assert gaps == sum(r.output_tokens - 1 for r in work)   # every token after the first


def test_a_weighted_percentile_counts_each_value_its_weight():
    assert weighted_percentile([(0.01, 90), (1.0, 10)], 90) == 0.01
    assert weighted_percentile([(0.01, 90), (1.0, 10)], 95) == 1.0
    assert weighted_percentile([], 95) == 0.0


def test_a_slice_keeps_each_replicas_share_of_the_traffic():
    assert slice_of(300, 100, 8) == (24, 8, 0.08)
    assert slice_of(3, 2, 8) == (3, 2, 1.0)


def test_the_day_has_its_peak_mean_ratio_and_night_floor():
    shape = diurnal_shape(6, night_share=0.05)
    assert max(shape) == 1.0 and min(shape) == pytest.approx(0.05, abs=1e-3)
    assert len(shape) / sum(shape) == pytest.approx(6, rel=1e-6)
    with pytest.raises(ValueError):
        diurnal_shape(6, night_share=0.2)


def test_the_workload_has_the_benchmarks_lengths_and_rate():
    work = requests(WorkloadSpec(rate=50, num_requests=4000, seed=1))
    assert statistics.mean(r.prompt_tokens for r in work) == pytest.approx(500, rel=0.1)
    assert statistics.mean(r.output_tokens for r in work) == pytest.approx(300, rel=0.1)
    assert len(work) / work[-1].arrival_s == pytest.approx(50, rel=0.1)


# -- the search ---------------------------------------------------------------------------

SMALL = ModelShape.from_hf_config({**LLAMA_3_1_70B, "num_hidden_layers": 8,
                                   "hidden_size": 2048, "intermediate_size": 7168,
                                   "num_attention_heads": 16, "num_key_value_heads": 4})


def small_inputs(rate: float = 60.0) -> PlanInputs:
    cost = Roofline(SMALL, CATALOG["a100"], tp=1, mfu=0.1, mbu=0.2, step_overhead_s=0.01)
    return PlanInputs(cost, cost, EngineLimits(2048, 256), EngineLimits(1024, 128),
                      Transfer(25e9), WorkloadSpec(rate=rate, seed=2),
                      slo=Slo(ttft_p95_s=0.5, itl_p95_s=0.05), sim_seconds=25,
                      warmup_s=5, slice_replicas=4)


def test_the_search_finds_a_cluster_that_meets_the_slos_and_none_smaller_does():
    inputs = small_inputs()
    plan = search(inputs)
    assert plan.prediction.meets(inputs.slo)
    assert plan.prediction.prefill_replicas >= bracket(inputs)[0]
    answer = figures(plan, peak_to_mean=6)
    assert answer["gpus"] == plan.prediction.prefill_replicas + plan.prediction.decode_replicas
    assert 0 < answer["gpu_hours_per_day"] < answer["gpu_hours_per_day_at_peak_size"]
    by_hour = plan.gpus_by_hour(peak_to_mean=6)
    assert len(by_hour) == 24 and by_hour[0] == plan.gpus     # the peak hour: the plan
    assert all(1 <= p <= by_hour[0][0] and 1 <= d <= by_hour[0][1] for p, d in by_hour)
    assert sum(map(sum, by_hour)) == answer["gpu_hours_per_day"]
    # the last candidate tried smaller than the answer, in either pool, missed
    smaller = [p for p in plan.tried if p.prefill_replicas <= plan.prediction.prefill_replicas
               and p.decode_replicas <= plan.prediction.decode_replicas and p != plan.prediction]
    assert smaller and not any(p.meets(inputs.slo) for p in smaller)


def test_a_prompt_alone_takes_its_chunks_steps_each_after_the_ones_before():
    """Each chunk's step as the simulator accounts it: its pairs over the tokens before
    it, and those tokens as the context it reads (step_time adds the chunk's own)."""
    inputs = small_inputs()
    cost, budget = inputs.prefill_cost, inputs.prefill.max_num_batched_tokens
    assert prefill_alone_s(cost, budget, 100) == cost.step_time(100, prefill_pairs(100), 0)
    # two chunks: the second attends to the first
    assert prefill_alone_s(cost, budget, budget + 10) == pytest.approx(
        cost.step_time(budget, prefill_pairs(budget), 0)
        + cost.step_time(10, prefill_pairs(10, budget), budget))
    # cached tokens are not computed, but the last token always is
    assert prefill_alone_s(cost, budget, 2 * budget, budget) == pytest.approx(
        cost.step_time(budget, prefill_pairs(budget, budget), budget))
    assert prefill_alone_s(cost, budget, 100, 100) == cost.step_time(
        1, prefill_pairs(1, 99), 99)


def test_an_slo_under_the_p95_prompts_own_prefill_is_refused_before_any_simulation():
    """However large the pool, no p95 TTFT is below the p95 of the prompts' prefill
    alone: the search says so at once instead of growing the pool for 40 steps."""
    inputs = small_inputs()
    floor, prompt, q = ttft_floor(inputs)
    assert q == 95 and 0 < floor < inputs.slo.ttft_p95_s and prompt > 0
    assert unreachable_ttft(inputs) is None
    tight = replace(inputs, slo=Slo(ttft_p95_s=floor * 0.9, itl_p95_s=0.05))
    reason = unreachable_ttft(tight)
    assert reason is not None and f"p95 of the workload's first prompts ({prompt:,} tokens)" \
        in reason
    with pytest.raises(RuntimeError, match="no cluster can meet the p95 TTFT SLO"):
        search(tight)
    # and no plan met an SLO under the floor: the p95 TTFT of the plan above it
    assert search(inputs).prediction.ttft_s["p95"] >= floor


def test_the_floor_leaves_out_what_may_be_cached_and_later_turns():
    """A bound, never above what a cluster could reach: a shared head is taken as cached,
    and with conversations of three turns only the first turns' p85 bounds the p95 of
    all (later turns' histories may be cached)."""
    inputs = small_inputs()
    floor, _, _ = ttft_floor(inputs)
    headed = replace(inputs, workload=replace(inputs.workload, shared_prefix_tokens=200,
                                              prefix_groups=2))
    assert ttft_floor(headed)[0] < floor
    turns = replace(inputs, workload=replace(inputs.workload, turns=3))
    turns_floor, _, q = ttft_floor(turns)
    assert q == 85 and turns_floor < floor
    assert ttft_floor(replace(inputs, workload=replace(inputs.workload, turns=20)))[0] == 0


def test_the_planned_cluster_is_a_config_pdserve_loads():
    plan = search(small_inputs(rate=30))
    base = yaml.safe_load((REPO / "ray_configs/prod-70b.yaml").read_text())
    document = config_document(plan, base)
    config = parse_config(document)
    assert config.prefill.replicas == plan.prediction.prefill_replicas
    assert config.decode.replicas == plan.prediction.decode_replicas
    assert config.router.disaggregation_threshold_tokens == 256
    assert config.autoscaling.prefill.max_replicas >= plan.prediction.prefill_replicas


def test_a_prefix_cache_hit_spares_the_prefill_its_share_of_the_prompt():
    spec = WorkloadSpec(rate=50, num_requests=200, seed=3)
    assert all(r.cached_tokens == int(r.prompt_tokens * 0.4)
               for r in requests(spec, prefix_hit=0.4))
    with pytest.raises(ValueError):
        requests(spec, prefix_hit=1.0)
    inputs = small_inputs()
    cached = replace(inputs, prefix_hit=0.5)
    assert bracket(cached)[0] < bracket(inputs)[0]
    busy = [predict(i, 4, 4).prefill_busy for i in (inputs, cached)]
    assert busy[1] < 0.7 * busy[0]


def test_a_response_cache_hit_keeps_its_requests_off_the_engines():
    inputs = replace(small_inputs(), response_cache_hit=0.5)
    assert inputs.engine_rate == 30
    assert bracket(inputs) == bracket(replace(small_inputs(), workload=replace(
        inputs.workload, rate=30)))
    with pytest.raises(ValueError):
        replace(inputs, response_cache_hit=1.0)


# -- calibration and replay -------------------------------------------------------------


def test_the_fit_recovers_a_step_cost_and_keeps_every_term_non_negative():
    truth = FittedCost(base=0.004, per_token=2e-5, per_pair=1e-9, per_context=3e-7)
    rng = random.Random(5)
    samples = []
    for _ in range(200):
        new, context = rng.randint(1, 4096), rng.randint(0, 20_000)
        pairs = prefill_pairs(new, context)
        samples.append(StepSample(new, pairs, context, truth.step_time(new, pairs, context)
                                  * rng.uniform(0.98, 1.02)))
    fitted = fit(samples)
    for term in ("base", "per_token", "per_context"):
        assert getattr(fitted, term) == pytest.approx(getattr(truth, term), rel=0.1)
    assert max(abs(e) for e in relative_errors(fitted, samples)) < 0.05
    # time that falls as the context grows is noise to this model: that term is dropped
    falling = [StepSample(10, 10, c, 0.01 - 1e-7 * c) for c in range(0, 50_000, 1000)]
    assert min(fit(falling).as_dict().values()) >= 0


def served_cluster() -> Served:
    pool = {"cost": {"base": 0.003, "per_token": 2e-5, "per_pair": 0.0, "per_context": 0.0},
            "max_num_batched_tokens": 2048, "max_num_seqs": 64, "kv_capacity_tokens": 10**6}
    return Served(1, 1, 0, pool, pool, transfer_s=0.002)


def recorded(served: Served, requests: list[SimRequest], cost: ServingCost) -> list[dict]:
    """The records a run would leave if the serving layer cost ``cost``: the replay's own
    engines, with the serving layer's time added to each request at the load it streams."""
    seen = simulate(served, requests, cost)
    spec = ClusterSpec(1, 1, step_cost(served.prefill),
                       step_cost(served.decode, cost.decode_factor(seen.streamed_per_s)),
                       lambda prompt: 0.002, prefill_limits=EngineLimits(2048, 64, 10**6),
                       decode_limits=EngineLimits(2048, 64, 10**6))
    result = Simulation(spec, requests, random.Random(0)).run()
    records = []
    for r, o in zip(requests, result.outcomes, strict=True):
        added = cost.ttft_added(r.prompt_tokens, seen.streamed_per_s)
        records.append({"sent_at": r.arrival_s, "prompt_tokens": r.prompt_tokens,
                        "output_tokens": r.output_tokens,
                        "first_token_at": r.arrival_s + o.ttft_s + added,
                        "token_times": [r.arrival_s + o.e2e_s + added]})
    return records


def requests_at(rate: float, count: int = 160) -> list[SimRequest]:
    return [SimRequest(i / rate, 100 + (i * 53) % 700, 10 + i % 40) for i in range(count)]


def test_a_replay_recovers_the_serving_layers_constants_from_a_run_they_made():
    served = served_cluster()
    requests = requests_at(4.0)
    truth_cost = ServingCost(ttft_s=0.030, ttft_per_prompt_token_s=2e-5, decode_slowdown=1.6)
    records = recorded(served, requests, truth_cost)
    assert trace_requests(records) == requests
    fitted = fit_serving(served, [(records, 0)])
    assert fitted.decode_slowdown == pytest.approx(1.6, rel=0.05)
    assert fitted.ttft_s == pytest.approx(0.030, abs=0.005)
    assert fitted.ttft_per_prompt_token_s == pytest.approx(2e-5, rel=0.2)
    assert fitted.ttft_load_s == fitted.decode_load_s == 0    # one load: constants
    truth = measured(records)
    seen = simulate(served, requests, fitted)
    for key in ("ttft_p50", "ttft_p95", "e2e_p50"):
        assert getattr(seen, key) == pytest.approx(getattr(truth, key), rel=0.05)
    assert seen.streamed_per_s == pytest.approx(truth.streamed_per_s, rel=0.02)


def test_runs_at_two_loads_fit_the_serving_layers_growth_and_predict_a_third():
    """A serving layer that slows as it streams more: fitted on runs at 2 and 5 requests/s,
    the replay predicts the run at 8/s; constants fitted at 2/s alone under-predict it."""
    served = served_cluster()
    truth_cost = ServingCost(ttft_s=0.030, ttft_per_prompt_token_s=1e-5,
                             decode_slowdown=1.3, ttft_load_s=1.5e-3, decode_load_s=8e-4)
    runs = {rate: recorded(served, requests_at(rate), truth_cost) for rate in (2.0, 5.0, 8.0)}
    fitted = fit_serving(served, [(runs[2.0], 0), (runs[5.0], 0)])
    assert fitted.ttft_load_s == pytest.approx(1.5e-3, rel=0.15)
    assert fitted.decode_load_s == pytest.approx(8e-4, rel=0.15)
    held_out = measured(runs[8.0])
    predicted = simulate(served, trace_requests(runs[8.0]), fitted)
    constants = simulate(served, trace_requests(runs[8.0]),
                         fit_serving(served, [(runs[2.0], 0)]))
    for key in ("ttft_p50", "e2e_p50"):
        assert getattr(predicted, key) == pytest.approx(getattr(held_out, key), rel=0.1)
        assert getattr(constants, key) < 0.85 * getattr(held_out, key)


def test_the_serving_cost_grows_with_load_and_saturates_rather_than_turning_negative():
    cost = ServingCost(ttft_s=0.02, ttft_per_prompt_token_s=1e-5, decode_slowdown=1.2,
                       ttft_load_s=1e-3, decode_load_s=5e-4)
    assert cost.ttft_added(1000, 0) == pytest.approx(0.03)
    assert cost.ttft_added(1000, 500) == pytest.approx(0.06)          # half busy: twice
    assert cost.decode_factor(1000) == pytest.approx(2.4)
    assert cost.ttft_added(1000, 10**6) == pytest.approx(0.03 / (1 - MAX_BUSY))
    # the fit: exact points give the cost back; one load or a falling line, constants
    points = [LoadPoint(r, cost.decode_factor(r), 0.02 / (1 - 1e-3 * r),
                        1e-5 / (1 - 1e-3 * r)) for r in (100, 300, 600)]
    fitted = fit_serving_cost(points)
    for field_name in ("ttft_s", "ttft_per_prompt_token_s", "decode_slowdown",
                       "ttft_load_s", "decode_load_s"):
        assert getattr(fitted, field_name) == pytest.approx(getattr(cost, field_name))
    # runs at one load (their rates within DISTINCT_LOADS) fit constants, whatever noise
    # they differ by
    noisy = fit_serving_cost([LoadPoint(278, 1.5, 0.03, 0), LoadPoint(280, 1.6, 0.02, 0)])
    assert (noisy.decode_load_s, noisy.ttft_load_s) == (0, 0)
    assert noisy.decode_slowdown == pytest.approx(1.55)
    falling = fit_serving_cost([LoadPoint(100, 2.0, 0.04, 0), LoadPoint(300, 1.0, 0.02, 0)])
    assert (falling.decode_slowdown, falling.decode_load_s) == (1.5, 0.0)
    assert (falling.ttft_s, falling.ttft_load_s) == pytest.approx((0.03, 0.0))
    with pytest.raises(ValueError):
        fit_serving_cost([])


def test_the_residual_slope_follows_the_prompt_and_ignores_a_queueing_outlier():
    prompts = list(range(100, 2100, 100))
    residuals = [0.02 + 1e-5 * p for p in prompts]
    assert residual_slope(prompts, residuals) == pytest.approx(1e-5)
    residuals[3] += 0.5             # one request that waited: the weighted median holds
    assert residual_slope(prompts, residuals) == pytest.approx(1e-5)
    # time that falls with the prompt is noise: no negative slope
    assert residual_slope(prompts, [0.05 - 1e-5 * p for p in prompts]) == 0
    assert residual_slope([500] * 5, [0.01, 0.02, 0.03, 0.04, 0.05]) == 0   # one length


def test_a_measured_transfer_is_the_line_through_bench_transfers_reads():
    """`pdserve bench transfer` rows (GB/s per size) give back the latency and bandwidth
    they were made with; other transports' and block sizes' rows are left out."""
    latency, bandwidth = 0.0004, 12e9

    def row(mib: int, transport: str = "cma", block_kib: int = 16, slower: float = 1.0):
        seconds = (latency + mib * 2**20 / bandwidth) * slower
        return {"transport": transport, "mib": mib, "block_kib": block_kib,
                "nixl_gbps": mib * 2**20 / seconds / 1e9}

    rows = [row(m) for m in (1, 4, 16, 64)] + [row(16, "tcp", slower=8),
                                               row(64, block_kib=1024, slower=0.5)]
    transfer = measured_transfer(rows, "cma")
    assert transfer.latency_s == pytest.approx(latency, rel=1e-6)
    assert transfer.bandwidth == pytest.approx(bandwidth, rel=1e-6)
    assert transfer.time(8 * 2**20) == pytest.approx(latency + 8 * 2**20 / bandwidth)
    with pytest.raises(ValueError, match="fewer than two sizes"):
        measured_transfer(rows, "tcp")
    # a replay then times each prompt's transfer by its KV bytes
    served = replace(served_cluster(), transfer=transfer, kv_bytes_per_token=4096)
    assert served.transfer_time(2048) == pytest.approx(transfer.time(2048 * 4096))
    assert served_cluster().transfer_time(2048) == 0.002   # none measured: the constant


def test_a_shared_system_prompt_takes_work_off_the_prefill_pool_in_a_plan():
    """The same lengths behind 1,024-token heads: four heads shared by every request, or
    one head each (nothing shared). The simulated prefix caches compute a shared head
    once per engine, so the prefill engines are busy for a fraction of the time."""
    plain = small_inputs(rate=20)

    def with_heads(groups: int) -> PlanInputs:
        return replace(plain, workload=replace(plain.workload, shared_prefix_tokens=1024,
                                               prefix_groups=groups))

    shared, unshared = predict(with_heads(4), 3, 3), predict(with_heads(10**6), 3, 3)
    assert shared.prefill_busy < 0.5 * unshared.prefill_busy
    assert shared.ttft_s["p50"] < unshared.ttft_s["p50"]


def test_configurations_cover_each_threshold_and_tp_and_refuse_what_cannot_fit():
    inputs = replace(small_inputs(), transfer=Transfer(8e9))    # 8 GB/s: one GPU's link
    found = configurations(inputs, (0, 512), (1, 2), (1,))
    assert list(found) == [f"threshold {t}, TP{p} + TP1" for t in (0, 512) for p in (1, 2)]
    two = found["threshold 512, TP2 + TP1"]
    assert (two.threshold_tokens, two.prefill_cost.tp, two.decode_cost.tp) == (512, 2, 1)
    assert two.transfer.bandwidth == 16e9              # a link per prefill GPU
    tight = replace(inputs, workload=replace(inputs.workload, max_model_len=10**9))
    assert all(isinstance(reason, str) and "room" in reason
               for reason in configurations(tight, (0,), (1,), (1,)).values())


def test_the_cheapest_configuration_is_the_plan_and_none_without_one():
    plans = {"twice the rate": search(small_inputs(rate=60)),
             "the rate": search(small_inputs(rate=30)), "cannot": "no room"}
    assert plans["the rate"].dollars_per_hour() < plans["twice the rate"].dollars_per_hour()
    assert cheapest(plans) == "the rate"
    with pytest.raises(RuntimeError, match="cannot: no room"):
        cheapest({"cannot": "no room"})
