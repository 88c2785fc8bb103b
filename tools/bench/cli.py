"""``pdserve bench``: run, compare, overhead, transfer.

  pdserve bench run --base-url http://127.0.0.1:8000 --model tiny-llama --rate 2
  pdserve bench compare --config ray_configs/bench.yaml
  pdserve bench overhead --config ray_configs/bench.yaml
  pdserve bench transfer
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

from cluster.config import PDServeConfig, load_config
from cluster.engine.args import CPU_BIND_ENV
from cluster.slo import SLOConfig
from tools.bench import breakdown, cpu, engine_work, quality, report
from tools.bench.overhead import IDLE_SAMPLE_S
from tools.bench.runner import run_workload
from tools.bench.stats import SLO, RequestRecord, ratio, summarise
from tools.bench.workload import WorkloadSpec, plan

REPO = Path(__file__).resolve().parents[2]
BENCH_CONFIG = REPO / "ray_configs/bench.yaml"


def add_parser(commands) -> None:
    bench = commands.add_parser("bench", help="measure a server (see docs/benchmarks.md)")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    run = sub.add_parser("run", help="one workload against any OpenAI-compatible server")
    run.add_argument("--base-url", default="http://127.0.0.1:8000")
    run.add_argument("--model", default="tiny-llama")
    run.add_argument("--api-key", default=os.environ.get("PDSERVE_API_KEY"),
                     help="sent as 'Authorization: Bearer' (default: $PDSERVE_API_KEY)")
    run.add_argument("--rates", default=None,
                     help="comma-separated rates to sweep (plots latency against load)")
    run.add_argument("--config", type=Path, default=None,
                     help="the served pdserve config: goodput is judged by its `slo` "
                          "(default: the `slo` section's defaults), and its metrics port "
                          "gives the stage breakdown")
    run.add_argument("--metrics-url", default=None,
                     help="a pdserve cluster's Prometheus endpoint: print where the time "
                          "to the first event went, stage by stage (default: the "
                          "--config cluster's, if it exports metrics)")
    _workload_args(run)

    compare = sub.add_parser("compare", help="pdserve disaggregated vs one colocated vLLM")
    compare.add_argument("--config", type=Path, default=BENCH_CONFIG)
    compare.add_argument("--workloads", default="interference,reference")
    compare.add_argument("--setups", default="pdserve,colocated",
                         help="comma-separated, the first is the ratios' numerator: "
                              "pdserve, colocated (one vLLM engine on both pools' cores), "
                              "serve-llm (Ray Serve LLM's PD app with pdserve's engine "
                              "settings; needs the serve-llm extra), serve-llm-per-token "
                              "(the same, streaming each token without its 50 ms batching), "
                              "or the name of a --variant")
    compare.add_argument("--variant", action="append", default=[],
                         help="name:key.path=value,... (repeat): a pdserve setup of that "
                              "name, the config with these settings overridden, e.g. "
                              "--setups pdserve,chunk0,colocated --variant "
                              "chunk0:router.stream_chunk_interval_ms=0")
    _workload_args(compare)

    overhead = sub.add_parser("overhead", help="pdserve's added latency and relay CPU per token")
    overhead.add_argument("--config", type=Path, default=BENCH_CONFIG)
    overhead.add_argument("--requests", type=int, default=30)
    overhead.add_argument("--max-tokens", type=int, default=16,
                          help="tokens per answer (256: the per-token cost of streaming)")
    overhead.add_argument("--concurrency", type=int, default=1,
                          help="streams at a time (1: nothing queues or batches; more: "
                          "the relaying processes' CPU per token under load)")
    overhead.add_argument("--paths", default="decode_local,disaggregated",
                          help="pdserve's paths to measure, each a run of its own")
    overhead.add_argument("--variant", action="append", default=None,
                          help="name:key.path=value,... (repeat): each path runs once per "
                          "variant, e.g. --variant grpc --variant ray:router.transport=ray")
    overhead.add_argument("--idle-sample-s", type=float, default=IDLE_SAMPLE_S,
                          help="how long each server's idle CPU is sampled before its run "
                          "(subtracted from the run's, per role)")
    overhead.add_argument("--out", type=Path, default=Path("bench-results"))

    variants = sub.add_parser("variants", help="one workload against config variants (A/B)")
    variants.add_argument("--config", type=Path, default=BENCH_CONFIG)
    variants.add_argument("--variant", action="append", required=True,
                          help="name:key.path=value,... (repeat; the first is the baseline)")
    _workload_args(variants)
    variants.add_argument("--quality-passages", type=int, default=0,
                          help="also compare each variant's next-token distributions on this "
                               "many held-out passages with the first's (tools/bench/"
                               "quality.py); 0: off")
    variants.add_argument("--quality-chars", type=int, default=1024,
                          help="characters (bytes for the tiny models) per passage")
    variants.add_argument("--quality-top", type=int, default=20,
                          help="listed next tokens per position (at most vLLM's max_logprobs)")

    transfer = sub.add_parser("transfer",
                              help="KV-transfer GB/s (NIXL, shared memory) vs a host memcpy")
    transfer.add_argument("--sizes-mib", default="1,4,16,64")
    transfer.add_argument("--repeats", type=int, default=20)
    transfer.add_argument("--block-kib", default="16",
                          help="KiB per descriptor (one KV block of one layer), comma-"
                          "separated to compare: 16 is a 32-token block of the bench model")
    transfer.add_argument("--transports", default="tcp,cma,sm,shm",
                          help="paths to measure, each in fresh processes: UCX's tcp "
                               "(between hosts), cma and sm (same host), and shm, "
                               "pdserve's same-host path (kv_transfer.shared_memory)")
    transfer.add_argument("--out", type=Path, default=Path("bench-results"))


def _workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=["reference", "interference"],
                        default="reference")
    parser.add_argument("--rate", type=float, default=1.0, help="mean requests/s (Poisson)")
    parser.add_argument("--num-requests", type=int, default=60)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies prompt and output lengths (small machines)")
    parser.add_argument("--long-fraction", type=float, default=0.1)
    parser.add_argument("--peak-factor", type=float, default=1.0)
    parser.add_argument("--peak-window", default=None, help="START,END seconds into the run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat-fraction", type=float, default=0.0,
                        help="share of requests that repeat an earlier request exactly "
                             "(what a response cache can answer)")
    parser.add_argument("--turns", type=int, default=WorkloadSpec.turns,
                        help="requests per conversation: each later turn is sent a think "
                             "time after the answer before it, with the conversation so far "
                             "before its new message (what a decode engine's prefix cache "
                             "holds: router.routing.decode.cache_aware_path)")
    parser.add_argument("--think-s", type=float, default=WorkloadSpec.think_s,
                        help="mean pause (exponential) between an answer and the next turn")
    parser.add_argument("--prompt-salt", default=WorkloadSpec.prompt_salt,
                        help="text put before every prompt: runs of one seed with different "
                             "salts have the same lengths and times but share no KV block, so "
                             "a run does not find an earlier run's prompts in the prefix "
                             "caches (each rate of a --rates sweep adds its rate to it)")
    parser.add_argument("--shared-prefix-tokens", type=int,
                        default=WorkloadSpec.shared_prefix_tokens,
                        help="start every prompt with a shared head (a system prompt) of "
                             "about this many tokens (what prefix caches reuse); 0: none")
    parser.add_argument("--prefix-groups", type=int, default=WorkloadSpec.prefix_groups,
                        help="distinct shared heads, each request drawing one (tenants' "
                             "system prompts: what the decode pool's prefix affinity keeps "
                             "apart)")
    parser.add_argument("--tokenizer", default=None,
                        help="HF tokenizer dir used to size prompts (default: ~4 chars/token)")
    parser.add_argument("--ttft-slo", type=float, default=None,
                        help="goodput's TTFT bound, s (default: the config's slo.ttft_p95_s)")
    parser.add_argument("--tpot-slo", type=float, default=None,
                        help="goodput's bound on time per output token, s (default: the "
                             "config's slo.tpot_s)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--no-progress", action="store_true")


def main(args: argparse.Namespace) -> int:
    return {"run": _run, "compare": _compare, "overhead": _overhead,
            "variants": _variants, "transfer": _transfer}[args.bench_command](args)


# ---- shared helpers ----------------------------------------------------------------------

def _spec(args, workload: str | None = None, rate: float | None = None,
          max_model_len: int = 9216) -> WorkloadSpec:
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


def _token_counter(tokenizer_path: str | None):
    if tokenizer_path is None:
        return lambda text: max(1, len(text) // 4)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def _measure(base_url: str, model: str, spec: WorkloadSpec, count_tokens, slo: SLO,
             progress: bool, label: str, api_key: str | None = None,
             metrics_url: str | None = None) -> tuple[list[RequestRecord], dict]:
    """Run one workload; with ``metrics_url`` (a pdserve cluster's Prometheus endpoint),
    also where its requests' time to the first event went, stage by stage."""
    requests = plan(spec, count_tokens)
    before = _settled_scrape(metrics_url)
    records, duration = asyncio.run(
        run_workload(base_url, model, requests, progress=progress, label=label,
                     api_key=api_key)
    )
    summary = {
        "all": summarise(records, duration, slo),
        "short": summarise(records, duration, slo, kind="short"),
        "long": summarise(records, duration, slo, kind="long"),
        "later_turns": summarise(records, duration, slo, later_turns=True),
        "duration_s": duration,
        "workload": asdict(spec),
    }
    if before is not None:
        summary |= _work_since(metrics_url, before, sum(record.ok for record in records))
    return records, summary


def metrics_url_of(config: PDServeConfig) -> str | None:
    """The Prometheus endpoint of the local cluster ``config`` starts, if it exports one."""
    port = config.ray.metrics_export_port
    if config.ray.address is not None or port is None:
        return None
    return f"http://{config.ray.node_ip_address or config.router.host}:{port}/metrics"


# One scrape of a pdserve cluster's metrics: its stage histograms and its engines' work.
Scrape = tuple[breakdown.StageSamples, engine_work.EngineWork]


def _scrape(metrics_url: str) -> Scrape:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(httpx.get(metrics_url, timeout=30).text))
    return breakdown.stage_samples(families), engine_work.engine_work(families)


def _settled_scrape(metrics_url: str | None) -> Scrape | None:
    """The metrics once every earlier request's report is in: unchanged for longer than an
    engine's count takes to reach a scrape (its replica's flush, then Ray's export; a
    minute at most), so that requests answered before the run are not counted in it."""
    if metrics_url is None:
        return None
    import ray

    from cluster.metrics import settle_s

    settle = settle_s(ray._config.metrics_report_interval_ms() / 1000)
    deadline = time.monotonic() + 60
    scrape, since = _scrape(metrics_url), time.monotonic()
    while time.monotonic() - since < settle and time.monotonic() < deadline:
        time.sleep(1)
        latest = _scrape(metrics_url)
        if latest != scrape:
            scrape, since = latest, time.monotonic()
    return scrape


def _work_since(metrics_url: str, before: Scrape, answered: int) -> dict[str, dict]:
    """The stage breakdown of the ``answered`` requests since ``before`` and the engines'
    work for them: Ray exports the router's and the engines' metrics every few seconds, so
    wait (30 s at most) until every request's stages are in, then until the scrape
    settles: an engine's replica flushes its counts a few seconds after the step that
    made them, so they can arrive one export after the phases they belong to."""
    deadline = time.monotonic() + 30
    stages_before, work_before = before
    stages_after, _ = _scrape(metrics_url)
    while (min(breakdown.answered(stages_before, stages_after),
               breakdown.decoded(stages_before, stages_after)) < answered
           and time.monotonic() < deadline):
        time.sleep(1)
        stages_after, _ = _scrape(metrics_url)
    stages_after, work_after = _settled_scrape(metrics_url)
    stages = breakdown.breakdown(stages_before, stages_after)
    print(breakdown.table(stages))
    return {"stages": stages, "engine_work": engine_work.since(work_before, work_after)}


def _vllm_phases(base_url: str) -> breakdown.VllmPhaseTotals:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return breakdown.vllm_phase_totals(text_string_to_metric_families(text))


def _vllm_phases_since(base_url: str, before: breakdown.VllmPhaseTotals,
                       answered: int) -> dict[str, dict[str, float]]:
    """A vLLM server's engine phases (means) of the ``answered`` requests since ``before``:
    its API server records a request's when its last output arrives, which can be just
    after the client has read the stream's end (10 s at most)."""
    deadline = time.monotonic() + 10
    phases = breakdown.vllm_phase_means(before, _vllm_phases(base_url))
    while (phases.get("engine prefill", {}).get("requests", 0) < answered
           and time.monotonic() < deadline):
        time.sleep(0.2)
        phases = breakdown.vllm_phase_means(before, _vllm_phases(base_url))
    print("vllm: its engine's phases (means; vLLM's own buckets are too coarse for a p50)")
    for phase, row in phases.items():
        print(f"  {phase:<24}{row['requests']:>9.0f}{row['mean_s'] * 1000:>9.1f}")
    return phases


# ---- run -------------------------------------------------------------------------------

def _run(args) -> int:
    served_config = None if args.config is None else load_config(args.config)
    slo = _goodput_slo(args, SLOConfig() if served_config is None else served_config.slo)
    metrics_url = args.metrics_url or (
        None if served_config is None else metrics_url_of(served_config))
    count_tokens = _token_counter(args.tokenizer)
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.rate]
    sweep, runs = [], {}
    for rate in rates:
        spec = _spec(args, rate=rate)
        if len(rates) > 1:   # each rate its own prompts: none cached by the rate before
            spec = replace(spec, prompt_salt=f"{spec.prompt_salt}@{rate:g}/s")
        records, summary = _measure(args.base_url, args.model, spec, count_tokens, slo,
                                    not args.no_progress, f"{spec.name} @ {rate}/s",
                                    args.api_key, metrics_url)
        print(report.table(f"{spec.name} @ {rate} req/s", summary["all"]))
        sweep.append((rate, summary["all"]))
        runs[f"{rate} req/s"] = records
        report.write_json(args.out / f"run-{spec.name}-{rate}.json",
                          {**summary, "records": [asdict(r) for r in records]})
    report.ttft_cdf_plot(args.out / f"run-{args.workload}-ttft-cdf.png", runs,
                         f"TTFT, {args.workload} workload")
    if len(sweep) > 1:
        report.load_sweep_plot(args.out / f"run-{args.workload}-sweep.png", sweep,
                               f"latency against offered load, {args.workload} workload")
    print(f"results in {args.out}/")
    return 0


# ---- compare ---------------------------------------------------------------------------

COMPARE_REFERENCE_PORT = 8400


def _compare(args) -> int:
    """Same machine, same cores, one after the other: (a) pdserve, (b) colocated vLLM."""
    from cluster.checkpoints import ensure_checkpoints
    from tools import processes

    config = load_config(args.config)
    ensure_checkpoints(config)
    slo = _goodput_slo(args, config.slo)
    count_tokens = _token_counter(args.tokenizer or str(config.model.path))
    workloads = args.workloads.split(",")
    log_dir = args.out / "logs"
    variants = _compare_variants(args)
    setups = {name: _compare_setup(name, args.config, config, log_dir, variants)
              for name in args.setups.split(",")}
    results: dict[str, dict[str, dict]] = {}
    records: dict[str, dict[str, list[RequestRecord]]] = {}
    for setup, start in setups.items():
        with processes.running(start()) as server:
            for workload in workloads:
                spec = _spec(args, workload, max_model_len=config.engine.max_model_len)
                _warm_up(server.base_url, config.model.name)
                recs, summary = _measure(server.base_url, config.model.name, spec,
                                         count_tokens, slo, not args.no_progress,
                                         f"{setup}/{workload}", metrics_url=(
                                             metrics_url_of(config)
                                             if setup == "pdserve" or setup in variants
                                             else None))
                results.setdefault(workload, {})[setup] = summary
                records.setdefault(workload, {})[setup] = recs
                print(report.table(f"{setup} / {workload}", summary["all"]))
    first, *others = list(setups)
    ratios = {f"{first} / {other}": {w: _compare_ratios(r[first], r[other])
                                      for w, r in results.items()} for other in others}
    for pair, per_workload in ratios.items():
        print(_ratio_table(pair, per_workload))
    report.write_json(args.out / "compare.json", {
        "config": str(args.config), "machine": _machine(), "ratios": ratios,
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
    return 0


SERVE_LLM_PORT = 8600


def _compare_variants(args) -> dict[str, tuple[Path, PDServeConfig]]:
    """Each ``--variant`` of ``bench compare``: its config file (written under ``--out``)
    and parsed config, by name."""
    import yaml

    from cluster.config import parse_config
    from tools.bench.variants import apply_overrides, parse_variant

    base = yaml.safe_load(args.config.read_text())
    variants = {}
    for variant in map(parse_variant, args.variant):
        if variant.name in COMPARE_SETUPS:
            raise SystemExit(f"bench compare: variant {variant.name!r} has a setup's name")
        document = apply_overrides(base, variant.overrides)
        variants[variant.name] = (
            _write_config(document, args.out / f"variant-{variant.name}.yaml"),
            parse_config(document, source=f"variant {variant.name}"))
    return variants


COMPARE_SETUPS = ("pdserve", "colocated", "serve-llm", "serve-llm-per-token")


def _compare_setup(name: str, config_path: Path, config: PDServeConfig, log_dir: Path,
                   variants: dict[str, tuple[Path, PDServeConfig]]):
    """What starts setup ``name`` of ``bench compare`` (a server ``processes.running``
    waits for): one of ``COMPARE_SETUPS`` or a pdserve variant."""
    from tools import processes
    from tools.bench import serve_llm

    if name == "pdserve":
        return lambda: processes.start_pdserve(config_path, config, log_dir, REPO)
    if name in variants:
        path, variant_config = variants[name]
        return lambda: processes.start_pdserve(path, variant_config, log_dir, REPO,
                                               name=f"pdserve-{name}")
    if name == "colocated":
        return lambda: processes.start_vllm_server(
            config, COMPARE_REFERENCE_PORT, log_dir, REPO, name="colocated-vllm",
            role="decode", cpu_bind=_all_cores_bind(config))
    if name in ("serve-llm", "serve-llm-per-token"):
        batching = 0 if name == "serve-llm-per-token" else None

        def start():
            server = processes.start(name, serve_llm.start_args(
                config_path, SERVE_LLM_PORT, batching), f"http://127.0.0.1:{SERVE_LLM_PORT}",
                log_dir, REPO)
            server.ready_line, server.health_path = serve_llm.SERVING_LINE, "/v1/models"
            return server
        return start
    raise SystemExit(f"bench compare: unknown setup {name!r} ({', '.join(COMPARE_SETUPS)}, "
                     f"or a --variant's name)")


def _write_config(document: dict, path: Path) -> Path:
    """A config document as the YAML file a benchmark's pdserve is started with."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _all_cores_bind(config: PDServeConfig) -> str | None:
    """The colocated engine gets every core the two pools use together."""
    cores = []
    for pool in (config.prefill, config.decode):
        bind = pool.env.get("VLLM_CPU_OMP_THREADS_BIND")
        if bind:
            cores.append(bind)
    return ",".join(cores) or None


def _warm_up(base_url: str, model: str) -> None:
    import httpx

    for i in range(2):
        httpx.post(f"{base_url}/v1/completions", timeout=120, json={
            "model": model, "prompt": f"warm up {i} " * 20, "max_tokens": 4})


def _compare_ratios(pd: dict, colocated: dict) -> dict:
    """(a)/(b): below 1 is better for latencies, above 1 better for throughput."""
    return {
        "short_p95_ttft": ratio(pd["short"]["ttft_s"]["p95"], colocated["short"]["ttft_s"]["p95"]),
        "p95_itl": ratio(pd["all"]["itl_s"]["p95"], colocated["all"]["itl_s"]["p95"]),
        "throughput": ratio(pd["all"]["output_tokens_per_s"],
                            colocated["all"]["output_tokens_per_s"]),
        "goodput": ratio(pd["all"]["goodput_requests_per_s"],
                         colocated["all"]["goodput_requests_per_s"]),
    }


def _ratio_table(pair: str, ratios: dict[str, dict]) -> str:
    lines = [f"{pair} (latency: <1 is better; throughput, goodput: >1 is better)",
             f"  {'workload':<14}{'short p95 TTFT':>16}{'p95 ITL':>10}{'tok/s':>8}{'goodput':>9}"]
    for workload, r in ratios.items():
        cells = [r["short_p95_ttft"], r["p95_itl"], r["throughput"], r["goodput"]]
        shown = ["-" if c is None else f"{c:.2f}" for c in cells]
        lines.append(f"  {workload:<14}{shown[0]:>16}{shown[1]:>10}{shown[2]:>8}{shown[3]:>9}")
    return "\n".join(lines)


def _machine() -> dict:
    import os
    import platform

    return {"cpus": os.cpu_count(), "machine": platform.machine(),
            "processor": platform.processor(), "python": platform.python_version()}


# ---- variants --------------------------------------------------------------------------

def _variants(args) -> int:
    """The same seeded workload against the base config with each variant's overrides."""
    import yaml

    from cluster.checkpoints import ensure_checkpoints
    from cluster.config import parse_config
    from tools import processes
    from tools.bench.variants import apply_overrides, parse_variant

    variants = [parse_variant(text) for text in args.variant]
    base = yaml.safe_load(args.config.read_text())
    # one bound for every variant (the base config's), so their goodputs compare
    slo = _goodput_slo(args, parse_config(base, source=str(args.config)).slo)
    args.out.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, dict] = {}
    positions: dict[str, list[list[quality.Position]]] = {}
    for variant in variants:
        document = apply_overrides(base, variant.overrides)
        config = parse_config(document, source=f"variant {variant.name}")
        path = _write_config(document, args.out / f"variant-{variant.name}.yaml")
        ensure_checkpoints(config)
        count_tokens = _token_counter(args.tokenizer or str(config.model.path))
        spec = _spec(args, max_model_len=config.engine.max_model_len)
        started = processes.start_pdserve(path, config, args.out / "logs", REPO,
                                          name=f"pdserve-{variant.name}")
        with processes.running(started) as server:
            _warm_up(server.base_url, config.model.name)
            cpu_before = cpu.sample_processes()
            _, summary = _measure(server.base_url, config.model.name, spec, count_tokens,
                                  slo, not args.no_progress, variant.name,
                                  metrics_url=metrics_url_of(config))
            summary["cpu_s_by_role"] = cpu.cpu_by_role(cpu_before, cpu.sample_processes(),
                                                       server.process.pid)
            if args.quality_passages:
                positions[variant.name] = _quality_positions(server.base_url,
                                                             config.model.name, args)
        if positions:
            summary["quality"] = quality.compare(positions[variants[0].name],
                                                 positions[variant.name]).to_json()
        summaries[variant.name] = summary
        print(report.table(f"{variant.name} {variant.overrides}", summary["all"]))
        report.write_json(args.out / f"variant-{variant.name}-summary.json",
                          {**summary, "overrides": variant.overrides})
    print(_variants_table(summaries))
    report.write_json(args.out / "variants.json",
                      {"config": str(args.config), "machine": _machine(),
                       "variants": {v.name: v.overrides for v in variants},
                       "results": summaries})
    return 0


def _engine_cpu_per_million_tokens(summary: dict) -> float | None:
    """CPU-seconds both pools' engines used per million output tokens of the run."""
    used = summary["cpu_s_by_role"]
    engines = used.get("prefill engine", 0.0) + used.get("decode engine", 0.0)
    tokens = summary["all"]["output_tokens_per_s"] * summary["duration_s"]
    return engines / tokens * 1e6 if tokens else None


def _quality_positions(base_url: str, model: str, args) -> list[list[quality.Position]]:
    """Each held-out passage's prompt logprobs, read through the service (an echoed
    completion: the engine computes the prompt itself, pdserve's decode-local path)."""
    import httpx

    from cluster.tiny_training import held_out_prompts

    passages = []
    with httpx.Client(base_url=base_url, timeout=300) as client:
        for text in held_out_prompts(args.quality_passages, args.quality_chars):
            response = client.post("/v1/completions", json={
                "model": model, "prompt": text, "max_tokens": 1, "temperature": 0,
                "echo": True, "logprobs": args.quality_top, "return_tokens_as_token_ids": True})
            response.raise_for_status()
            body = response.json()
            passages.append(quality.positions_from_echo(body["choices"][0]["logprobs"],
                                                        body["usage"]["prompt_tokens"]))
    return passages


# The engines' work in a variants table: (label, engine_work key, divisor).
WORK_ROWS = (("KV MB pulled", "kv bytes pulled", 1e6),
             ("prefill computed", "prefill prompt tokens computed", 1),
             ("decode cached", "decode prompt tokens cached", 1),
             ("decode pulled", "decode prompt tokens transferred", 1),
             ("decode computed", "decode prompt tokens computed", 1))


def _variants_table(summaries: dict[str, dict]) -> str:
    """Short/long TTFT and ITL per variant, and each one's ratio to the first."""
    rows = [("short p50 TTFT", "short", "ttft_s", "p50"), ("short p95 TTFT", "short", "ttft_s",
            "p95"), ("long p50 TTFT", "long", "ttft_s", "p50"), ("p95 ITL", "all", "itl_s", "p95")]
    names = list(summaries)
    if all(summaries[n].get("later_turns", {}).get("completed") for n in names):
        rows += [("later-turn p50", "later_turns", "ttft_s", "p50"),
                 ("later-turn p95", "later_turns", "ttft_s", "p95")]
    base = summaries[names[0]]
    lines = [f"  {'':<16}" + "".join(f"{n:>22}" for n in names)]
    for label, kind, metric, q in rows:
        cells = []
        for name in names:
            value = summaries[name][kind][metric][q]
            r = ratio(value, base[kind][metric][q])
            cells.append("-" if value is None else
                         f"{value * 1000:.0f} ms" + ("" if r is None else f" ({r:.2f}x)"))
        lines.append(f"  {label:<16}" + "".join(f"{c:>22}" for c in cells))
    goodput = [f"{summaries[n]['all']['goodput_requests_per_s']:.3f}/s" for n in names]
    lines.append(f"  {'goodput':<16}" + "".join(f"{g:>22}" for g in goodput))
    if all("cpu_s_by_role" in summaries[n] for n in names):
        per_million = [_engine_cpu_per_million_tokens(summaries[n]) for n in names]
        lines.append(f"  {'engine CPU-s/1M':<16}" + "".join(
            f"{'-' if v is None else f'{v:,.0f}':>22}" for v in per_million))
    if all("engine_work" in summaries[n] for n in names):
        for label, key, scale in WORK_ROWS:
            cells = [summaries[n]["engine_work"].get(key, 0.0) / scale for n in names]
            lines.append(f"  {label:<16}" + "".join(f"{c:>22,.1f}" for c in cells))
    if all("quality" in summaries[n] for n in names):
        for label, key, form in (("perplexity", "perplexity_candidate", "{:.3f}"),
                                 ("top-1 agreement", "top1_agreement", "{:.2%}"),
                                 ("KL mean (nats)", "kl_mean", "{:.5f}"),
                                 ("KL p95 (nats)", "kl_p95", "{:.5f}")):
            cells = [form.format(summaries[n]["quality"][key]) for n in names]
            lines.append(f"  {label:<16}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


# ---- overhead --------------------------------------------------------------------------

def _overhead(args) -> int:
    """Short prompts one at a time: vLLM's server on the decode pool's cores, then pdserve
    on each path (tools/bench/overhead.py)."""
    import yaml

    from cluster.checkpoints import ensure_checkpoints
    from cluster.config import parse_config
    from tools import processes
    from tools.bench import overhead
    from tools.bench.variants import Variant, apply_overrides, parse_variant

    variants = [parse_variant(text) for text in args.variant or []] or [Variant("", {})]
    config = load_config(args.config)
    ensure_checkpoints(config)
    log_dir = args.out / "logs"
    spec = WorkloadSpec(name="reference", rate=1000, num_requests=args.requests, seed=7)
    requests = overhead.shorten(plan(spec, _token_counter(str(config.model.path))),
                                args.max_tokens)
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
            setup_file = _write_config(setup_document, args.out / f"overhead-{name}.yaml")
            setup_config = parse_config(setup_document, source=str(setup_file))
            setups[f"pdserve {name}"] = (
                lambda f=setup_file, c=setup_config: processes.start_pdserve(
                    f, c, log_dir, REPO))
    runs: dict[str, dict] = {}
    for setup, start in setups.items():
        with processes.running(start()) as server:
            _warm_up(server.base_url, config.model.name)
            metrics_url = metrics_url_of(config) if setup != "vllm" else None
            before = _settled_scrape(metrics_url)
            vllm_before = _vllm_phases(server.base_url) if setup == "vllm" else None
            runs[setup] = overhead.measure(server.base_url, config.model.name, requests,
                                           args.max_tokens, server.process.pid,
                                           concurrency=args.concurrency,
                                           idle_sample_s=args.idle_sample_s)
            if before is not None:  # where pdserve's part of the TTFT went
                print(f"{setup}: where the time to the first event went")
                runs[setup] |= _work_since(metrics_url, before, runs[setup]["n"])
                runs[setup]["ttft_by_owner_s"] = overhead.engine_share(runs[setup]["stages"])
            if vllm_before is not None:  # its one engine's phases, to set beside pdserve's
                runs[setup]["stages"] = _vllm_phases_since(server.base_url, vllm_before,
                                                           runs[setup]["n"])
            runs[setup]["prompt_prefill_mean_s"] = overhead.prompt_prefill_mean_s(
                runs[setup].get("stages"))
    print(overhead.latency_table(runs, baseline="vllm"))
    print(overhead.cpu_table(runs))
    for setup, run in runs.items():
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
    report.write_json(args.out / "overhead.json", {
        "config": str(args.config), "max_tokens": args.max_tokens,
        "concurrency": args.concurrency, "runs": runs,
        "machine": _machine()})
    return 0


# ---- transfer --------------------------------------------------------------------------

def _transfer(args) -> int:
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
                      {"rows": rows, "machine": _machine(), "seconds": time.time() - started})
    return 0
