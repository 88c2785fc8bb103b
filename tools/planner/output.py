"""What a plan says (pure): its figures as a dict and a table, the day under its
autoscalers, and the pdserve config of the planned cluster, written over a base config
(ray_configs/prod-70b.yaml by default)."""

from __future__ import annotations

import copy
import math
from dataclasses import asdict
from typing import Any

from tools.planner.day import DayResult
from tools.planner.search import Plan
from tools.planner.standby_fit import FittedStandby
from tools.planner.workload import description


def figures(plan: Plan, peak_to_mean: float) -> dict[str, Any]:
    """The plan's answer: replicas and GPUs per pool, the cost at peak and over a day, and
    the predicted latencies at peak."""
    prediction = plan.prediction
    prefill_gpus, decode_gpus = plan.gpus
    inputs = plan.inputs
    return {
        "rate_per_s": inputs.workload.rate,
        "workload": description(inputs.workload),
        "accelerator": inputs.prefill_cost.accelerator.name,
        "prefill": {"replicas": prediction.prefill_replicas, "tp": inputs.prefill_cost.tp,
                    "gpus": prefill_gpus, "busy": prediction.prefill_busy},
        "decode": {"replicas": prediction.decode_replicas, "tp": inputs.decode_cost.tp,
                   "gpus": decode_gpus, "busy": prediction.decode_busy},
        "router_replicas": (math.ceil(inputs.routers_per_decode * prediction.decode_replicas)
                            if inputs.routers is not None else None),
        "refused": prediction.refused,
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
        ("workload", workload_text(answer["workload"])),
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
    if answer.get("router_replicas"):
        rows.append(("router replicas; requests admission refused",
                     f"{answer['router_replicas']:,}; {answer['refused']:.2%}"))
    return "\n".join(["| | plan |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


def workload_text(workload: dict[str, Any]) -> str:
    """One line for the plan's table: which traffic it was sized for (``description``)."""
    lengths = (f"prompts {workload['mean_prompt_tokens']:,.0f} / outputs "
               f"{workload['mean_output_tokens']:,.0f} tokens on average")
    if workload["source"] != "trace":
        return f"{workload['source']} (drawn): {lengths}, Poisson arrivals"
    burst = workload["peak_to_mean_10s"]
    burst = f", peak / mean of its 10 s counts {burst:.2f}" if burst is not None else ""
    return (f"trace {workload['trace']}: {workload['requests']:,} requests, {lengths} "
            f"({workload['clipped']:,} clipped to {workload['max_model_len']:,}); arrivals "
            f"gamma renewal at its CV² {workload['interarrival_cv2']:.2f}{burst}")


def config_document(plan: Plan, base: dict[str, Any],
                    targets: dict[str, dict[str, float]] | None = None,
                    standby: dict[str, FittedStandby] | None = None) -> dict[str, Any]:
    """``base`` (a pdserve config document) with the planned pools: replicas, tensor
    parallelism, batch limits, the threshold, the SLOs, autoscaling bounds, each pool's
    per-replica autoscaling ``targets`` (``day.autoscaling_targets``) when given, and its
    floors: the ``standby`` ones fitted to the day (``standby_fit.fit_standby``) where given,
    else the base's standby windows holding the planned size and its night floor in
    proportion."""
    document = copy.deepcopy(base)
    inputs = plan.inputs
    tps = {"prefill": inputs.prefill_cost.tp, "decode": inputs.decode_cost.tp}
    for pool, replicas in plan.prediction.replicas.items():
        section = document.setdefault(pool, {})
        base_replicas = section.get("replicas")
        section["replicas"] = replicas
        section["tensor_parallel_size"] = tps[pool]
        scaling = (document.get("autoscaling") or {}).get(pool)
        if scaling is not None:
            _write_floors(scaling, replicas, base_replicas, (standby or {}).get(pool))
            scaling.update((targets or {}).get(pool, {}))
    document["engine"]["max_num_batched_tokens"] = inputs.prefill.max_num_batched_tokens
    document["decode"]["max_num_batched_tokens"] = inputs.decode.max_num_batched_tokens
    document["decode"].setdefault("engine_overrides", {})["max_num_seqs"] = \
        inputs.decode.max_num_seqs
    if inputs.decode_cost.kv_dtype == "fp8":
        document["engine"]["kv_cache_dtype"] = "fp8"
    if inputs.speculation is not None:
        document["decode"]["speculative"] = {
            "method": "ngram", "num_speculative_tokens": inputs.speculation.draft_tokens}
    document.setdefault("router", {})["disaggregation_threshold_tokens"] = \
        inputs.threshold_tokens
    if inputs.routers is not None:
        document["router"]["replicas"] = math.ceil(
            inputs.routers_per_decode * plan.prediction.decode_replicas)
    document.setdefault("slo", {}).update(ttft_p95_s=inputs.slo.ttft_p95_s,
                                          itl_p95_s=inputs.slo.itl_p95_s)
    return document


def _write_floors(scaling: dict[str, Any], replicas: int, base_replicas: int | None,
                  fitted: FittedStandby | None) -> None:
    """A pool's autoscaling section (``scaling``, changed in place) for ``replicas`` at the
    peak: its ``fitted`` floors where given, else the base's standby windows holding the
    planned size and its night floor in proportion to the base's pool
    (``base_replicas``); a ceiling with room for the policy above either."""
    # room above the fitted floors for a day busier than their margin
    scaling["max_replicas"] = max(scaling.get("max_replicas", 0), math.ceil(replicas * 1.05),
                                  math.ceil(1.25 * fitted.highest) if fitted else 0)
    if fitted:
        scaling["min_replicas"] = fitted.night_floor
        scaling["standby"] = fitted.standby_section()
        return
    scaling["min_replicas"] = _scaled_floor(scaling.get("min_replicas", 1), base_replicas,
                                            replicas)
    for window in (scaling.get("standby") or {}).get("windows", []):
        window["min_replicas"] = replicas


def _scaled_floor(base_min: int, base_replicas: int | None, replicas: int) -> int:
    """The base config's floor, kept in its proportion to the base's own pool size (its
    night-time share of the peak, "a third at night") for the planned size."""
    if not base_replicas:
        return min(base_min, replicas)
    return max(1 if base_min else 0, min(replicas, math.ceil(replicas * base_min
                                                             / base_replicas)))


def lever_table(plans: dict[str, Plan | str]) -> str:
    """Each lever's plan beside the first (the plan as given): GPUs, cost, the TTFT and
    the ITL (a lever may cost GPUs: saved is then negative), or why it has none."""
    base = next(iter(plans.values()))
    lines = ["| lever | prefill + decode GPUs | $/hour at peak | GPUs saved | TTFT p95 | "
             "ITL p95 |", "|---|---|---|---|---|---|"]
    for name, plan in plans.items():
        if isinstance(plan, str):
            lines.append(f"| {name} | {plan} | | | | |")
            continue
        prefill, decode = plan.gpus
        saved = 1 - (prefill + decode) / sum(base.gpus)
        lines.append(f"| {name} | {prefill} + {decode} | {plan.dollars_per_hour():,.0f} | "
                     f"{saved:.0%} | {plan.prediction.ttft_s['p95'] * 1000:.0f} ms | "
                     f"{plan.prediction.itl_s['p95'] * 1000:.1f} ms |")
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


def day_figures(day: DayResult) -> dict[str, Any]:
    """The day under the autoscalers, for plan.json (the timeline ten minutes apart;
    day.png draws it a minute apart)."""
    return {
        "gpu_hours": day.gpu_hours,
        "gpu_hours_total": sum(day.gpu_hours.values()),
        "ideal_gpu_hours": day.ideal_gpu_hours,
        "ideal_gpu_hours_total": sum(day.ideal_gpu_hours.values()),
        "replicas_fewest_most": {pool: list(span) for pool, span in day.replicas.items()},
        "hours_over_slo": day.hours_over_slo,
        "hours_beyond_sensors": day.hours_beyond_sensors,
        "scale_events": day.scale_events,
        "timeline": [asdict(point) for point in day.timeline[::10]],
    }


def day_table(days: dict[str, dict[str, Any]]) -> str:
    """Each simulated day (the written config first, then its variants) beside the plan
    scaled to the rate."""
    names = list(days)
    first = days[names[0]]
    rows = [("the plan scaled to the rate: GPU-hours",
             [f"{first['ideal_gpu_hours_total']:,.0f}"] + [""] * (len(names) - 1))]
    rows.append(("GPU-hours a day under the autoscalers (over the scaled plan)",
                 [f"{day['gpu_hours_total']:,.0f} "
                  f"({day['gpu_hours_total'] / day['ideal_gpu_hours_total'] - 1:+.0%})"
                  for day in days.values()]))
    for pool in ("prefill", "decode"):
        rows.append((f"{pool}: GPU-hours; replicas fewest-most; scale-ups/downs",
                     [f"{day['gpu_hours'][pool]:,.0f}; "
                      f"{'-'.join(map(str, day['replicas_fewest_most'][pool]))}; "
                      f"{day['scale_events'][pool]['up']}/{day['scale_events'][pool]['down']}"
                      for day in days.values()]))
    rows.append(("hours with p95 TTFT / ITL over the SLO",
                 [f"{day['hours_over_slo']['ttft']:.2f} / {day['hours_over_slo']['itl']:.2f}"
                  + (f" ({day['hours_beyond_sensors']:.2f} h past the sensed loads)"
                     if day["hours_beyond_sensors"] else "") for day in days.values()]))
    header = "| the day under the written config's autoscalers | " + " | ".join(names) + " |"
    return "\n".join([header, "|---" * (len(names) + 1) + "|"]
                     + [f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows])
