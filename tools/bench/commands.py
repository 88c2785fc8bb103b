"""The ``pdserve bench`` commands' bodies (shell): run, compare, variants, overhead,
transfer.

Each ``bench_<command>(args)`` takes the parsed flags of tools/bench/cli.py, prints its
tables and writes its JSON (and plots) under ``--out``; the measuring is in
tools/bench/measure.py, the servers in tools/bench/servers.py, the tables in
tools/bench/tables.py and tools/bench/overhead.py; ``--trace`` runs and comparisons in
tools/bench/trace_commands.py.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace

from cluster.config import PDServeConfig, load_config
from cluster.engine.args import CPU_BIND_ENV
from cluster.slo import SLOConfig
from tools.bench import cpu, quality, report, tables, trace_commands
from tools.bench.defaults import COMPARE_REFERENCE_PORT, REPO
from tools.bench.measure import (
    measure_requests,
    measure_workload,
    metrics_url_of,
    quality_positions,
    settled_scrape,
    token_counter,
    vllm_phases,
    vllm_phases_since,
    work_since,
)
from tools.bench.servers import (
    compare_setup,
    compare_variants,
    machine,
    warm_up,
    write_config,
)
from tools.bench.stats import SLO, RequestRecord
from tools.bench.workload import PlannedRequest, WorkloadSpec, plan


def _spec(args, workload: str | None = None, rate: float | None = None,
          max_model_len: int = 9216) -> WorkloadSpec:
    """The workload the flags of ``_workload_args`` (tools/bench/cli.py) describe."""
    window = None
    if args.peak_window:
        start, end = (float(part) for part in args.peak_window.split(","))
        window = (start, end)
    return WorkloadSpec(
        name=workload or args.workload, rate=rate or args.rate, num_requests=args.num_requests,
        seed=args.seed, scale=args.scale, peak_factor=args.peak_factor, peak_window=window,
        long_fraction=args.long_fraction, max_model_len=max_model_len,
        repeat_fraction=args.repeat_fraction,
        shared_prefix_tokens=args.shared_prefix_tokens,
        prefix_groups=args.prefix_groups, turns=args.turns, think_s=args.think_s,
        prompt_salt=args.prompt_salt,
    )


def _goodput_slo(args, slo: SLOConfig) -> SLO:
    """The config's SLOs, overridden by ``--ttft-slo`` / ``--tpot-slo`` where given."""
    return SLO.from_config(slo, args.ttft_slo, args.tpot_slo)


# ---- run -------------------------------------------------------------------------------

def bench_run(args) -> int:
    """One workload (or a sweep of rates) against any OpenAI-compatible server."""
    served_config = None if args.config is None else load_config(args.config)
    slo = _goodput_slo(args, SLOConfig() if served_config is None else served_config.slo)
    metrics_url = args.metrics_url or (
        None if served_config is None else metrics_url_of(served_config))
    if args.trace is not None:
        return trace_commands.run_trace(args, served_config, slo, metrics_url)
    count_tokens = token_counter(args.tokenizer)
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    runs = []
    for rate in rates:
        spec = _spec(args, rate=rate)
        if len(rates) > 1:   # each rate its own prompts: none cached by the rate before
            spec = replace(spec, prompt_salt=f"{spec.prompt_salt}@{rate:g}/s")
        records, summary = measure_workload(args.base_url, args.model, spec, count_tokens,
                                            slo, not args.no_progress,
                                            f"{spec.name} @ {rate}/s", args.api_key,
                                            metrics_url)
        print(report.table(f"{spec.name} @ {rate} req/s", summary["all"]))
        runs.append((f"{rate}", rate, records, summary))
    report.write_runs(args.out, args.workload, f"{args.workload} workload", runs)
    print(f"results in {args.out}/")
    return 0


# ---- compare ---------------------------------------------------------------------------

def bench_compare(args) -> int:
    """Same machine, same cores, one after the other: (a) pdserve, (b) colocated vLLM."""
    from cluster.checkpoints import ensure_checkpoints
    from tools import processes

    config = load_config(args.config)
    ensure_checkpoints(config)
    slo = _goodput_slo(args, config.slo)
    log_dir = args.out / "logs"
    variants = compare_variants(args.config, args.variant, args.out)
    setups = {name: compare_setup(name, args.config, config, log_dir, variants)
              for name in args.setups.split(",")}
    if args.trace is not None:
        return trace_commands.compare_trace(args, config, slo, setups, variants)
    count_tokens = token_counter(args.tokenizer or str(config.model.path))
    results: dict[str, dict[str, dict]] = {}
    records: dict[str, dict[str, list[RequestRecord]]] = {}
    for setup, start in setups.items():
        # pdserve's setups export its metrics: where their time went, stage by stage
        metrics_url = (metrics_url_of(config) if setup == "pdserve" or setup in variants
                       else None)
        with processes.running(start()) as server:
            for workload in args.workloads.split(","):
                spec = _spec(args, workload, max_model_len=config.engine.max_model_len)
                warm_up(server.base_url, config.model.name)
                recs, summary = measure_workload(server.base_url, config.model.name, spec,
                                                 count_tokens, slo, not args.no_progress,
                                                 f"{setup}/{workload}",
                                                 metrics_url=metrics_url)
                results.setdefault(workload, {})[setup] = summary
                records.setdefault(workload, {})[setup] = recs
                print(report.table(f"{setup} / {workload}", summary["all"]))
    _report_compare(args, list(setups), results, records)
    return 0


def _report_compare(args, setups: list[str], results: dict[str, dict[str, dict]],
                    records: dict[str, dict[str, list[RequestRecord]]]) -> None:
    """The first setup's ratios to each other's, the JSON, and the TTFT plots."""
    first, *others = setups
    ratios = {f"{first} / {other}": {w: tables.compare_ratios(r[first], r[other])
                                      for w, r in results.items()} for other in others}
    for pair, per_workload in ratios.items():
        print(tables.ratio_table(pair, per_workload))
    report.write_json(args.out / "compare.json", {
        "config": str(args.config), "machine": machine(), "ratios": ratios,
        "results": results,
        "records": {w: {s: [asdict(r) for r in recs] for s, recs in per.items()}
                    for w, per in records.items()},
    })
    for workload, per_setup in records.items():
        runs = {f"{setup} {kind}": [r for r in recs if r.kind == kind]
                for setup, recs in per_setup.items() for kind in ("short", "long")}
        report.ttft_cdf_plot(args.out / f"compare-{workload}-ttft-cdf.png", runs,
                             f"TTFT, {workload} workload: {', '.join(per_setup)}")
    print(f"results in {args.out}/")


# ---- variants --------------------------------------------------------------------------

def bench_variants(args) -> int:
    """The same seeded workload against the base config with each variant's overrides."""
    import yaml

    from cluster.config import parse_config
    from tools.bench.variants import parse_variant

    variants = [parse_variant(text) for text in args.variant]
    base = yaml.safe_load(args.config.read_text())
    base_config = parse_config(base, source=str(args.config))
    # one bound for every variant (the base config's), so their goodputs compare
    slo = _goodput_slo(args, base_config.slo)
    args.out.mkdir(parents=True, exist_ok=True)
    # a trace's slice is planned once: every variant gets the same token ids
    replayed = (None if args.trace is None
                else trace_commands.planned_slice(args, base_config))
    summaries: dict[str, dict] = {}
    positions: dict[str, list[list[quality.Position]]] = {}
    for variant in variants:
        summary = _run_variant(args, base, variant, slo, positions, replayed)
        if positions:
            summary["quality"] = quality.compare(positions[variants[0].name],
                                                 positions[variant.name]).to_json()
        summaries[variant.name] = summary
        print(report.table(f"{variant.name} {variant.overrides}", summary["all"]))
        report.write_json(args.out / f"variant-{variant.name}-summary.json",
                          {**summary, "overrides": variant.overrides})
    print(tables.variants_table(summaries))
    report.write_json(args.out / "variants.json",
                      {"config": str(args.config), "machine": machine(),
                       "variants": {v.name: v.overrides for v in variants},
                       "results": summaries})
    return 0


def _run_variant(args, base: dict, variant, slo: SLO,
                 positions: dict[str, list[list[quality.Position]]],
                 replayed: list[PlannedRequest] | None = None) -> dict:
    """Serve one variant, run the workload (or ``replayed``, a trace's planned slice)
    against it and summarise it (with its engines' CPU by role); with
    ``--quality-passages``, add its held-out logprobs to ``positions``."""
    from cluster.checkpoints import ensure_checkpoints
    from cluster.config import parse_config
    from tools import processes
    from tools.bench.variants import apply_overrides

    document = apply_overrides(base, variant.overrides)
    config = parse_config(document, source=f"variant {variant.name}")
    path = write_config(document, args.out / f"variant-{variant.name}.yaml")
    ensure_checkpoints(config)
    started = processes.start_pdserve(path, config, args.out / "logs", REPO,
                                      name=f"pdserve-{variant.name}")
    with processes.running(started) as server:
        warm_up(server.base_url, config.model.name)
        cpu_before = cpu.sample_processes()
        if replayed is None:
            count_tokens = token_counter(args.tokenizer or str(config.model.path))
            spec = _spec(args, max_model_len=config.engine.max_model_len)
            _, summary = measure_workload(server.base_url, config.model.name, spec,
                                          count_tokens, slo, not args.no_progress,
                                          variant.name, metrics_url=metrics_url_of(config))
        else:
            _, summary = measure_requests(server.base_url, config.model.name, replayed, slo,
                                          not args.no_progress, variant.name,
                                          metrics_url=metrics_url_of(config))
        summary["cpu_s_by_role"] = cpu.cpu_by_role(cpu_before, cpu.sample_processes(),
                                                   server.process.pid)
        if args.quality_passages:
            positions[variant.name] = quality_positions(
                server.base_url, config.model.name, args.quality_passages,
                args.quality_chars, args.quality_top)
    return summary


# ---- overhead --------------------------------------------------------------------------

def bench_overhead(args) -> int:
    """Short prompts one at a time: vLLM's server on the decode pool's cores, then pdserve
    on each path (tools/bench/overhead.py)."""
    from cluster.checkpoints import ensure_checkpoints
    from tools import processes
    from tools.bench import overhead
    from tools.bench.variants import Variant, parse_variant

    variants = [parse_variant(text) for text in args.variant or []] or [Variant("", {})]
    config = load_config(args.config)
    ensure_checkpoints(config)
    if not args.one_at_a_time:
        return _overhead_sweep(args, config, variants)
    spec = WorkloadSpec(name="reference", rate=1000, num_requests=args.requests, seed=7)
    requests = overhead.shorten(plan(spec, token_counter(str(config.model.path))),
                                args.max_tokens, args.prompt_chars)
    runs: dict[str, dict] = {}
    for setup, start in _overhead_setups(args, config, variants).items():
        with processes.running(start()) as server:
            runs[setup] = _overhead_run(args, setup, server, config, requests)
    print(overhead.latency_table(runs, baseline="vllm"))
    print(overhead.cpu_table(runs))
    for setup, run in runs.items():
        _print_overhead_shares(setup, run)
    report.write_json(args.out / "overhead.json", {
        "config": str(args.config), "max_tokens": args.max_tokens,
        "concurrency": args.concurrency, "runs": runs,
        "machine": machine()})
    return 0


def _overhead_sweep(args, config: PDServeConfig, variants: list) -> int:
    """``--rates``: vLLM's server up for the whole sweep; each pdserve setup up in turn
    beside it; at each rate the two run in ABBA order, each run with prompts of its own
    (tools/bench/sweep.py)."""
    from tools import processes
    from tools.bench import overhead, sweep

    rates = [float(rate) for rate in args.rates.split(",")]
    counter = token_counter(str(config.model.path))
    model = config.model.name

    def requests_at(rate: float, salt: str) -> list:
        spec = WorkloadSpec(name="reference", rate=rate, num_requests=args.requests, seed=7,
                            prompt_salt=salt)
        return overhead.shorten(plan(spec, counter), args.max_tokens, args.prompt_chars,
                                keep_times=True)

    setups = _overhead_setups(args, config, variants)
    start_vllm = setups.pop("vllm")
    runs: list[dict] = []
    with processes.running(start_vllm()) as vllm:
        warm_up(vllm.base_url, model)
        servers = {"vllm": (vllm, overhead.idle_cpu_rate(vllm.process.pid,
                                                         args.idle_sample_s), 0)}
        for index, (name, start) in enumerate(setups.items(), start=1):
            with processes.running(start()) as server:
                warm_up(server.base_url, model)
                servers[name] = (server, overhead.idle_cpu_rate(server.process.pid,
                                                                args.idle_sample_s), index)
                for rate in rates:
                    for setup, round_ in sweep.abba("vllm", name):
                        running, idle, setup_index = servers[setup]
                        run = overhead.measure_at_rate(
                            running.base_url, model,
                            requests_at(rate, sweep.run_salt(index, setup_index, round_,
                                                             rate)),
                            running.process.pid, idle)
                        runs.append(run | {"rate": rate, "setup": setup, "round": round_,
                                           "against": name})
                        print(f"  {rate:g}/s {setup} round {round_}: {run['n']} of "
                              f"{run['requests']} answered", flush=True)
            print(sweep.sweep_table([run for run in runs if run["against"] == name],
                                    "vllm", name), flush=True)
    report.write_json(args.out / "overhead-sweep.json", {
        "config": str(args.config), "max_tokens": args.max_tokens,
        "prompt_chars": args.prompt_chars, "rates": rates, "runs": runs,
        "machine": machine()})
    return 0


def _overhead_setups(args, config: PDServeConfig, variants: list) -> dict:
    """What starts each server of ``bench overhead``, by name: vLLM's own, then pdserve on
    each of ``--paths`` once per ``--variant`` (config files written under ``--out``)."""
    import yaml

    from cluster.config import parse_config
    from tools import processes
    from tools.bench import overhead
    from tools.bench.variants import apply_overrides

    log_dir = args.out / "logs"
    # the primary version's decode pool: the one whose engine settings the baseline runs
    decode_bind = config.pool(config.model.version, "decode").env.get(CPU_BIND_ENV)
    setups = {"vllm": lambda: processes.start_vllm_server(
        config, COMPARE_REFERENCE_PORT, log_dir, REPO, name="overhead-vllm", role="decode",
        cpu_bind=decode_bind)}
    document = yaml.safe_load(args.config.read_text())
    for path in args.paths.split(","):
        try:
            path_document = overhead.config_for_path(document, path, config)
        except ValueError as error:
            raise SystemExit(f"bench overhead --paths: {error}") from None
        for variant in variants:
            name = "-".join(filter(None, (path, variant.name)))
            setup_document = apply_overrides(path_document, variant.overrides)
            setup_file = write_config(setup_document, args.out / f"overhead-{name}.yaml")
            setup_config = parse_config(setup_document, source=str(setup_file))
            setups[f"pdserve {name}"] = (
                lambda f=setup_file, c=setup_config: processes.start_pdserve(
                    f, c, log_dir, REPO))
    return setups


def _overhead_run(args, setup: str, server, config: PDServeConfig, requests: list) -> dict:
    """One server's ``overhead.measure``, with where its time to the first event went:
    pdserve's stages from the cluster's metrics, vLLM's engine phases from its own."""
    from tools.bench import overhead

    warm_up(server.base_url, config.model.name)
    metrics_url = metrics_url_of(config) if setup != "vllm" else None
    before = settled_scrape(metrics_url)
    vllm_before = vllm_phases(server.base_url) if setup == "vllm" else None
    run = overhead.measure(server.base_url, config.model.name, requests,
                           server.process.pid, concurrency=args.concurrency,
                           idle_sample_s=args.idle_sample_s)
    if before is not None:  # where pdserve's part of the TTFT went
        print(f"{setup}: where the time to the first event went")
        run |= work_since(metrics_url, before, run["n"])
        run["ttft_by_owner_s"] = overhead.engine_share(run["stages"])
    if vllm_before is not None:  # its one engine's phases, to set beside pdserve's
        run["stages"] = vllm_phases_since(server.base_url, vllm_before, run["n"])
    run["prompt_prefill_mean_s"] = overhead.prompt_prefill_mean_s(run.get("stages"))
    return run


def _print_overhead_shares(setup: str, run: dict) -> None:
    """Whose the router's part of the TTFT was, and how many tokens/s one core relays."""
    from tools.bench import overhead

    share = run.get("ttft_by_owner_s")
    if share:
        print(f"  {setup}: router's part of the TTFT {share['router_s'] * 1000:.1f} ms "
              f"= engines {share['engines_s'] * 1000:.1f} + serving "
              f"{share['serving_s'] * 1000:.1f}: hops between replicas and engines "
              f"{share['engine_hops_s'] * 1000:.1f}, the rest (Serve's calls, routers, "
              f"replica code) {share['calls_and_router_s'] * 1000:.1f}; means")
    for role in ("router", "proxy", "decode replica"):
        capacity = overhead.relay_capacity(run, role)
        if setup != "vllm" and capacity:
            print(f"  {setup}: one {role} core relays ~{capacity:,.0f} tokens/s at this "
                  f"CPU per token ({run['tokens_per_s']:,.0f} tokens/s streamed here)")


# ---- transfer --------------------------------------------------------------------------

def bench_transfer(args) -> int:
    """KV-transfer GB/s of each transport and block size, beside a host memcpy."""
    from tools.bench.transfer import TRANSPORTS, measure_transfers

    sizes = [int(s) for s in args.sizes_mib.split(",")]
    started = time.time()
    transports = args.transports.split(",")
    unknown = sorted(set(transports) - set(TRANSPORTS))
    if unknown:
        raise SystemExit(f"bench transfer --transports: unknown {unknown} "
                         f"(of {', '.join(TRANSPORTS)})")
    block_sizes = [int(kib) * 1024 for kib in args.block_kib.split(",")]
    rows = measure_transfers(sizes, args.repeats, transports, block_sizes)
    print(f"  {'block KiB':<10}{'transport':<10}{'MiB':>6}{'read GB/s':>11}"
          f"{'memcpy GB/s':>13}{'ratio':>8}  moved by")
    for row in rows:  # nixl_gbps: a READ through the NIXL agent API, whatever moved it
        print(f"  {row['block_kib']:<10}{row['transport']:<10}{row['mib']:>6}"
              f"{row['nixl_gbps']:>11.2f}{row['memcpy_gbps']:>13.2f}{row['ratio']:>8.2f}"
              f"  {row['moved_by']}")
    report.write_json(args.out / "transfer.json",
                      {"rows": rows, "machine": machine(), "seconds": time.time() - started})
    return 0
