"""``pdserve bench overhead``: what pdserve adds to one request at low load, path by path
(shell).

Short prompts are sent one at a time, so nothing queues or batches, to three servers one
after the other on the same cores: vLLM's own OpenAI server with the decode pool's engine
settings on the decode pool's cores (the baseline), then pdserve with every prompt on the
decode-local path (the decode engine prefills it: what pdserve adds is its router and
Serve's hops) and with every prompt disaggregated (prefill pool, KV transfer, decode).
Each pdserve run also prints where its time to the first event went
(tools/bench/breakdown.py) and, per streamed token, the CPU each process role used
(tools/bench/cpu.py) beyond what it uses idle.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from router.timing import STAGES
from tools.bench import cpu, sweep
from tools.bench.breakdown import ENGINE_PARTS, HOP_PARTS
from tools.bench.defaults import IDLE_SAMPLE_S
from tools.bench.runner import run_workload
from tools.bench.workload import PlannedRequest

# pdserve's two paths, as the threshold that sends every short prompt down each.
PATH_OVERRIDES = {
    "decode_local": lambda config: config.engine.max_model_len,
    "disaggregated": lambda config: 0,
}


def measure(base_url: str, model: str, requests: list[PlannedRequest], root_pid: int,
            concurrency: int = 1, idle_sample_s: float = IDLE_SAMPLE_S) -> dict[str, Any]:
    """One server's run: ``requests`` sent ``concurrency`` at a time (each group at once,
    the next when it has finished), summed up as a sweep's run is (``sweep.summarise``:
    the same figures under the same names) with the CPU of ``root_pid``'s tree beyond its
    idle rate, measured first."""
    idle = idle_cpu_rate(root_pid, idle_sample_s)
    cpu_before, started = cpu.sample_processes(), time.monotonic()
    records = []
    for first in range(0, len(requests), concurrency):
        group = requests[first:first + concurrency]
        records += asyncio.run(run_workload(base_url, model, group, progress=False))[0]
    elapsed = time.monotonic() - started
    used = cpu.cpu_by_role(cpu_before, cpu.sample_processes(), root_pid)
    return sweep.summarise(records, cpu.beyond_idle(used, idle, elapsed), elapsed) | {
        "concurrency": concurrency}


def measure_at_rate(base_url: str, model: str, requests: list[PlannedRequest],
                    root_pid: int, idle_rate: dict[str, float]) -> dict[str, Any]:
    """One run of a rate sweep (tools/bench/sweep.py): ``requests`` sent at their planned
    times (open loop), summed up with the CPU of ``root_pid``'s tree beyond
    ``idle_rate``."""
    cpu_before, started = cpu.sample_processes(), time.monotonic()
    records, _ = asyncio.run(run_workload(base_url, model, requests, progress=False))
    elapsed = time.monotonic() - started
    used = cpu.cpu_by_role(cpu_before, cpu.sample_processes(), root_pid)
    return sweep.summarise(records, cpu.beyond_idle(used, idle_rate, elapsed), elapsed)


def relay_capacity(run: dict[str, Any], role: str = "router") -> float | None:
    """Streamed tokens/s one core of ``role`` would relay at the CPU per token this run
    measured (None: the role used none beyond idle, or the run streamed nothing)."""
    cpu_s_per_1k = run.get("cpu_s_per_1k_tokens", {}).get(role)
    return 1000 / cpu_s_per_1k if cpu_s_per_1k else None


def idle_cpu_rate(root_pid: int, sample_s: float) -> dict[str, float]:
    """CPU-seconds per second each role of an idle server uses (polls, reports, Ray)."""
    before = cpu.sample_processes()
    time.sleep(sample_s)  # the idle window being measured
    used = cpu.cpu_by_role(before, cpu.sample_processes(), root_pid)
    return {role: seconds / sample_s for role, seconds in used.items()}


def shorten(requests: list[PlannedRequest], max_tokens: int, prompt_chars: int = 256,
            keep_times: bool = False) -> list[PlannedRequest]:
    """Short prompts (256 characters: ~64 tokens), all due at once (the runner sends them
    one by one), or at their planned times with ``keep_times`` (a rate sweep's)."""
    return [replace(r, send_at=r.send_at if keep_times else 0.0, max_tokens=max_tokens,
                    prompt=r.prompt[:prompt_chars]) for r in requests]


LATENCY_ROWS = (("TTFT p50", "ttft_p50_s"), ("TTFT p95", "ttft_p95_s"),
                ("TPOT p50", "tpot_p50_s"), ("E2E p50", "e2e_p50_s"),
                ("prompt's prefill", "prompt_prefill_mean_s"))


def prompt_prefill_mean_s(stages: dict[str, dict[str, float]] | None) -> float | None:
    """The mean time the engine that computed each prompt took for it, from the first
    step that scheduled it to its first token: vLLM's server's one engine (its
    ``engine prefill``), pdserve's prefill engine on the disaggregated path and its decode
    engine on the decode-local one. That is engine compute against engine compute,
    whatever the serving layers around each add."""
    if not stages:
        return None
    for phase in ("prefill engine prefill", "decode engine prefill", "engine prefill"):
        if phase in stages:
            return stages[phase]["mean_s"]
    return None


def latency_table(runs: dict[str, dict[str, Any]], baseline: str) -> str:
    """Each setup's medians (ms), pdserve's with what it adds to the baseline."""
    names = list(runs)
    width = _column_width(names)
    lines = [f"  {'ms':<16}" + "".join(f"{name:>{width}}" for name in names)]
    for label, key in LATENCY_ROWS:
        cells = []
        for name in names:
            value, base = runs[name].get(key), runs[baseline].get(key)
            if value is None:
                cells.append("-")
            elif name == baseline or base is None:
                cells.append(f"{value * 1000:.1f}")
            else:
                cells.append(f"{value * 1000:.1f} ({(value - base) * 1000:+.1f})")
        lines.append(f"  {label:<16}" + "".join(f"{cell:>{width}}" for cell in cells))
    return "\n".join(lines)


def cpu_table(runs: dict[str, dict[str, Any]]) -> str:
    """CPU-seconds per 1,000 streamed tokens by role, beyond each server's idle use (a
    vLLM server is one process tree: its API server "other", its engine "engine")."""
    names = list(runs)
    width = _column_width(names)
    lines = ["  CPU s per 1k tokens, busy" + "".join(f"{name:>{width}}" for name in names)]
    for role in (*cpu.ROLES, "total"):
        cells = [sum(runs[n]["cpu_s_per_1k_tokens"].values()) if role == "total"
                 else runs[n]["cpu_s_per_1k_tokens"].get(role) for n in names]
        if any(cells):
            lines.append(f"  {role:<23}" + "".join(
                f"{c:>{width}.3f}" if c is not None else f"{'-':>{width}}" for c in cells))
    return "\n".join(lines)


def _column_width(names: list[str]) -> int:
    """Wide enough for the longest setup name (variants make long ones) and a gap."""
    return max(26, *(len(name) + 2 for name in names))


def engine_share(stages: dict[str, dict[str, float]] | None) -> dict[str, float] | None:
    """A disaggregated TTFT split by owner (means, s): the engines' own time for the
    prompt (the prefill engine queueing and computing it; the decode engine pulling its
    KV and computing the first token), and the rest, pdserve's (render, admission,
    routing and the hops between processes, and the proxy's, which the router cannot
    see and is not in here). The serving part is split once more: the replicas' hops to
    their engine cores and back, and the rest (Serve's calls, the routers, the replicas'
    own code)."""
    if not stages or "prefill" not in stages:
        return None
    mean = {stage: row["mean_s"] for stage, row in stages.items()}
    engines = sum(mean.get(part, 0.0) for part in ENGINE_PARTS)
    router = sum(mean.get(stage, 0.0) for stage in STAGES)
    hops = sum(mean.get(part, 0.0) for part in HOP_PARTS)
    return {"router_s": router, "engines_s": engines, "serving_s": router - engines,
            "engine_hops_s": hops, "calls_and_router_s": router - engines - hops}


def config_for_path(document: dict, path: str, config) -> dict:
    """The config document that sends every short prompt down ``path``."""
    from tools.bench.variants import apply_overrides

    if path not in PATH_OVERRIDES:
        raise ValueError(f"unknown path {path!r} (one of {', '.join(PATH_OVERRIDES)})")
    return apply_overrides(document, {
        "router.disaggregation_threshold_tokens": PATH_OVERRIDES[path](config)})
