"""The planner's validation that needs no cluster (docs/planning.md, "Validation"):

    .venv/bin/python tools/experiments/plan_checks.py [pdserve plan's options]

1. the simulator against M/D/1 (one prefill replica, a fixed prompt, Poisson arrivals),
   five seeds at each load, so that its error is seen beside the estimate's own noise;
2. the step cost model against the independent closed-form roofline for Llama-3.1-70B on
   H100s (../shared/notes/cost-levers-planner.md, B2);
3. the slice: the planned cluster simulated at 4, 8, 16 and 32 replicas of its smaller pool;
4. what a planner without queueing answers (the search's bracket: each pool's throughput
   by the roofline at full batches) beside the simulated answer.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace

from tools.planner.arguments import add_parser
from tools.planner.des import ClusterSpec, EngineLimits, SimRequest, Simulation
from tools.planner.inputs import inputs_from
from tools.planner.model import prefill_pairs
from tools.planner.search import bracket, predict, search


def md1_error(load: float, seed: int, count: int = 100_000, service: float = 0.1) -> float:
    rng, now, work = random.Random(seed), 0.0, []
    for _ in range(count):
        now += rng.expovariate(load / service)
        work.append(SimRequest(now, 1000, 1))
    spec = ClusterSpec(1, 1, lambda *_: service, lambda *_: 0.001, lambda tokens: 0.0,
                       prefill_limits=EngineLimits(max_num_batched_tokens=1000),
                       report_interval_s=0)
    result = Simulation(spec, work).run()
    measured = statistics.mean(o.prefill_done_s for o in result.outcomes)
    return measured / (service * (1 + load / (2 * (1 - load)))) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    add_parser(commands)
    args = parser.parse_args(["plan", *sys.argv[1:]])
    inputs = inputs_from(args)

    print("## 1. M/D/1: mean time to the end of the prefill, simulated / theory - 1")
    print("| load | five seeds | mean |\n|---|---|---|")
    for load in (0.5, 0.7, 0.8):
        errors = [md1_error(load, seed) for seed in range(5)]
        print(f"| {load} | {', '.join(f'{e:+.2%}' for e in errors)} | "
              f"{statistics.mean(errors):+.2%} |")

    print("\n## 2. The step cost model against the closed form (B2)")
    # The closed form has no all-reduce term: compared without it, then shown with it
    model, cost = inputs.decode_cost.model, inputs.decode_cost
    bare = replace(cost, allreduce_efficiency=0.0)
    flops = model.matmul_flops(500) + model.attention_flops(prefill_pairs(500))
    prefill_gpus = 5200 * flops / (cost.accelerator.flops(cost.compute_dtype) * cost.mfu)
    step = bare.step_time(608, 608 * 650, 608 * 650)
    decode_gpus = 5200 * 300 / (608 / step) * cost.tp
    print("| figure | closed form | planner |\n|---|---|---|")
    print(f"| prefill FLOPs, 500 tokens | 70.9 T | {flops / 1e12:.1f} T |")
    print(f"| prefill GPUs at 50% MFU, every request | 745 | {prefill_gpus:.0f} |")
    print(f"| TP{cost.tp} decode step, batch 608 | 46 ms | {step * 1000:.1f} ms |")
    print(f"| decode GPUs at that batch | ~476 | {decode_gpus:.0f} |")
    with_allreduce = cost.step_time(608, 608 * 650, 608 * 650)
    print(f"| the same step with its 160 all-reduces (the planner's default) | | "
          f"{with_allreduce * 1000:.1f} ms |")

    plan = search(inputs)
    chosen = plan.prediction
    print("\n## 3. The slice: the planned cluster "
          f"({chosen.prefill_replicas} prefill, {chosen.decode_replicas} decode replicas)")
    print("| slice (smaller pool) | simulated P, D | TTFT p50 / p95 ms | ITL p95 ms | s |")
    print("|---|---|---|---|---|")
    for size in (4, 8, 16, 32, 64):
        started = time.monotonic()
        sized = type(inputs)(**{**inputs.__dict__, "slice_replicas": size})
        seen = predict(sized, chosen.prefill_replicas, chosen.decode_replicas)
        print(f"| {size} | {seen.simulated[0]}, {seen.simulated[1]} | "
              f"{seen.ttft_s['p50'] * 1000:.0f} / {seen.ttft_s['p95'] * 1000:.0f} | "
              f"{seen.itl_s['p95'] * 1000:.1f} | {time.monotonic() - started:.1f} |")

    prefill, decode = bracket(inputs)
    at_bracket = predict(inputs, prefill, decode)
    print("\n## 4. Without queueing (the bracket) and with it (the plan)")
    print("| | prefill replicas | decode replicas | GPUs | TTFT p95 there, ms |")
    print("|---|---|---|---|---|")
    for name, seen in (("roofline at full batches", at_bracket), ("simulated plan", chosen)):
        gpus = (seen.prefill_replicas * inputs.prefill_cost.tp
                + seen.decode_replicas * inputs.decode_cost.tp)
        print(f"| {name} | {seen.prefill_replicas} | {seen.decode_replicas} | {gpus} | "
              f"{seen.ttft_s['p95'] * 1000:.0f} |")


if __name__ == "__main__":
    main()
