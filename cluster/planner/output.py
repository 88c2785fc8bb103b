"""What a plan says (pure): its figures as a dict and a table, and the pdserve config of
the planned cluster, written over a base config (ray_configs/prod-70b.yaml by default)."""

from __future__ import annotations

import copy
import math
from typing import Any

from cluster.planner.search import Plan


def figures(plan: Plan, peak_to_mean: float) -> dict[str, Any]:
    """The plan's answer: replicas and GPUs per pool, the cost at peak and over a day, and
    the predicted latencies at peak."""
    prediction = plan.prediction
    prefill_gpus, decode_gpus = plan.gpus
    inputs = plan.inputs
    return {
        "rate_per_s": inputs.workload.rate,
        "accelerator": inputs.prefill_cost.accelerator.name,
        "prefill": {"replicas": prediction.prefill_replicas, "tp": inputs.prefill_cost.tp,
                    "gpus": prefill_gpus, "busy": prediction.prefill_busy},
        "decode": {"replicas": prediction.decode_replicas, "tp": inputs.decode_cost.tp,
                   "gpus": decode_gpus, "busy": prediction.decode_busy},
        "gpus": prefill_gpus + decode_gpus,
        "p_to_d_gpus": prefill_gpus / decode_gpus,
        "dollars_per_hour_at_peak": plan.dollars_per_hour(),
        "gpu_hours_per_day": plan.gpu_hours_per_day(peak_to_mean),
        "gpu_hours_per_day_at_peak_size": 24 * (prefill_gpus + decode_gpus),
        "ttft_s": prediction.ttft_s,
        "itl_s": prediction.itl_s,
        "slo": {"ttft_p95_s": inputs.slo.ttft_p95_s, "itl_p95_s": inputs.slo.itl_p95_s},
        "simulated_replicas": list(prediction.simulated),
        "candidates_simulated": len(plan.tried),
    }


def table(answer: dict[str, Any]) -> str:
    ms = {name: {q: f"{value * 1000:.0f}" for q, value in answer[name].items()}
          for name in ("ttft_s", "itl_s")}
    rows = [
        ("prefill pool", f"{answer['prefill']['replicas']} replicas x TP{answer['prefill']['tp']}"
                         f" = {answer['prefill']['gpus']} {answer['accelerator']}"),
        ("decode pool", f"{answer['decode']['replicas']} replicas x TP{answer['decode']['tp']}"
                        f" = {answer['decode']['gpus']} {answer['accelerator']}"),
        ("GPUs at peak (P:D)", f"{answer['gpus']} ({answer['p_to_d_gpus']:.2f} : 1)"),
        ("$/hour at peak", f"{answer['dollars_per_hour_at_peak']:,.0f}"),
        ("GPU-hours a day (scaled to the day's rate / held at peak size)",
         f"{answer['gpu_hours_per_day']:,.0f} / {answer['gpu_hours_per_day_at_peak_size']:,.0f}"),
        ("TTFT p50 / p95 / p99, ms", " / ".join(ms["ttft_s"].values())
         + f" (SLO p95 {answer['slo']['ttft_p95_s'] * 1000:.0f})"),
        ("ITL p50 / p95 / p99, ms", " / ".join(ms["itl_s"].values())
         + f" (SLO p95 {answer['slo']['itl_p95_s'] * 1000:.0f})"),
        ("share of time engines are busy, prefill / decode",
         f"{answer['prefill']['busy']:.2f} / {answer['decode']['busy']:.2f}"),
    ]
    return "\n".join(["| | plan |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def config_document(plan: Plan, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a pdserve config document) with the planned pools: replicas, tensor
    parallelism, batch limits, the threshold, the SLOs, and autoscaling bounds and
    standby floors that hold the planned size at peak."""
    document = copy.deepcopy(base)
    inputs = plan.inputs
    sizes = {"prefill": (plan.prediction.prefill_replicas, inputs.prefill_cost.tp),
             "decode": (plan.prediction.decode_replicas, inputs.decode_cost.tp)}
    for pool, (replicas, tp) in sizes.items():
        section = document.setdefault(pool, {})
        section["replicas"] = replicas
        section["tensor_parallel_size"] = tp
        scaling = document.get("autoscaling", {}).get(pool)
        if scaling is not None:
            scaling["max_replicas"] = max(scaling.get("max_replicas", 0),
                                          math.ceil(replicas * 1.05))
            scaling["min_replicas"] = min(scaling.get("min_replicas", 1), replicas)
            for window in scaling.get("standby", {}).get("windows", []):
                window["min_replicas"] = replicas
    document["engine"]["max_num_batched_tokens"] = inputs.prefill.max_num_batched_tokens
    document["decode"]["max_num_batched_tokens"] = inputs.decode.max_num_batched_tokens
    document["decode"].setdefault("engine_overrides", {})["max_num_seqs"] = \
        inputs.decode.max_num_seqs
    if inputs.decode_cost.kv_dtype == "fp8":
        document["engine"]["kv_cache_dtype"] = "fp8"
    document.setdefault("router", {})["disaggregation_threshold_tokens"] = \
        inputs.threshold_tokens
    document.setdefault("slo", {}).update(ttft_p95_s=inputs.slo.ttft_p95_s,
                                          itl_p95_s=inputs.slo.itl_p95_s)
    return document


def lever_table(plans: dict[str, Plan]) -> str:
    """Each lever's plan beside the first (the plan as given): GPUs, cost, and the TTFT."""
    base = next(iter(plans.values()))
    lines = ["| lever | prefill + decode GPUs | $/hour at peak | GPUs saved | TTFT p95 |",
             "|---|---|---|---|---|"]
    for name, plan in plans.items():
        prefill, decode = plan.gpus
        saved = 1 - (prefill + decode) / sum(base.gpus)
        lines.append(f"| {name} | {prefill} + {decode} | {plan.dollars_per_hour():,.0f} | "
                     f"{saved:.0%} | {plan.prediction.ttft_s['p95'] * 1000:.0f} ms |")
    return "\n".join(lines)


def configuration_table(plans: dict[str, Plan | str], chosen: str,
                        peak_to_mean: float) -> str:
    """Each configuration searched: its plan's GPUs, cost and latencies, or why it has
    none; the cheapest (the plan) marked."""
    lines = ["| configuration | prefill + decode GPUs | $/hour at peak | GPU-hours a day | "
             "TTFT p95 | ITL p95 |", "|---|---|---|---|---|---|"]
    for name, plan in plans.items():
        if not isinstance(plan, Plan):
            lines.append(f"| {name} | {plan} | | | | |")
            continue
        prefill, decode = plan.gpus
        label = f"**{name} (the plan)**" if name == chosen else name
        lines.append(f"| {label} | {prefill} + {decode} | {plan.dollars_per_hour():,.0f} | "
                     f"{plan.gpu_hours_per_day(peak_to_mean):,.0f} | "
                     f"{plan.prediction.ttft_s['p95'] * 1000:.0f} ms | "
                     f"{plan.prediction.itl_s['p95'] * 1000:.1f} ms |")
    return "\n".join(lines)
