"""The planner on a recorded trace (tools/planner/trace_workload.py, pure): the trace's
lengths drawn as its joint distribution, clipped to the context and counted; arrivals at
the asked rate with the trace's burstiness; ``pdserve plan --trace``'s workload; and a
small plan that sizes a pool of longer prompts' prefill larger than the drawn one's.

The traces are the excerpts of tests/unit/data/traces (40 requests each, their README).
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from cluster.percentile import percentile
from tools.bench.trace import TraceRequest, read_trace
from tools.bench.workload import WorkloadSpec
from tools.planner.arguments import add_parser
from tools.planner.cost_model import Roofline, Transfer
from tools.planner.des import EngineLimits
from tools.planner.hardware import CATALOG
from tools.planner.inputs import MAX_MODEL_LEN, workload_from
from tools.planner.model import LLAMA_3_1_70B, ModelShape
from tools.planner.output import figures, table
from tools.planner.search import PlanInputs, Slo, search
from tools.planner.trace_workload import (
    TraceWorkloadSpec,
    gamma_arrivals,
    interarrival_cv2,
    peak_to_mean,
    traffic_from,
    with_trace,
)
from tools.planner.workload import description, mean_lengths, requests

TRACES = Path(__file__).parent / "data" / "traces"


def trace(name: str) -> list[TraceRequest]:
    with (TRACES / name).open() as lines:
        return read_trace(lines)


CONV = trace("azure_llm_2023_conv.csv")
CODE = trace("azure_llm_2023_code.csv")            # prompts ~2,600 tokens, bursty
MOONCAKE = trace("mooncake_fast25_conversation.jsonl")   # prompts up to 87K tokens


def counts_per_second(arrivals: list[float]) -> list[int]:
    counts = [0] * int(arrivals[-1])
    for at in arrivals:
        if int(at) < len(counts):
            counts[int(at)] += 1
    return counts


def share_at_least(values: list[int], floor: int) -> float:
    return sum(value >= floor for value in values) / len(values)


# -- lengths --------------------------------------------------------------------------------

@pytest.mark.parametrize("recorded", [CONV, CODE], ids=["conv", "code"])
def test_the_drawn_lengths_are_the_traces_pairs_with_its_means_and_tail(recorded):
    spec = with_trace(WorkloadSpec(rate=50, num_requests=20_000, seed=1), recorded, "t")
    drawn = requests(spec)
    pairs = {(r.prompt_tokens, r.output_tokens) for r in recorded}
    # the joint distribution: every drawn request is one recorded request, and all come
    assert {(r.prompt_tokens, r.output_tokens) for r in drawn} == pairs
    for field in ("prompt_tokens", "output_tokens"):
        trace_values = sorted(getattr(r, field) for r in recorded)
        drawn_values = sorted(getattr(r, field) for r in drawn)
        assert statistics.mean(drawn_values) == pytest.approx(
            statistics.mean(trace_values), rel=0.03)
        # the tail: as many draws at or above the trace's p90 as there are in the trace
        tail = percentile(trace_values, 90)
        assert share_at_least(drawn_values, tail) == pytest.approx(
            share_at_least(trace_values, tail), abs=0.01)
        assert max(drawn_values) == max(trace_values)
    # the search's own means (its bracket, the day's targets) are the trace's, exactly
    assert mean_lengths(spec) == pytest.approx(
        (statistics.mean(r.prompt_tokens for r in recorded),
         statistics.mean(r.output_tokens for r in recorded)))


def test_prompts_too_long_for_the_context_are_clipped_and_counted():
    spec = with_trace(WorkloadSpec(rate=50, num_requests=2_000, seed=1), MOONCAKE, "mc")
    too_long = sum(r.prompt_tokens + max(1, r.output_tokens) > spec.max_model_len
                   for r in MOONCAKE)
    assert too_long > 0 and spec.trace.clipped == too_long
    assert all(r.prompt_tokens + r.output_tokens <= spec.max_model_len
               for r in requests(spec))
    said = description(spec)
    assert (said["clipped"], said["requests"], said["max_model_len"]) == (
        too_long, len(MOONCAKE), spec.max_model_len)
    with pytest.raises(ValueError, match="fitted to"):   # refitting is with_trace's job
        replace(spec, max_model_len=4096)


# -- arrivals -------------------------------------------------------------------------------

def test_the_burstiness_measures_on_a_hand_made_trace():
    even = [i * 0.5 for i in range(41)]
    assert interarrival_cv2(even) == pytest.approx(0)
    assert peak_to_mean(even, 10) == pytest.approx(1)
    clumped = [t for i in range(20) for t in (i * 1.0, i * 1.0)]   # pairs at once
    assert interarrival_cv2(clumped) == pytest.approx(1.0, rel=0.06)   # gaps 0, 1, 0, 1...
    assert peak_to_mean(even[:5], 10) is None               # shorter than one window
    with pytest.raises(ValueError):
        interarrival_cv2([3.0, 3.0])


@pytest.mark.parametrize("recorded", [CONV, CODE], ids=["conv", "code"])
def test_arrivals_come_at_the_asked_rate_with_the_traces_cv2(recorded):
    traffic = traffic_from(recorded, "t", 9216)
    arrivals = traffic.arrival_times(200.0, 50_000, random.Random(3))
    assert len(arrivals) / arrivals[-1] == pytest.approx(200.0, rel=1e-9)
    assert interarrival_cv2(arrivals) == pytest.approx(traffic.interarrival_cv2, rel=0.15)
    assert arrivals == traffic.arrival_times(200.0, 50_000, random.Random(3))   # seeded
    assert arrivals != traffic.arrival_times(200.0, 50_000, random.Random(4))


def test_a_bursty_traces_arrivals_are_burstier_than_poisson():
    traffic = traffic_from(CODE, "code", 9216)
    assert traffic.interarrival_cv2 > 10                    # the excerpt: ~25
    bursty = traffic.arrival_times(200.0, 50_000, random.Random(3))
    poisson = gamma_arrivals(200.0, 1.0, 50_000, random.Random(3))
    assert interarrival_cv2(poisson) == pytest.approx(1.0, rel=0.05)
    # the per-second counts of the trace's process swing far more than Poisson's
    spread = [statistics.pstdev(counts_per_second(a)) / 200.0 for a in (bursty, poisson)]
    assert spread[0] > 3 * spread[1]
    spec = with_trace(WorkloadSpec(rate=200, num_requests=5_000, seed=3), CODE, "code")
    assert [r.arrival_s for r in requests(spec)] == traffic.arrival_times(
        200.0, 5_000, random.Random(3))                      # the planner's draw is this


# -- pdserve plan --trace -------------------------------------------------------------------

def parsed(*argv: str):
    commands = argparse.ArgumentParser().add_subparsers(dest="command")
    add_parser(commands)
    return commands.choices["plan"].parse_args(list(argv))


def test_plan_trace_sizes_the_reference_rate_with_the_traces_workload():
    spec = workload_from(parsed("--trace", str(TRACES / "azure_llm_2023_conv.csv"),
                                "--trace-format", "azure"))
    assert isinstance(spec, TraceWorkloadSpec)
    assert (spec.rate, spec.max_model_len) == (5200.0, MAX_MODEL_LEN)
    assert spec.trace.name == "azure_llm_2023_conv.csv" and spec.trace.requests == 40
    assert not isinstance(workload_from(parsed()), TraceWorkloadSpec)
    with pytest.raises(ValueError, match="one turn"):
        workload_from(parsed("--trace", str(TRACES / "azure_llm_2023_conv.csv"),
                             "--turns", "3"))
    with pytest.raises(ValueError, match="one --trace"):
        workload_from(parsed("--trace", "a.csv", "--trace", "b.csv"))


SMALL = ModelShape.from_hf_config({**LLAMA_3_1_70B, "num_hidden_layers": 8,
                                   "hidden_size": 2048, "intermediate_size": 7168,
                                   "num_attention_heads": 16, "num_key_value_heads": 4})


def small_inputs(workload: WorkloadSpec) -> PlanInputs:
    cost = Roofline(SMALL, CATALOG["a100"], tp=1, mfu=0.1, mbu=0.2, step_overhead_s=0.01)
    return PlanInputs(cost, cost, EngineLimits(2048, 256), EngineLimits(1024, 128),
                      Transfer(25e9), workload, slo=Slo(ttft_p95_s=0.5, itl_p95_s=0.05),
                      sim_seconds=20, warmup_s=5, slice_replicas=4)


def test_a_trace_of_longer_prompts_and_shorter_answers_plans_more_prefill_less_decode():
    drawn = WorkloadSpec(rate=20, seed=2)
    synthetic = search(small_inputs(drawn))
    traced = search(small_inputs(with_trace(drawn, CODE, "code")))
    assert traced.prediction.meets(traced.inputs.slo)
    # the code excerpt's prompts average ~2,600 tokens against ~500, answers ~23 against ~300
    assert traced.prediction.prefill_replicas > synthetic.prediction.prefill_replicas
    assert traced.prediction.decode_replicas <= synthetic.prediction.decode_replicas
    printed = table(figures(traced, peak_to_mean=6))
    assert "trace code: 40 requests" in printed and "CV²" in printed
    assert "reference (drawn)" in table(figures(synthetic, peak_to_mean=6))
