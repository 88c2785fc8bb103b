"""``pdserve bench``'s command line (shell): run, compare, variants, overhead, transfer.

  pdserve bench run --base-url http://127.0.0.1:8000 --model tiny-llama --rate 2
  pdserve bench compare --config ray_configs/bench.yaml
  pdserve bench compare --trace traces/azure_llm_2023_conv.csv --max-requests 30
  pdserve bench overhead --config ray_configs/bench.yaml
  pdserve bench transfer

Only the parser: ``pdserve`` loads this module at every invocation (an entry point), so it
imports no more than the flags' defaults; ``main`` loads the commands
(tools/bench/commands.py) when one runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tools.bench.defaults import BENCH_CONFIG, IDLE_SAMPLE_S
from tools.bench.rate_match import (
    DEFAULT_MAX_PROBES,
    DEFAULT_START_RATE,
    DEFAULT_TOLERANCE,
    MIN_RATE,
)
from tools.bench.workload import WorkloadSpec


def add_parser(commands) -> None:
    """``pdserve bench`` and its commands' flags, under ``commands`` (subparsers)."""
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
    _trace_args(run)

    compare = sub.add_parser("compare", help="pdserve disaggregated vs one colocated vLLM "
                             "(--trace: each at the highest rate its SLO holds)")
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
    _trace_slice_args(compare)
    _search_args(compare)

    overhead = sub.add_parser("overhead", help="pdserve's added latency and relay CPU per token")
    overhead.add_argument("--config", type=Path, default=BENCH_CONFIG)
    overhead.add_argument("--requests", type=int, default=30)
    overhead.add_argument("--max-tokens", type=int, default=16,
                          help="tokens per answer (256: the per-token cost of streaming)")
    overhead.add_argument("--concurrency", type=int, default=1,
                          help="with --one-at-a-time: streams at a time (1: nothing queues "
                          "or batches; more: the relaying processes' CPU per token under "
                          "load)")
    overhead.add_argument("--rates", default="1,2,4,8",
                          help="the rate sweep (requests/s, Poisson arrivals): vLLM's server "
                          "and each pdserve setup up together, their runs alternating ABBA "
                          "at each rate; TTFT p50/p95, TPOT and per-chunk ITL p50, serving "
                          "CPU per 1,000 tokens (tools/bench/sweep.py)")
    overhead.add_argument("--one-at-a-time", action="store_true",
                          help="instead of the sweep: requests --concurrency at a time, "
                          "each server alone, with where each TTFT went")
    overhead.add_argument("--prompt-chars", type=int, default=256,
                          help="each prompt cut to this many characters (~4 a token)")
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
    _trace_args(variants)
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
    """The flags that describe a workload (run, compare, variants)."""
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
                        help="goodput's TTFT bound, s, and compare --trace's p95 TTFT bound "
                             "(default: the config's slo.ttft_p95_s)")
    parser.add_argument("--tpot-slo", type=float, default=None,
                        help="goodput's bound on time per output token, s (default: the "
                             "config's slo.tpot_s)")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--no-progress", action="store_true")


def _trace_args(parser: argparse.ArgumentParser) -> None:
    """The flags that replay a recorded trace instead of the synthetic workload (run,
    variants): the slice's, and how fast it is played."""
    _trace_slice_args(parser)
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--speedup", type=float, default=None,
                      help="play the trace this many times as fast (default: as recorded)")
    pace.add_argument("--trace-rate", type=float, default=None,
                      help="time-scale the slice to this mean rate, requests/s ((n-1)/span); "
                           "--rates instead sweeps several")


def _trace_slice_args(parser: argparse.ArgumentParser) -> None:
    """The flags that choose a trace's slice and fit it to the served context (run,
    compare)."""
    parser.add_argument("--trace", type=Path, default=None,
                        help="replay this request trace (Azure LLM CSV or Mooncake "
                             "JSONL; excerpts in tests/unit/data/traces/): its arrivals and "
                             "lengths, prompts as token ids of --tokenizer's (or --config's "
                             "model's) vocabulary sharing the trace's prefixes; the synthetic "
                             "workload's flags but --seed are then ignored "
                             "(tools/bench/trace.py)")
    parser.add_argument("--trace-format", choices=["auto", "azure", "mooncake"],
                        default="auto", help="the trace's format (auto: by its first line)")
    parser.add_argument("--start", type=float, default=0.0,
                        help="seconds into the trace where the slice starts")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of the trace to replay (default: to its end)")
    parser.add_argument("--max-requests", type=int, default=None,
                        help="at most this many requests, the slice's first")
    parser.add_argument("--too-long", choices=["clip", "skip"], default="clip",
                        help="requests longer than --max-model-len: clip (the prompt first, "
                             "keeping the output) or skip them")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="the served context, prompt + output tokens (default: the "
                             "--config's engine.max_model_len, else "
                             f"{WorkloadSpec.max_model_len})")


def _search_args(parser: argparse.ArgumentParser) -> None:
    """The flags of ``compare --trace``'s rate search (tools/bench/rate_match.py)."""
    parser.add_argument("--search-start-rate", type=float, default=DEFAULT_START_RATE,
                        help="with --trace: the first rate probed, requests/s (the slice "
                             "time-scaled to it); doubled while the SLO holds, halved while "
                             "it fails, then bisected")
    parser.add_argument("--search-max-probes", type=int, default=DEFAULT_MAX_PROBES,
                        help="with --trace: at most this many probes (runs of the slice) "
                             "per setup")
    parser.add_argument("--search-min-rate", type=float, default=MIN_RATE,
                        help="with --trace: halve no lower than this rate, requests/s (a "
                             "setup that fails here is reported as failing at every rate "
                             "probed; each halving doubles a probe's time)")
    parser.add_argument("--search-tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help="with --trace: stop once the lowest failed rate is within this "
                             "factor of the highest held one")
    parser.add_argument("--itl-slo", type=float, default=None,
                        help="with --trace: the search's p95 ITL bound, s (default: the "
                             "config's slo.itl_p95_s; --ttft-slo bounds the p95 TTFT)")


def main(args: argparse.Namespace) -> int:
    """Run the chosen ``pdserve bench`` command; its exit status."""
    from tools.bench import commands

    return {"run": commands.bench_run, "compare": commands.bench_compare,
            "overhead": commands.bench_overhead, "variants": commands.bench_variants,
            "transfer": commands.bench_transfer}[args.bench_command](args)
