"""``pdserve plan replay``: recorded ``pdserve bench run`` traces through the simulator,
measured beside simulated (shell: files read and written, printing).

The first ``--fit-runs`` traces fit the serving layer's cost; every trace (and each
``--held-out-trace``, on ``--held-out-config``'s cluster) is then simulated with it on
``--calibration``'s engines.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cluster.config import load_config
from cluster.engine.cpu_support import kv_bytes_per_token, kv_element_bytes
from tools.bench.engine_work import PROMPT_SOURCES
from tools.planner.cost_model import measured_transfer
from tools.planner.replay import Served, fit_serving, measured, simulate, trace_requests

_LATENCIES = ("ttft_p50", "ttft_p95", "decode_p50", "e2e_p50")


def run(args) -> int:
    """Replay ``args``'s traces, print measured, simulated and their errors, and (with
    ``--out``) write replay.json and replay.png; 2 when the arguments do not fit."""
    refusal = _refusal(args)
    if refusal:
        print(f"pdserve plan replay: {refusal}", file=sys.stderr)
        return 2
    calibration = json.loads(args.calibration.read_text())
    configs = [args.config] * len(args.trace) + [args.held_out_config] * len(
        args.held_out_trace)
    served_by_config = {path: _served(args, load_config(path), calibration)
                        for path in set(configs)}
    paths = [*args.trace, *args.held_out_trace]
    runs = [json.loads(path.read_text()) for path in paths]
    shared = [run.get("workload", {}).get("shared_prefix_tokens", 0) for run in runs]
    cost = fit_serving(served_by_config[args.config],
                       list(zip((run["records"] for run in runs), shared,
                                strict=True))[:args.fit_runs],
                       args.answer_reuse)
    _print_serving_cost(cost, args.trace[:args.fit_runs])
    print("| trace | | TTFT p50 | TTFT p95 | decode p50 | E2E p50 | tokens/s |\n"
          "|---|---|---|---|---|---|---|")
    rows, works = [], []
    for index, (path, config, run, head) in enumerate(zip(
            paths, configs, runs, shared, strict=True)):
        truth, seen, errors = _replayed(path, served_by_config[config], run, head, cost,
                                        args.answer_reuse)
        works.append((_name(path), run.get("engine_work"), seen.prompt_tokens))
        rows.append({"trace": str(path), "fitted_on": index < args.fit_runs,
                     "config": str(config),
                     "measured": truth.__dict__, "simulated": seen.__dict__,
                     "error": errors, "engine_work": run.get("engine_work")})
    _print_prompt_tokens(works)
    if args.out is not None:
        _write(args.out, cost, rows)
    return 0


def _refusal(args) -> str | None:
    """Why ``args`` cannot be replayed (None when they can)."""
    if args.calibration is None or not args.trace:
        return "needs --calibration and at least one --trace"
    if args.fit_runs > len(args.trace):
        return (f"--fit-runs {args.fit_runs} is more than the {len(args.trace)} --trace "
                "runs")
    if bool(args.held_out_trace) != (args.held_out_config is not None):
        return "--held-out-trace and --held-out-config go together"
    return None


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _replayed(path: Path, served: Served, run: dict, head: int, cost, answer_reuse):
    """(Measured, simulated, their relative errors) of the recorded ``run``, printed as
    three rows of the table."""
    name, records = _name(path), run["records"]
    truth = measured(records)
    seen = simulate(served, trace_requests(records, head, answer_reuse), cost)
    for label, values in (("measured", truth), ("simulated", seen)):
        print(f"| {name} | {label} | " + " | ".join(
            f"{getattr(values, k) * 1000:.0f} ms" for k in _LATENCIES)
            + f" | {values.streamed_per_s:.0f} |")
    errors = {k: getattr(seen, k) / getattr(truth, k) - 1 for k in _LATENCIES}
    print(f"| {name} | error | " + " | ".join(f"{e:+.0%}" for e in errors.values())
          + " | |")
    return truth, seen, errors


def _write(out: Path, cost, rows: list) -> None:
    """replay.json and replay.png in the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "replay.json").write_text(json.dumps(
        {"serving_cost": cost.__dict__, "runs": rows}, indent=2))
    from tools.planner.plots import replay_plot  # matplotlib: only to write

    replay_plot(out / "replay.png", rows)
    print(f"wrote {out / 'replay.json'} and {out / 'replay.png'}")


def _served(args, config, calibration) -> Served:
    """The replay's view of the cluster ``config`` served, with ``calibration``'s engines."""
    return Served(config.prefill.replicas, config.decode.replicas,
                  config.router.disaggregation_threshold_tokens, calibration["prefill"],
                  calibration["decode"], args.transfer_ms / 1000,
                  *_measured_transfer(args, config), block_size=config.engine.block_size,
                  routing={"prefill": config.router.routing.prefill,
                           "decode": config.router.routing.decode})


def _measured_transfer(args, config) -> tuple:
    """(Transfer, KV bytes per token of the served model) from --transfer-from, or
    (None, 0) without it."""
    if args.transfer_from is None:
        return None, 0
    rows = json.loads(args.transfer_from.read_text())["rows"]
    try:
        transfer = measured_transfer(rows, args.transfer_transport)
    except ValueError as error:
        raise SystemExit(f"pdserve plan replay --transfer-from: {error}") from None
    hf_config = json.loads((Path(config.model.path) / "config.json").read_text())
    per_token = kv_bytes_per_token(hf_config, kv_element_bytes(
        config.engine.dtype, config.engine.kv_cache_dtype, hf_config))
    print(f"KV transfer over {args.transfer_transport}: {transfer.latency_s * 1000:.2f} ms + "
          f"bytes at {transfer.bandwidth / 1e9:.1f} GB/s; {per_token:,} bytes a token")
    return transfer, per_token


def _print_serving_cost(cost, fitted_on) -> None:
    """The fitted serving layer's cost, in words."""
    names = ", ".join(_name(path) for path in fitted_on)
    print(f"serving layer fitted on {names}: each TTFT + ({cost.ttft_s * 1000:.1f} ms + "
          f"{cost.ttft_per_prompt_token_s * 1e6:.1f} us a prompt token) / (1 - "
          f"{cost.ttft_load_s * 1e6:.0f} us x streamed tokens/s); decode steps "
          f"x{cost.decode_slowdown:.2f} / (1 - {cost.decode_load_s * 1e6:.0f} us x "
          "streamed tokens/s)")


def _print_prompt_tokens(works) -> None:
    """Each trace's prompt tokens per pool and source: the engines' counters (what the
    run's `engine_work` recorded) beside the simulation's."""
    columns = [(pool, source) for pool in ("prefill", "decode") for source in PROMPT_SOURCES
               if (pool, source) != ("prefill", "transferred")]
    print("\n| trace | prompt tokens | " + " | ".join(f"{p} {s}" for p, s in columns)
          + " |\n|---|---|" + "---|" * len(columns))
    for name, work, simulated in works:
        if work:
            print(f"| {name} | measured | " + " | ".join(
                f"{work.get(f'{p} prompt tokens {s}', 0):,.0f}" for p, s in columns) + " |")
        print(f"| {name} | simulated | " + " | ".join(
            f"{simulated[p][s]:,}" for p, s in columns) + " |")
