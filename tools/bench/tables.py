"""The comparison tables ``bench compare`` and ``bench variants`` print (pure: formatting).

Each takes the summaries ``tools/bench/stats.py`` makes (as JSON-ready dicts) and returns
text; ratios are to the first setup or variant.
"""

from __future__ import annotations

from tools.bench.stats import ratio

# The engines' work in a variants table: (label, engine_work key, divisor).
WORK_ROWS = (("KV MB pulled", "kv bytes pulled", 1e6),
             ("prefill computed", "prefill prompt tokens computed", 1),
             ("decode cached", "decode prompt tokens cached", 1),
             ("decode pulled", "decode prompt tokens transferred", 1),
             ("decode computed", "decode prompt tokens computed", 1))
# The quality rows of a variants table: (label, quality key, format).
QUALITY_ROWS = (("perplexity", "perplexity_candidate", "{:.3f}"),
                ("top-1 agreement", "top1_agreement", "{:.2%}"),
                ("KL mean (nats)", "kl_mean", "{:.5f}"),
                ("KL p95 (nats)", "kl_p95", "{:.5f}"))


def compare_ratios(pd: dict, colocated: dict) -> dict:
    """(a)/(b): below 1 is better for latencies, above 1 better for throughput."""
    return {
        "short_p95_ttft": ratio(pd["short"]["ttft_s"]["p95"], colocated["short"]["ttft_s"]["p95"]),
        "p95_itl": ratio(pd["all"]["itl_s"]["p95"], colocated["all"]["itl_s"]["p95"]),
        "throughput": ratio(pd["all"]["output_tokens_per_s"],
                            colocated["all"]["output_tokens_per_s"]),
        "goodput": ratio(pd["all"]["goodput_requests_per_s"],
                         colocated["all"]["goodput_requests_per_s"]),
    }


def ratio_table(pair: str, ratios: dict[str, dict]) -> str:
    """One pair of ``bench compare``'s setups: its ``compare_ratios`` per workload."""
    lines = [f"{pair} (latency: <1 is better; throughput, goodput: >1 is better)",
             f"  {'workload':<14}{'short p95 TTFT':>16}{'p95 ITL':>10}{'tok/s':>8}{'goodput':>9}"]
    for workload, r in ratios.items():
        cells = [r["short_p95_ttft"], r["p95_itl"], r["throughput"], r["goodput"]]
        shown = ["-" if c is None else f"{c:.2f}" for c in cells]
        lines.append(f"  {workload:<14}{shown[0]:>16}{shown[1]:>10}{shown[2]:>8}{shown[3]:>9}")
    return "\n".join(lines)


def engine_cpu_per_million_tokens(summary: dict) -> float | None:
    """CPU-seconds both pools' engines used per million output tokens of the run."""
    used = summary["cpu_s_by_role"]
    engines = used.get("prefill engine", 0.0) + used.get("decode engine", 0.0)
    tokens = summary["all"]["output_tokens_per_s"] * summary["duration_s"]
    return engines / tokens * 1e6 if tokens else None


def variants_table(summaries: dict[str, dict]) -> str:
    """Short/long TTFT and ITL per variant, and each one's ratio to the first."""
    names = list(summaries)
    lines = [f"  {'':<16}" + "".join(f"{n:>22}" for n in names)]
    lines += _latency_rows(summaries)
    goodput = [f"{summaries[n]['all']['goodput_requests_per_s']:.3f}/s" for n in names]
    lines.append(f"  {'goodput':<16}" + "".join(f"{g:>22}" for g in goodput))
    lines += _cost_rows(summaries)
    if all("quality" in summaries[n] for n in names):
        for label, key, form in QUALITY_ROWS:
            cells = [form.format(summaries[n]["quality"][key]) for n in names]
            lines.append(f"  {label:<16}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def _latency_rows(summaries: dict[str, dict]) -> list[str]:
    """TTFT and ITL quantiles, in ms, each with its ratio to the first variant's."""
    rows = [("short p50 TTFT", "short", "ttft_s", "p50"), ("short p95 TTFT", "short", "ttft_s",
            "p95"), ("long p50 TTFT", "long", "ttft_s", "p50"), ("p95 ITL", "all", "itl_s", "p95")]
    names = list(summaries)
    if all(summaries[n].get("later_turns", {}).get("completed") for n in names):
        rows += [("later-turn p50", "later_turns", "ttft_s", "p50"),
                 ("later-turn p95", "later_turns", "ttft_s", "p95")]
    base = summaries[names[0]]
    lines = []
    for label, kind, metric, q in rows:
        cells = []
        for name in names:
            value = summaries[name][kind][metric][q]
            r = ratio(value, base[kind][metric][q])
            cells.append("-" if value is None else
                         f"{value * 1000:.0f} ms" + ("" if r is None else f" ({r:.2f}x)"))
        lines.append(f"  {label:<16}" + "".join(f"{c:>22}" for c in cells))
    return lines


def _cost_rows(summaries: dict[str, dict]) -> list[str]:
    """The engines' CPU per token and their work, where every variant measured them."""
    names = list(summaries)
    lines = []
    if all("cpu_s_by_role" in summaries[n] for n in names):
        per_million = [engine_cpu_per_million_tokens(summaries[n]) for n in names]
        lines.append(f"  {'engine CPU-s/1M':<16}" + "".join(
            f"{'-' if v is None else f'{v:,.0f}':>22}" for v in per_million))
    if all("engine_work" in summaries[n] for n in names):
        for label, key, scale in WORK_ROWS:
            cells = [summaries[n]["engine_work"].get(key, 0.0) / scale for n in names]
            lines.append(f"  {label:<16}" + "".join(f"{c:>22,.1f}" for c in cells))
    return lines
