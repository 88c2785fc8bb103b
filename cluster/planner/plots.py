"""A plan as pictures (shell: matplotlib writes the file): the planned pools' GPUs over
the day, and every cluster the search simulated against the latency objectives."""

from __future__ import annotations

from pathlib import Path

from cluster.planner.search import Plan


def plan_plot(path: Path, plan: Plan, peak_to_mean: float) -> None:
    """Two panels: the GPUs each pool holds hour by hour when its replicas follow the
    day's rate (the figure behind GPU-hours a day), and each simulated candidate's GPUs
    against its p95 TTFT and ITL, the SLOs drawn and the plan marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (day, search) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_hour = plan.gpus_by_hour(peak_to_mean)
    hours = range(len(by_hour))
    prefill = [p for p, _ in by_hour]
    decode = [d for _, d in by_hour]
    day.bar(hours, prefill, label="prefill")
    day.bar(hours, decode, bottom=prefill, label="decode")
    day.set(xlabel="hour of the day (peak at 0)", ylabel="GPUs",
            title=f"GPUs through the day: {sum(prefill) + sum(decode):,} GPU-hours")
    day.legend()
    tp = (plan.inputs.prefill_cost.tp, plan.inputs.decode_cost.tp)
    gpus = [c.prefill_replicas * tp[0] + c.decode_replicas * tp[1] for c in plan.tried]
    slo = plan.inputs.slo
    search.scatter(gpus, [c.ttft_s["p95"] * 1000 for c in plan.tried], label="TTFT p95")
    search.scatter(gpus, [c.itl_s["p95"] * 1000 for c in plan.tried], marker="x",
                   label="ITL p95")
    search.axhline(slo.ttft_p95_s * 1000, linestyle="--", color="C0", label="TTFT SLO")
    search.axhline(slo.itl_p95_s * 1000, linestyle=":", color="C1", label="ITL SLO")
    chosen = plan.prediction
    search.axvline(chosen.prefill_replicas * tp[0] + chosen.decode_replicas * tp[1],
                   color="grey", label="the plan")
    search.set(xlabel="GPUs at peak", ylabel="ms", yscale="log",
               title=f"{len(plan.tried)} clusters simulated")
    search.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
