"""``pdserve bench run --trace`` and ``pdserve bench compare --trace`` (shell): a recorded
trace's slice replayed as it came, time- or rate-scaled (tools/bench/trace.py), and the
rate-matched comparison of setups on it (tools/bench/rate_match.py)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from cluster.config import PDServeConfig
from cluster.engine.args import CPU_BIND_ENV
from tools.bench import rate_match, report, trace
from tools.bench.measure import measure_requests
from tools.bench.servers import all_cores_bind, machine, warm_up
from tools.bench.stats import SLO, RequestRecord, timeline_window
from tools.bench.workload import PlannedRequest, WorkloadSpec

# ---- run --trace -----------------------------------------------------------------------

def run_trace(args, served_config: PDServeConfig | None, slo: SLO,
               metrics_url: str | None) -> int:
    """``bench run --trace``: a slice of a recorded trace, fitted to the served context and
    paced as recorded, ``--speedup`` times as fast, or at each of ``--trace-rate`` /
    ``--rates`` (tools/bench/trace.py); results named after the trace file."""
    if args.rates and (args.speedup is not None or args.trace_rate is not None):
        raise SystemExit("bench run --trace: --rates paces the slice at each rate; "
                         "give it without --speedup or --trace-rate")
    max_model_len = args.max_model_len or (
        WorkloadSpec.max_model_len if served_config is None
        else served_config.engine.max_model_len)
    requests, fit = _fitted_trace(args, max_model_len)
    vocab = _trace_vocab(args, served_config)
    name = args.trace.stem
    paces = _trace_paces(args, requests)
    runs = []
    for label, speedup in paces:
        paced = trace.scale_time(requests, speedup)
        print(_trace_line(name, args, paced, fit, max_model_len, speedup))
        # each pace its own prompts: none cached by the run before
        seed = args.seed if len(paces) == 1 else f"{args.seed}@{label}"
        records, summary = measure_requests(
            args.base_url, args.model, trace.plan_trace(paced, vocab, seed), slo,
            not args.no_progress, f"{name} @ {label}", args.api_key, metrics_url)
        summary["trace"] = _trace_settings(args, fit, max_model_len, speedup, paced)
        print(report.table(f"{name} @ {label}", summary["all"]))
        runs.append((label, trace.mean_rate(paced) or 0.0, records, summary))
    report.write_runs(args.out, name, f"trace {name}", runs)
    report.trace_timeline_plot(
        args.out / f"run-{name}-timeline.png", {label: records for label, _, records, _ in runs},
        f"trace {name} over time", timeline_window([r for _, _, rs, _ in runs for r in rs]))
    print(f"results in {args.out}/")
    return 0


def planned_slice(args, config: PDServeConfig) -> list[PlannedRequest]:
    """``bench variants --trace``: the slice fitted to ``config``'s context and paced once
    (``--speedup`` or ``--trace-rate``), planned with ``--seed``: the same requests for
    every variant, each served by a cluster of its own (so none finds another's KV)."""
    max_model_len = args.max_model_len or config.engine.max_model_len
    requests, fit = _fitted_trace(args, max_model_len)
    [(_, speedup)] = _trace_paces(args, requests)
    paced = trace.scale_time(requests, speedup)
    print(_trace_line(args.trace.stem, args, paced, fit, max_model_len, speedup))
    return trace.plan_trace(paced, _trace_vocab(args, config), args.seed)


def _command(args) -> str:
    """The command's name in messages: ``bench run``, ``bench compare``."""
    return f"bench {getattr(args, 'bench_command', None) or 'run'}"


def _fitted_trace(args, max_model_len: int) -> tuple[list[trace.TraceRequest],
                                                     trace.FitReport]:
    """The ``--trace`` slice fitted to ``max_model_len`` tokens (``--too-long``), and what
    fitting did; exits when nothing is left to replay."""
    if max_model_len < 2:
        raise SystemExit(f"{_command(args)} --max-model-len: at least 2 (a prompt and an "
                         "answer)")
    requests, fit = trace.fit_to_window(_trace_slice(args), max_model_len, args.too_long)
    if not requests:
        raise SystemExit(f"{_command(args)} --trace {args.trace}: no request to replay in "
                         "the slice (--start, --duration, --too-long)")
    return requests, fit


def _trace_slice(args) -> list[trace.TraceRequest]:
    """The trace file's requests in the ``--start``/``--duration`` window, the first
    ``--max-requests`` of them."""
    if args.max_requests is not None and args.max_requests < 1:
        raise SystemExit(f"{_command(args)} --max-requests: at least 1")
    try:
        with args.trace.open() as lines:
            requests = trace.read_trace(lines, args.trace_format)
        requests = trace.window(requests, args.start, args.duration)
    except (OSError, ValueError) as error:
        raise SystemExit(f"{_command(args)} --trace {args.trace}: {error}") from None
    return requests[:args.max_requests]


def _trace_vocab(args, served_config: PDServeConfig | None) -> list[int]:
    """The token ids a trace's prompts are drawn from: the served model's tokenizer's
    (``--tokenizer``, else the ``--config``'s model), special ones left out."""
    path = args.tokenizer or (None if served_config is None else str(served_config.model.path))
    if path is None:
        raise SystemExit("bench run --trace: its prompts are token ids of the served model's "
                         "vocabulary: give --tokenizer (or --config)")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return trace.usable_vocab(tokenizer.vocab_size, tokenizer.all_special_ids)


def _trace_paces(args, requests: list[trace.TraceRequest]) -> list[tuple[str, float]]:
    """Each run's (label, speedup): one per ``--rates`` rate, else ``--trace-rate``, else
    ``--speedup``, else as recorded (x1). A rate is the slice's mean, (n - 1) / span."""
    swept = getattr(args, "rates", None)  # run's flag only
    rates = ([float(r) for r in swept.split(",")] if swept
             else [] if args.trace_rate is None else [args.trace_rate])
    if not rates:
        speedup = 1.0 if args.speedup is None else args.speedup
        if speedup <= 0:
            raise SystemExit("bench run --speedup: > 0")
        return [(f"x{speedup:g}", speedup)]
    recorded = trace.mean_rate(requests)
    if recorded is None:
        raise SystemExit("bench run --trace: the slice has no rate to scale (one request, "
                         "or all at one instant); drop --trace-rate/--rates")
    if min(rates) <= 0:
        raise SystemExit("bench run --trace-rate/--rates: > 0")
    return [(f"{rate}", rate / recorded) for rate in rates]


def _trace_line(name: str, args, paced: list[trace.TraceRequest], fit: trace.FitReport,
                max_model_len: int, speedup: float) -> str:
    """The one line saying what is replayed: the window's requests, how many were clipped
    and skipped, the time scale and the resulting mean rate."""
    end = "end" if args.duration is None else f"{args.start + args.duration:g} s"
    rate = trace.mean_rate(paced)
    return (f"trace {name} [{args.start:g} s, {end}): {fit.total} requests, "
            f"{fit.clipped} clipped and {fit.skipped} skipped ({args.too_long} to "
            f"{max_model_len} tokens), {len(paced)} sent; time x{speedup:.3g} "
            f"(arrivals / {speedup:.3g}), mean rate "
            f"{'-' if rate is None else f'{rate:.3g}'} req/s")


def _trace_settings(args, fit: trace.FitReport, max_model_len: int, speedup: float,
                    paced: list[trace.TraceRequest]) -> dict:
    """What the run's JSON records of the trace: which slice, fitted how, paced how."""
    return {"path": str(args.trace), "format": args.trace_format, "start_s": args.start,
            "duration_s": args.duration, "max_requests": args.max_requests,
            "too_long": args.too_long, "max_model_len": max_model_len,
            "fit": asdict(fit), "speedup": speedup, "mean_rate": trace.mean_rate(paced),
            "seed": args.seed}


# ---- compare --trace -------------------------------------------------------------------

def compare_trace(args, config: PDServeConfig, slo: SLO, setups: dict,
                   variants: dict[str, tuple[Path, PDServeConfig]]) -> int:
    """``bench compare --trace``: each setup in turn, up alone, probed with the trace slice
    time-scaled to the rates a ``rate_match.RateSearch`` picks, until the highest rate at
    which the SLO holds (``rate_match.HoldRule``) is bracketed; then each setup's goodput
    at that rate per engine core, side by side (tools/bench/rate_match.py)."""
    from tools import processes

    max_model_len = args.max_model_len or config.engine.max_model_len
    requests, fit = _fitted_trace(args, max_model_len)
    recorded = trace.mean_rate(requests)
    if recorded is None:
        raise SystemExit("bench compare --trace: the slice has no rate to scale (one "
                         "request, or all at one instant): widen --duration/--max-requests")
    rule = rate_match.HoldRule.from_config(config.slo, args.ttft_slo, args.itl_slo)
    search = _rate_search(args)
    vocab = _trace_vocab(args, config)
    name = args.trace.stem
    print(f"trace {name}: {fit.kept} requests ({fit.clipped} clipped, {fit.skipped} skipped "
          f"to {max_model_len} tokens), recorded mean rate {recorded:.3g} req/s; the SLO "
          f"holds at a rate when {rule.describe()}")
    probes: dict[str, list[dict]] = {}
    matched: list[rate_match.Matched] = []
    cores = {setup: _engine_cores(setup, config, variants) for setup in setups}
    for setup, start in setups.items():
        with processes.running(start()) as server:
            warm_up(server.base_url, config.model.name)
            probes[setup] = _search_rate(args, setup, server.base_url, config.model.name,
                                         requests, vocab, slo, rule, search)
        matched.append(_matched(setup, probes[setup], cores[setup][0]))
        # written after every setup: a later setup that fails to start loses nothing
        rows = rate_match.matched_rows(matched)
        report.write_json(args.out / f"compare-trace-{name}.json", {
            "config": str(args.config), "machine": machine(),
            "trace": _trace_settings(args, fit, max_model_len, 1.0, requests),
            "rule": asdict(rule), "goodput_slo": asdict(slo), "search": asdict(search),
            "engine_cores": {s: {"cores": c, "counted": how} for s, (c, how) in cores.items()},
            "result": rows, "probes": probes})
    counted = {"bound": "their CPU binding", "reserved": "replicas x num_cpus"}
    print(rate_match.matched_table(
        f"rate-matched on trace {name}: the SLO holds when {rule.describe()};\n"
        f"  goodput: requests/s with TTFT <= {slo.ttft_s:g} s and TPOT <= {slo.tpot_s:g} s; "
        "engine cores by " + ", ".join(f"{setup}: {counted[how]}"
                                       for setup, (_, how) in cores.items()), rows))
    report.goodput_rate_plot(
        args.out / f"compare-trace-{name}-goodput.png",
        {setup: [(p["rate"], p["all"]["goodput_requests_per_s"], p["held"]) for p in runs]
         for setup, runs in probes.items()},
        f"goodput against offered rate, trace {name} (filled: SLO held)")
    shown = {setup: rate_match.shown_rate([(p["rate"], p["held"]) for p in runs])
             for setup, runs in probes.items()}
    at_best = {f"{setup} @ {rate:.3g}/s": [RequestRecord(**r) for p in probes[setup]
                                           if p["rate"] == rate for r in p["records"]]
               for setup, rate in shown.items() if rate is not None}
    report.trace_timeline_plot(
        args.out / f"compare-trace-{name}-timeline.png", at_best,
        f"trace {name} over time, each setup at its highest rate that held (else its lowest)",
        timeline_window([r for records in at_best.values() for r in records]))
    print(f"results in {args.out}/")
    return 0


def _rate_search(args) -> rate_match.RateSearch:
    """The search the ``--search-*`` flags describe."""
    try:
        return rate_match.RateSearch(start=args.search_start_rate,
                                     max_probes=args.search_max_probes,
                                     tolerance=args.search_tolerance,
                                     min_rate=args.search_min_rate)
    except ValueError as error:
        raise SystemExit(f"bench compare --search-*: {error}") from None


def _search_rate(args, setup: str, base_url: str, model: str,
                 requests: list[trace.TraceRequest], vocab: list[int], slo: SLO,
                 rule: rate_match.HoldRule, search: rate_match.RateSearch) -> list[dict]:
    """One running setup's probes, in order: each the slice time-scaled to the search's
    next rate, its summary, records and verdict."""
    probes: list[dict] = []
    while (rate := search.next_rate([(p["rate"], p["held"]) for p in probes])) is not None:
        paced = trace.scale_to_rate(requests, rate)
        # each probe its own prompts (the same lengths and shared-prefix structure), so
        # none finds an earlier probe's in a prefix cache
        planned = trace.plan_trace(paced, vocab, seed=f"{args.seed}@{setup}@{rate}")
        # no metrics_url: settling the cluster's metrics before and after a probe costs
        # tens of seconds each, and the search asks only whether the SLO held
        records, summary = measure_requests(base_url, model, planned, slo,
                                            not args.no_progress, f"{setup} @ {rate:.3g}/s")
        verdict = rule.judge(summary["all"])
        print(rate_match.probe_line(setup, rate, summary["all"], verdict), flush=True)
        probes.append({"rate": rate, "held": verdict.held, "broken": list(verdict.broken),
                       **summary, "records": [asdict(r) for r in records]})
    return probes


def _matched(setup: str, probes: list[dict], cores: float) -> rate_match.Matched:
    """A setup's search result: its bracket, and the goodput measured at its best rate."""
    low, high = rate_match.bracket([(p["rate"], p["held"]) for p in probes])
    goodput = next((p["all"]["goodput_requests_per_s"] for p in probes if p["rate"] == low),
                   None)
    return rate_match.Matched(setup, low, high, goodput, cores)


def _engine_cores(setup: str, config: PDServeConfig,
                  variants: dict[str, tuple[Path, PDServeConfig]]) -> tuple[float, str]:
    """The cores setup ``setup``'s engines run on, as tools/bench/servers.py starts them,
    and how they were counted (``rate_match.engine_cores``: bound cores, else the
    replicas' reserved CPUs)."""
    if setup in variants:
        config = variants[setup][1]
    pools = (config.prefill, config.decode)
    if setup == "colocated":  # one engine, bound to both pools' cores together
        reserved = sum(pool.replicas * pool.num_cpus for pool in pools)
        engines = [rate_match.EnginePool(all_cores_bind(config), 1, reserved)]
    elif setup in ("serve-llm", "serve-llm-per-token"):
        # pdserve's engine settings for the primary version, one replica per pool
        engines = [rate_match.EnginePool(pool.env.get(CPU_BIND_ENV), 1, pool.num_cpus)
                   for pool in (config.pool(config.model.version, role)
                                for role in ("prefill", "decode"))]
    else:
        # every version's two pools at their configured replicas: what the cluster starts
        # with (under autoscaling it may run more or fewer)
        engines = [rate_match.EnginePool(pool.env.get(CPU_BIND_ENV), pool.replicas,
                                         pool.num_cpus)
                   for version in config.versions for role in ("prefill", "decode")
                   for pool in [config.pool(version, role)]]
    return rate_match.engine_cores(engines)
