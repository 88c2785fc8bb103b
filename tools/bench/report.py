"""Benchmark output: the table on the terminal, the JSON file and the PNG plots."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from tools.bench.stats import RequestRecord, timeline


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def table(name: str, summary: dict) -> str:
    lines = [
        f"{name}: {summary['completed']}/{summary['requests']} completed, "
        f"{summary['output_tokens_per_s']:.1f} output tok/s, "
        f"{summary['requests_per_s']:.2f} req/s, "
        f"goodput {summary['goodput_requests_per_s']:.2f} req/s "
        f"(TTFT <= {summary['slo']['ttft_s']}s and TPOT <= {summary['slo']['tpot_s']}s)",
        f"  {'ms':<6}{'p50':>9}{'p95':>9}{'p99':>9}",
    ]
    for key, label in (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        values = summary[key]
        lines.append(f"  {label:<6}{_ms(values['p50']):>9}{_ms(values['p95']):>9}"
                     f"{_ms(values['p99']):>9}")
    if summary["errors"]:
        lines.append(f"  errors: {summary['errors']}")
    return "\n".join(lines)


def write_json(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")


def write_runs(out: Path, name: str, what: str,
               runs: list[tuple[str, float, list[RequestRecord], dict]]) -> None:
    """``bench run``'s files under ``out``: each run's JSON (``run-<name>-<label>.json``,
    its summary and records), the runs' TTFT CDF and, for several, latency against the
    offered rate. ``runs``: (label, offered rate, records, summary) each; ``what`` names
    the workload in the plots' titles."""
    for label, _, records, summary in runs:
        write_json(out / f"run-{name}-{label}.json",
                   {**summary, "records": [asdict(r) for r in records]})
    ttft_cdf_plot(out / f"run-{name}-ttft-cdf.png",
                  {label: records for label, _, records, _ in runs}, f"TTFT, {what}")
    if len(runs) > 1:
        load_sweep_plot(out / f"run-{name}-sweep.png",
                        [(rate, summary["all"]) for _, rate, _, summary in runs],
                        f"latency against offered load, {what}")


def ttft_cdf_plot(path: Path, runs: dict[str, list[RequestRecord]], title: str) -> None:
    """CDF of TTFT, one line per run (e.g. per setup or per request kind)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, records in runs.items():
        ttfts = sorted(r.ttft * 1000 for r in records if r.ok and r.ttft is not None)
        if ttfts:
            axes.step(ttfts, [(i + 1) / len(ttfts) for i in range(len(ttfts))], where="post",
                      label=f"{label} (n={len(ttfts)})")
    axes.set_xscale("log")
    axes.set_xlabel("time to first token (ms, log scale)")
    axes.set_ylabel("fraction of requests")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def load_sweep_plot(path: Path, sweep: list[tuple[float, dict]], title: str) -> None:
    """p50/p95 TTFT and ITL against offered load (requests/s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [rate for rate, _ in sweep]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for axes, key, label in ((left, "ttft_s", "TTFT"), (right, "itl_s", "ITL")):
        for q in ("p50", "p95"):
            values = [(s[key][q] or 0) * 1000 for _, s in sweep]
            axes.plot(rates, values, marker="o", label=f"{label} {q}")
        axes.set_xlabel("offered load (requests/s)")
        axes.set_ylabel("ms")
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def goodput_rate_plot(path: Path, curves: dict[str, list[tuple[float, float, bool]]],
                      title: str) -> None:
    """Goodput against offered rate (requests/s), one line per setup through its probes
    (each: rate, goodput, whether the SLO held; filled markers held, hollow ones failed),
    beside the line where every offered request is goodput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for setup, probes in curves.items():
        points = sorted(probes)
        if not points:
            continue
        (line,) = axes.plot([p[0] for p in points], [p[1] for p in points], label=setup)
        for rate, goodput, held in points:
            axes.plot([rate], [goodput], marker="o", color=line.get_color(),
                      markerfacecolor=line.get_color() if held else "none")
    rates = [p[0] for probes in curves.values() for p in probes]
    if rates:  # the ideal: every request offered is goodput
        axes.plot([0, max(rates)], [0, max(rates)], linestyle=":", color="grey",
                  label="offered")
    axes.set_xlabel("offered rate (requests/s)")
    axes.set_ylabel("goodput (requests/s meeting the SLO)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def trace_timeline_plot(path: Path, runs: dict[str, list[RequestRecord]], title: str,
                        window_s: float) -> None:
    """A trace replay over time, one row per run (a setup at a rate): p95 TTFT and p95 ITL
    of the requests sent in each ``window_s`` window (``stats.timeline``), beside the
    arrival rate on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, rows = plt.subplots(len(runs), 2, figsize=(11, 3.2 * len(runs)), squeeze=False)
    for (label, records), (ttft_axes, itl_axes) in zip(runs.items(), rows, strict=True):
        bins = timeline(records, window_s)
        times = [b.start_s + window_s / 2 for b in bins]
        for axes, key, name in ((ttft_axes, "ttft_p95_s", "TTFT p95"),
                                (itl_axes, "itl_p95_s", "ITL p95")):
            points = [(t, getattr(b, key) * 1000) for t, b in zip(times, bins, strict=True)
                      if getattr(b, key) is not None]
            axes.plot([t for t, _ in points], [v for _, v in points], marker=".",
                      color="tab:blue", label=name)
            axes.set_ylabel(f"{name} (ms)", color="tab:blue")
            axes.set_xlabel("seconds into the run (by send time)")
            axes.set_title(f"{label}: {name}", fontsize=10)
            axes.grid(True, alpha=0.3)
            rate = axes.twinx()
            rate.step(times, [b.arrivals_per_s for b in bins], where="mid",
                      color="tab:grey", alpha=0.7)
            rate.set_ylabel(f"arrivals/s ({window_s:g} s windows)", color="tab:grey")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
