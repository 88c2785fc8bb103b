"""A plan as pictures (shell: matplotlib writes the file): the planned pools' GPUs over
the day, every cluster the search simulated against the latency objectives, and the day
under the planned config's autoscalers."""

from __future__ import annotations

from pathlib import Path

from tools.planner.day import DayResult
from tools.planner.search import Plan


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


def replay_plot(path: Path, runs: list[dict]) -> None:
    """``pdserve plan replay``'s runs (replay.json's ``runs``) side by side: each trace's
    measured and simulated TTFT p50 and p95 and E2E p50 (the runs the serving cost was
    fitted on marked), and, where the run counted the engines' work, each pool's prompt
    tokens by source, measured against simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counted = [run for run in runs if run.get("engine_work")]
    figure, axes = plt.subplots(1, 2 if counted else 1, figsize=(12 if counted else 7, 4.5),
                                squeeze=False)
    latencies, tokens = axes[0][0], axes[0][-1]
    names = [Path(run["trace"]).parent.name + "/" + Path(run["trace"]).stem
             + (" (fit)" if run.get("fitted_on") else "") for run in runs]
    places = range(len(runs))
    for color, key, label in (("C0", "ttft_p50", "TTFT p50"), ("C1", "ttft_p95", "TTFT p95"),
                              ("C2", "e2e_p50", "E2E p50")):
        latencies.scatter(places, [run["measured"][key] * 1000 for run in runs], color=color,
                          label=f"{label}, measured")
        latencies.scatter(places, [run["simulated"][key] * 1000 for run in runs],
                          color=color, marker="x", label=f"{label}, simulated")
    latencies.set(ylabel="ms", yscale="log", title="replayed traces")
    latencies.set_xticks(list(places), names, rotation=30, ha="right", fontsize="small")
    latencies.legend(fontsize="x-small", ncol=2)
    if counted:
        _prompt_tokens_panel(tokens, counted)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _prompt_tokens_panel(axis, runs: list[dict]) -> None:
    """Measured against simulated prompt tokens, one point per trace, pool and source; the
    diagonal is a perfect prediction."""
    highest = 1.0
    for index, (pool, source) in enumerate((("prefill", "computed"), ("prefill", "cached"),
                                            ("decode", "computed"), ("decode", "cached"),
                                            ("decode", "transferred"))):
        measured = [run["engine_work"].get(f"{pool} prompt tokens {source}", 0.0)
                    for run in runs]
        simulated = [run["simulated"]["prompt_tokens"][pool][source] for run in runs]
        axis.scatter(measured, simulated, color=f"C{index}", label=f"{pool} {source}")
        highest = max(highest, *measured, *simulated)
    axis.plot([0, highest], [0, highest], color="grey", linewidth=0.8)
    axis.set(xlabel="measured (the engines' counters)", ylabel="simulated",
             title="prompt tokens per pool and source")
    axis.legend(fontsize="x-small")


# One line style per simulated day (the plan scaled to the rate is dotted).
_STYLES = ("-", "--", "-.", (0, (6, 2, 1, 2, 1, 2)), (0, (10, 3)))


def day_plot(path: Path, days: dict[str, DayResult]) -> None:
    """The day under the written config's autoscalers (and each variant in ``days``):
    each pool's replicas alive (the GPUs held; the first three days, so that the lines
    stay apart) against the plan scaled to the rate, and the predicted p95 TTFT (all)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (replicas, latency) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    first = next(iter(days.values()))
    hours = [point.hours_after_start for point in first.timeline]
    for index, pool in enumerate(("prefill", "decode")):
        replicas.plot(hours, [p.ideal[pool] for p in first.timeline], color=f"C{index}",
                      linestyle=":", label=f"{pool}: the plan scaled to the rate")
        for style, (name, day) in zip(_STYLES, list(days.items())[:3], strict=False):
            replicas.plot(hours, [p.alive[pool] for p in day.timeline], color=f"C{index}",
                          linestyle=style, label=f"{pool}: {name}")
    totals = [f"{name}: {sum(day.gpu_hours.values()):,.0f}" for name, day in days.items()]
    totals.append(f"scaled to the rate: {sum(first.ideal_gpu_hours.values()):,.0f}")
    replicas.set(ylabel="replicas alive", title="GPU-hours a day, " + "\n".join(
        "; ".join(totals[start:start + 3]) for start in range(0, len(totals), 3)))
    replicas.title.set_fontsize("small")
    replicas.legend(fontsize="x-small")
    for style, (name, day) in zip(_STYLES, days.items(), strict=False):
        latency.plot(hours, [p.ttft_p95_s * 1000 for p in day.timeline], linestyle=style,
                     label=f"TTFT p95, {name}")
    latency.set(xlabel="hours from the trough (the peak at 12)", ylabel="ms (predicted)")
    latency.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
