"""``pdserve bench overhead --rates``: what pdserve adds under load, against vLLM's own
server, rate by rate (pure: the order of runs, what a run's records add up to, the table).

Both servers stay up for the whole sweep, and at each rate the runs alternate in ABBA
order (vLLM, pdserve, pdserve, vLLM), so neither setup gets the quieter half of the
machine; each run sends its own prompts (a salt of its own, the same lengths and arrival
times), so no run finds another's prompts in a prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

from cluster.percentile import percentile
from tools.bench.stats import RequestRecord

# The serving processes of each side: pdserve's ingress, router and the engine replicas'
# Python around their engines; vLLM's server is its API server process ("other": its
# engine's processes are "engine", tools/bench/cpu.py).
PDSERVE_SERVING_ROLES = ("proxy", "router", "decode replica", "prefill replica")
VLLM_SERVING_ROLES = ("other",)


def abba(baseline: str, other: str) -> list[tuple[str, int]]:
    """The runs at one rate, each (setup, round): A B B A."""
    return [(baseline, 0), (other, 0), (other, 1), (baseline, 1)]


def run_salt(pass_: int, setup_index: int, round_: int, rate: float) -> str:
    """A salt for one run's prompts: distinct per run, the baseline's too in each pass (a
    pass: one pdserve setup beside it), and the same length for every setup and round of
    a pass at a rate (so their prompts are equally long)."""
    return f"p{pass_}s{setup_index}r{round_}@{rate:g}"


def chunk_gaps(token_times: Sequence[float]) -> list[float]:
    """Gaps between the chunks of one stream as they arrived (tokens that came in one
    chunk share its arrival time): what a benchmark client reports as ITL."""
    arrivals = sorted(set(token_times))
    return [b - a for a, b in pairwise(arrivals)]


def summarise(records: Iterable[RequestRecord], busy_cpu_s: dict[str, float],
              elapsed_s: float) -> dict[str, Any]:
    """One run's figures: TTFT p50/p95, TPOT p50 (a stream's time after its first token
    over its later tokens), per-chunk ITL p50, E2E p50, tokens/s, tokens per chunk, and
    CPU-seconds per 1,000 streamed tokens by role (beyond the roles' idle use)."""
    records = list(records)
    ok = [record for record in records if record.ok]
    tokens = sum(record.output_tokens for record in ok)
    tpots = [(record.e2e - record.ttft) / (record.output_tokens - 1)
             for record in ok if record.output_tokens > 1]
    gaps = [gap for record in ok for gap in chunk_gaps(record.token_times)]
    chunks = sum(len(set(record.token_times)) for record in ok)
    return {
        "requests": len(records), "n": len(ok),
        "ttft_p50_s": percentile([r.ttft for r in ok], 50),
        "ttft_p95_s": percentile([r.ttft for r in ok], 95),
        "tpot_p50_s": percentile(tpots, 50), "itl_p50_s": percentile(gaps, 50),
        "e2e_p50_s": percentile([r.e2e for r in ok], 50),
        # tokens a client got per event: what the relay's per-chunk cost is divided by
        "tokens_per_chunk": tokens / chunks if chunks else None,
        "tokens": tokens, "tokens_per_s": tokens / elapsed_s if elapsed_s > 0 else 0.0,
        "cpu_s_per_1k_tokens": {role: 1000 * seconds / tokens
                                for role, seconds in busy_cpu_s.items()} if tokens else {},
    }


def serving_cpu(run: dict[str, Any], roles: Sequence[str]) -> float | None:
    """CPU-seconds per 1,000 streamed tokens of the serving processes ``roles``."""
    by_role = run.get("cpu_s_per_1k_tokens") or {}
    if not by_role:
        return None
    return sum(by_role.get(role, 0.0) for role in roles)


def _mean(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) if present else None


def sweep_table(runs: list[dict[str, Any]], baseline: str, other: str) -> str:
    """Per rate: each run's figures (ms; CPU s per 1,000 tokens) in the order they ran,
    then pdserve's means against vLLM's: TTFT p50 added, TPOT and ITL p50 as ratios,
    serving CPU as a ratio."""
    header = (f"  {'rate':>5} {'setup':<22} {'round':>5} {'TTFT p50':>9} {'TTFT p95':>9} "
              f"{'TPOT p50':>9} {'ITL p50':>8} {'tok/s':>7} {'serving CPU':>12} "
              f"{'all CPU':>8}")
    lines = [header]
    for rate in sorted({run["rate"] for run in runs}):
        at_rate = [run for run in runs if run["rate"] == rate]
        for run in at_rate:
            roles = VLLM_SERVING_ROLES if run["setup"] == baseline else PDSERVE_SERVING_ROLES
            lines.append(
                f"  {rate:>5g} {run['setup']:<22} {run['round']:>5} "
                f"{_ms(run['ttft_p50_s']):>9} {_ms(run['ttft_p95_s']):>9} "
                f"{_ms(run['tpot_p50_s']):>9} {_ms(run['itl_p50_s']):>8} "
                f"{run['tokens_per_s']:>7.0f} {_num(serving_cpu(run, roles)):>12} "
                f"{_num(sum((run['cpu_s_per_1k_tokens'] or {}).values()) or None):>8}")
        lines.append("        " + _against(at_rate, baseline, other))
    return "\n".join(lines)


def _against(at_rate: list[dict[str, Any]], baseline: str, other: str) -> str:
    def mean(setup: str, key: str) -> float | None:
        return _mean([run[key] for run in at_rate if run["setup"] == setup])

    def cpu(setup: str, roles: Sequence[str]) -> float | None:
        return _mean([serving_cpu(run, roles) for run in at_rate if run["setup"] == setup])

    parts = []
    base, mine = mean(baseline, "ttft_p50_s"), mean(other, "ttft_p50_s")
    if base is not None and mine is not None:
        parts.append(f"TTFT p50 {(mine - base) * 1000:+.1f} ms")
    for label, key in (("TPOT p50", "tpot_p50_s"), ("ITL p50", "itl_p50_s")):
        parts.append(f"{label} {_ratio(mean(other, key), mean(baseline, key))}")
    parts.append("serving CPU " + _ratio(cpu(other, PDSERVE_SERVING_ROLES),
                                         cpu(baseline, VLLM_SERVING_ROLES)))
    return f"{other} against {baseline} (means of the rounds): " + ", ".join(parts)


def _ratio(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value is not None and base else "-"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
