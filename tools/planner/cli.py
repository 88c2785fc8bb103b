"""``pdserve plan``: size a cluster for a peak rate (shell: arguments, files, printing).

    pdserve plan --rate 5200 --out plans/reference

Simulates a slice of the fleet with pdserve's own routing policies (tools/planner/) and
prints the cheapest replica counts it finds that meet the SLOs, their cost and predicted
latencies, and writes them with a pdserve config of that cluster. docs/planning.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def add_parser(commands) -> None:
    plan = commands.add_parser("plan", help="size a cluster for a peak rate "
                               "(see docs/planning.md)")
    plan.add_argument("action", nargs="?", default="size",
                      choices=["size", "calibrate", "replay"],
                      help="size (default): plan a cluster; calibrate: time this "
                      "machine's engines of --config and fit their step cost (--out FILE); "
                      "replay: run recorded `pdserve bench run` traces (--trace; the "
                      "first --fit-runs fit the serving layer's cost) through the "
                      "simulator with --calibration, on --config's pools")
    plan.add_argument("--config", type=Path, default=REPO / "ray_configs/bench.yaml",
                      help="calibrate, replay: the served pdserve config")
    plan.add_argument("--calibration", type=Path, default=None,
                      help="replay: a `pdserve plan calibrate` file")
    plan.add_argument("--trace", type=Path, action="append", default=[],
                      help="replay: a `pdserve bench run` JSON file (repeatable)")
    plan.add_argument("--fit-runs", type=_positive, default=1,
                      help="replay: how many of the first --trace runs fit the serving "
                      "layer's cost (runs at two or more loads fit its growth with load; "
                      "one load, constants)")
    plan.add_argument("--held-out-trace", type=Path, action="append", default=[],
                      help="replay: a `pdserve bench run` JSON file of a run on "
                      "--held-out-config's cluster (repeatable): predicted after the "
                      "--trace runs, with the serving layer fitted on those")
    plan.add_argument("--held-out-config", type=Path, default=None,
                      help="replay: the served pdserve config of the --held-out-trace "
                      "runs: another cluster than --config (another threshold or replica "
                      "count), with the same engines")
    plan.add_argument("--prompt-lengths", default=None,
                      help="calibrate: prompt lengths swept (default 16,...,8192)")
    plan.add_argument("--decode-batches", default=None,
                      help="calibrate: decode batch sizes swept (default 1,...,64)")
    plan.add_argument("--transfer-ms", type=float, default=0.0,
                      help="replay: a KV transfer's time between the pools, when "
                      "--transfer-from is not given")
    plan.add_argument("--transfer-from", type=Path, default=None,
                      help="replay: a `pdserve bench transfer` JSON file: each prompt's "
                      "transfer then takes its KV bytes at the latency and bandwidth "
                      "measured over --transfer-transport")
    plan.add_argument("--transfer-transport", default="shm",
                      help="replay: the transport of --transfer-from's rows (shm: pools on "
                      "one host, as the served configs run; cma: the same with "
                      "kv_transfer.shared_memory off; tcp: between hosts)")
    plan.add_argument("--model", default="llama-3.1-70b",
                      help="llama-3.1-70b, or a checkpoint folder or config.json path")
    plan.add_argument("--accelerator", default="h100", help="h100, h200 or a100")
    plan.add_argument("--price", type=float, default=None,
                      help="dollars per accelerator-hour (default: the catalogue's)")
    plan.add_argument("--rate", type=float, default=5200.0, help="peak requests/s")
    plan.add_argument("--workload", default="reference", choices=["reference",
                                                                  "interference"])
    plan.add_argument("--shared-prefix-tokens", type=int, default=0,
                      help="every first prompt starts with one of --prefix-groups shared "
                      "heads (system prompts) this long, which the simulated engines' "
                      "prefix caches hold")
    plan.add_argument("--prefix-groups", type=int, default=1)
    plan.add_argument("--turns", type=int, default=1,
                      help="requests per conversation: each later turn carries the "
                      "history and arrives --think-s (mean) after the answer before it")
    plan.add_argument("--think-s", type=float, default=20.0)
    plan.add_argument("--answer-reuse", type=_answer_reuse, default=1.0,
                      help="size, replay: the share of an answer the next turn's prompt "
                      "repeats token for token (a history sent as text is tokenized again), "
                      "or the JSON file of tools/experiments/answer_reuse.py, whose measured "
                      "shares "
                      "each later turn draws one of")
    plan.add_argument("--ttft-p95", type=float, default=0.5, help="SLO, seconds")
    plan.add_argument("--itl-p95", type=float, default=0.05, help="SLO, seconds")
    plan.add_argument("--prefill-tp", type=_numbers, default=(4,),
                      help="tensor parallelism of a prefill replica; several (2,4,8): "
                      "each searched, the cheapest plan kept")
    plan.add_argument("--decode-tp", type=_numbers, default=(4,),
                      help="the same for a decode replica")
    plan.add_argument("--prefill-batched-tokens", type=int, default=2048)
    plan.add_argument("--decode-batched-tokens", type=int, default=1024)
    plan.add_argument("--decode-max-seqs", type=int, default=384)
    plan.add_argument("--threshold", type=_numbers, default=(256,),
                      help="router.disaggregation_threshold_tokens; several (0,256,1024): "
                      "each searched (with each TP), the cheapest plan kept")
    plan.add_argument("--fp8", action="store_true",
                      help="fp8 weights (W8A8) and KV cache on both pools")
    plan.add_argument("--prefix-hit", type=float, default=0.0,
                      help="share of prompt tokens in the engines' prefix caches")
    plan.add_argument("--response-cache-hit", type=float, default=0.0,
                      help="share of requests the router's response cache answers")
    plan.add_argument("--spec-tokens", type=int, default=0,
                      help="speculative decoding on the decode pool: draft tokens verified "
                      "a step (decode.speculative.num_speculative_tokens; 0: off)")
    plan.add_argument("--spec-accepted", type=_share, default=None,
                      help="with --spec-tokens: accepted over drafted tokens, as the decode "
                      "pool measures it (/admin/stats spec_accepted_tokens / "
                      "spec_draft_tokens)")
    plan.add_argument("--spec-drafting", type=_drafting_share, default=None,
                      help="with --spec-tokens: the share of a sequence's decode steps that "
                      "draft (prompt lookup drafts only on a match): spec_draft_tokens / "
                      "(K x (generation_tokens - spec_accepted_tokens)) of /admin/stats; "
                      "default 1, every step")
    plan.add_argument("--spec-counts", type=_numbers, default=None,
                      help="with --spec-tokens, instead of --spec-accepted and "
                      "--spec-drafting: the decode pool's counters DRAFTED,ACCEPTED,"
                      "GENERATED (/admin/stats spec_draft_tokens, spec_accepted_tokens, "
                      "generation_tokens)")
    plan.add_argument("--lever-table", action="store_true",
                      help="also plan with each lever alone (fp8, --table-prefix-hit, "
                      "--table-response-cache-hit, speculation at each of "
                      "--table-spec-accepted) and print what each saves")
    plan.add_argument("--table-prefix-hit", type=float, default=0.3)
    plan.add_argument("--table-response-cache-hit", type=float, default=0.15)
    plan.add_argument("--table-spec-tokens", type=_positive, default=4)
    plan.add_argument("--table-spec-accepted", type=_shares, default=(0.14, 0.5),
                      help="accepted over drafted tokens, each a row (0.14: prompt lookup "
                      "on the trained tiny model, docs/cost.md)")
    plan.add_argument("--table-spec-drafting", type=_drafting_share, default=1.0,
                      help="the share of steps that draft, in those rows")
    plan.add_argument("--mfu", type=float, default=0.5)
    plan.add_argument("--mbu", type=float, default=0.8)
    plan.add_argument("--step-overhead-ms", type=float, default=3.0)
    plan.add_argument("--allreduce-latency-us", type=float, default=8.0,
                      help="each tensor-parallel all-reduce's latency (two a layer a step)")
    plan.add_argument("--allreduce-efficiency", type=float, default=0.8,
                      help="of the peer links' bandwidth an all-reduce reaches (0: none, "
                      "as a roofline without all-reduces)")
    plan.add_argument("--peak-to-mean", type=float, default=6.0,
                      help="the day's peak rate over its mean (GPU-hours a day)")
    plan.add_argument("--no-admission", dest="admission", action="store_false",
                      help="admit every request at once, not through the base config's "
                      "router replicas and their admission budgets")
    plan.add_argument("--router-views", choices=["shared", "each"], default="each",
                      help="each (default): every router replica routes on its own view "
                      "(the replicas' reports and only its own sends since), as pdserve's "
                      "routers do (docs/planning.md, 'Many routers'); shared: one view "
                      "for all, as if each saw the others' sends, the bound one "
                      "dispatcher would reach")
    plan.add_argument("--max-tokens", type=_positive, default=None,
                      help="the max_tokens each request asks for, which admission "
                      "reserves (default: the base config's router.default_max_tokens)")
    plan.add_argument("--no-day", dest="day", action="store_false",
                      help="skip the day under the written config's autoscalers")
    plan.add_argument("--peak-at", type=_time_of_day, default="20:00",
                      help="the day's peak, local time (HH:MM) in the time zone of the "
                      "base config's standby windows (UTC without)")
    plan.add_argument("--downscale-step", type=_positive, default=None,
                      help="the written config's max_downscale_step for both pools "
                      "(default: what the planned size needs to follow the day down)")
    plan.add_argument("--startup-s", type=float, default=300.0,
                      help="seconds from asking for a replica to its serving (the day)")
    plan.add_argument("--standby", choices=("fitted", "base"), default="fitted",
                      help="the written floors: fitted to the day's forecast, half-hour "
                      "windows a start-up ahead of the rate, night floor at the trough "
                      "(fitted); or the base config's windows holding the planned size "
                      "and its night floor in proportion (base)")
    plan.add_argument("--standby-margin", type=_margin, default=0.1,
                      help="fitted floors: the share above the forecast rate they hold")
    plan.add_argument("--scaling-headroom", type=_margin, default=0.1,
                      help="the written throughput targets ask for the load's replicas "
                      "times 1 + this (0: exactly the planned size at the peak)")
    plan.add_argument("--standby-shift-minutes", type=_shift_minutes, default=0,
                      help="fitted floors: how early or late the day's peak may come "
                      "(0 to 720; 0: the policy follows a peak that comes early or late)")
    plan.add_argument("--slice-replicas", type=int, default=32,
                      help="replicas of the smaller pool simulated")
    plan.add_argument("--sim-seconds", type=_sim_seconds, default=40.0,
                      help="simulated seconds of traffic per configuration tried, past "
                      "a warm-up of 10 that is not read")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--base-config", type=Path, default=REPO / "ray_configs/prod-70b.yaml")
    plan.add_argument("--out", type=Path, default=None,
                      help="size: a folder for plan.json and pdserve.yaml (the planned "
                      "cluster); calibrate: the calibration file (default "
                      "bench-results/calibration.json); replay: a folder for replay.json")


def load_model_config(name: str) -> dict:
    from tools.planner.model import LLAMA_3_1_70B

    if name == "llama-3.1-70b":
        return LLAMA_3_1_70B
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise SystemExit(f"pdserve plan: no model {name!r} (llama-3.1-70b, or a "
                         "checkpoint folder or config.json)")
    return json.loads(path.read_text())


def _positive(text: str) -> int:
    """An integer of 1 or more (argparse refuses anything else with this message)."""
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"wants 1 or more, not {number}")
    return number


def _margin(text: str) -> float:
    """A share of 0 or more, finite (argparse refuses anything else with this message)."""
    share = float(text)
    if not 0 <= share < math.inf:
        raise argparse.ArgumentTypeError(f"wants a share of 0 or more, not {text}")
    return share


def _sim_seconds(text: str) -> float:
    """Seconds longer than the warm-up the simulation discards (argparse refuses others
    with this message: with none left, no request would be measured)."""
    from tools.planner.search import WARMUP_S

    seconds = float(text)
    if not WARMUP_S < seconds < math.inf:
        raise argparse.ArgumentTypeError(
            f"wants more than the {WARMUP_S:g} s warm-up that is not read, not {text}")
    return seconds


def _time_of_day(text: str):
    """``HH:MM`` as a ``datetime.time`` (argparse refuses anything else with this message)."""
    from cluster.autoscaling.config import parse_hh_mm

    try:
        return parse_hh_mm(text.strip().zfill(5))        # "8:00" is 08:00
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants HH:MM (00:00..23:59), not {text!r}") from None


def _shift_minutes(text: str) -> int:
    """Minutes from 0 to 720 (half a day either way)."""
    minutes = int(text)
    if not 0 <= minutes <= 720:
        raise argparse.ArgumentTypeError(f"wants 0 to 720 minutes, not {minutes}")
    return minutes


def _share(text: str) -> float:
    """A share in [0, 1) (argparse refuses anything else with this message)."""
    share = float(text)
    if not 0 <= share < 1:
        raise argparse.ArgumentTypeError(f"wants a share in [0, 1), not {text}")
    return share


def _drafting_share(text: str) -> float:
    """A share in (0, 1] (argparse refuses anything else with this message)."""
    share = float(text)
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"wants a share in (0, 1], not {text}")
    return share


def _shares(text: str) -> tuple[float, ...]:
    """``"0.14,0.5"`` as shares in [0, 1)."""
    return tuple(_share(part) for part in text.split(","))


def _numbers(text: str) -> tuple[int, ...]:
    """``"0,256,1024"`` as integers."""
    return tuple(int(part) for part in text.split(","))


def _answer_reuse(text: str):
    """A share, or the measured shares of an answer_reuse.py file."""
    try:
        return float(text)
    except ValueError:
        return tuple(json.loads(Path(text).read_text())["shares"])


def inputs_from(args):
    from tools.bench.workload import WorkloadSpec
    from tools.planner.cost_model import Roofline, Transfer
    from tools.planner.des import EngineLimits
    from tools.planner.hardware import CATALOG
    from tools.planner.model import ModelShape
    from tools.planner.search import PlanInputs, Slo

    if args.accelerator not in CATALOG:
        raise SystemExit(f"pdserve plan: unknown accelerator {args.accelerator!r} "
                         f"({', '.join(CATALOG)})")
    accelerator = CATALOG[args.accelerator].priced(args.price)
    model = ModelShape.from_hf_config(load_model_config(args.model))
    dtype = "fp8" if args.fp8 else "bf16"

    def cost(tp: int) -> Roofline:
        return Roofline(model, accelerator, tp=tp, compute_dtype=dtype, kv_dtype=dtype,
                        mfu=args.mfu, mbu=args.mbu,
                        step_overhead_s=args.step_overhead_ms / 1000,
                        allreduce_latency_s=args.allreduce_latency_us / 1e6,
                        allreduce_efficiency=args.allreduce_efficiency)

    base = _base_config(args)       # its router tier and pools' max_ongoing_requests
    routers, routers_per_decode = _router_tier(args, base)
    return PlanInputs(
        prefill_cost=cost(args.prefill_tp[0]), decode_cost=cost(args.decode_tp[0]),
        prefill=EngineLimits(args.prefill_batched_tokens, 256,
                             max_ongoing=base.prefill.max_ongoing_requests),
        decode=EngineLimits(args.decode_batched_tokens, args.decode_max_seqs,
                            max_ongoing=base.decode.max_ongoing_requests),
        transfer=Transfer(args.prefill_tp[0] * accelerator.link_bandwidth),
        workload=WorkloadSpec(name=args.workload, rate=args.rate, seed=args.seed,
                              max_model_len=10240,
                              shared_prefix_tokens=args.shared_prefix_tokens,
                              prefix_groups=args.prefix_groups, turns=args.turns,
                              think_s=args.think_s),
        slo=Slo(args.ttft_p95, args.itl_p95), threshold_tokens=args.threshold[0],
        sim_seconds=args.sim_seconds, slice_replicas=args.slice_replicas,
        prefix_hit=args.prefix_hit, response_cache_hit=args.response_cache_hit,
        answer_reuse=args.answer_reuse, routers=routers,
        routers_per_decode=routers_per_decode,
        shared_router_view=args.router_views == "shared", speculation=_speculation(args))


def _speculation(args):
    """The decode pool's speculation of ``--spec-tokens`` and ``--spec-accepted`` (None
    without them)."""
    from tools.planner.speculation import from_accepted_share, from_counts

    if args.spec_tokens < 0:
        raise ValueError(f"--spec-tokens wants 0 (off) or more, not {args.spec_tokens}")
    given = [name for name, value in (("--spec-accepted", args.spec_accepted),
                                      ("--spec-drafting", args.spec_drafting),
                                      ("--spec-counts", args.spec_counts)) if value is not None]
    if not args.spec_tokens:
        if given:
            raise ValueError(f"{' and '.join(given)} "
                             f"{'needs' if len(given) == 1 else 'need'} --spec-tokens")
        return None
    if args.spec_counts is not None:
        if len(given) > 1 or len(args.spec_counts) != 3:
            raise ValueError("--spec-counts wants DRAFTED,ACCEPTED,GENERATED, alone")
        return from_counts(args.spec_tokens, *args.spec_counts)
    if args.spec_accepted is None:
        raise ValueError("--spec-tokens needs --spec-accepted: the decode pool's accepted "
                         "over drafted tokens, measured (/admin/stats) or assumed")
    return from_accepted_share(args.spec_tokens, args.spec_accepted,
                               1.0 if args.spec_drafting is None else args.spec_drafting)


def _base_config(args):
    """The parsed ``--base-config``."""
    import yaml

    from cluster.config import parse_config

    return parse_config(yaml.safe_load(args.base_config.read_text()),
                        source=str(args.base_config))


def _router_tier(args, base):
    """The ``base`` config's router replicas (as many per decode replica as it has) and
    one replica's admission, each request asking for ``--max-tokens`` (default: the
    base's ``default_max_tokens``, a client that sets none). ``--no-admission``: (None,
    0)."""
    from router.admission import AdmissionPolicy
    from tools.planner.des import RouterTier

    if not args.admission:
        return None, 0.0
    router = base.router
    tier = RouterTier(replicas=router.replicas,
                      admission=AdmissionPolicy.from_config(router.admission),
                      max_tokens=args.max_tokens or router.default_max_tokens,
                      long_prompt_tokens=router.admission.long_prompt_tokens)
    return tier, router.replicas / base.decode.replicas


def main(args) -> int:
    if args.action == "calibrate":
        return _calibrate(args)
    if args.action == "replay":
        return _replay(args)
    return _size(args)


def _calibrate(args) -> int:
    from tools.planner.calibrate import DECODE_BATCHES, PROMPT_LENGTHS, calibrate

    def numbers(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
        return default if text is None else tuple(int(n) for n in text.split(","))

    out = args.out or Path("bench-results/calibration.json")
    result = calibrate(args.config, out, numbers(args.prompt_lengths, PROMPT_LENGTHS),
                       numbers(args.decode_batches, DECODE_BATCHES))
    for role in ("prefill", "decode"):
        fitted = result[role]
        cost = ", ".join(f"{k} {v * 1e6:.3g} us" for k, v in fitted["cost"].items())
        print(f"{role}: {cost}; {fitted['samples']} steps, error median "
              f"{fitted['median_abs_error']:.1%}, p95 {fitted['p95_abs_error']:.1%}")
    print(f"wrote {out}")
    return 0


def _measured_transfer(args, config) -> tuple:
    """(Transfer, KV bytes per token of the served model) from --transfer-from, or
    (None, 0) without it."""
    if args.transfer_from is None:
        return None, 0
    from cluster.engine.cpu_support import kv_bytes_per_token, kv_element_bytes
    from tools.planner.cost_model import measured_transfer

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


def _replay(args) -> int:
    from cluster.config import load_config
    from tools.planner.replay import fit_serving, measured, simulate, trace_requests

    if args.calibration is None or not args.trace:
        print("pdserve plan replay: needs --calibration and at least one --trace",
              file=sys.stderr)
        return 2
    if args.fit_runs > len(args.trace):
        print(f"pdserve plan replay: --fit-runs {args.fit_runs} is more than the "
              f"{len(args.trace)} --trace runs", file=sys.stderr)
        return 2
    if bool(args.held_out_trace) != (args.held_out_config is not None):
        print("pdserve plan replay: --held-out-trace and --held-out-config go together",
              file=sys.stderr)
        return 2
    calibration = json.loads(args.calibration.read_text())
    configs = [args.config] * len(args.trace) + [args.held_out_config] * len(
        args.held_out_trace)
    served_by_config = {path: _served(args, load_config(path), calibration)
                        for path in set(configs)}
    paths = [*args.trace, *args.held_out_trace]
    runs = [json.loads(path.read_text()) for path in paths]
    traces = [run["records"] for run in runs]
    shared = [run.get("workload", {}).get("shared_prefix_tokens", 0) for run in runs]
    cost = fit_serving(served_by_config[args.config],
                       list(zip(traces, shared, strict=True))[:args.fit_runs],
                       args.answer_reuse)
    _print_serving_cost(cost, args.trace[:args.fit_runs])
    print("| trace | | TTFT p50 | TTFT p95 | decode p50 | E2E p50 | tokens/s |\n"
          "|---|---|---|---|---|---|---|")
    rows, works = [], []
    for index, (path, config, records, run, head) in enumerate(zip(
            paths, configs, traces, runs, shared, strict=True)):
        name = f"{path.parent.name}/{path.name}"
        truth = measured(records)
        seen = simulate(served_by_config[config],
                        trace_requests(records, head, args.answer_reuse), cost)
        works.append((name, run.get("engine_work"), seen.prompt_tokens))
        for label, values in (("measured", truth), ("simulated", seen)):
            print(f"| {name} | {label} | " + " | ".join(
                f"{getattr(values, k) * 1000:.0f} ms" for k in
                ("ttft_p50", "ttft_p95", "decode_p50", "e2e_p50"))
                + f" | {values.streamed_per_s:.0f} |")
        errors = {k: getattr(seen, k) / getattr(truth, k) - 1 for k in
                  ("ttft_p50", "ttft_p95", "decode_p50", "e2e_p50")}
        print(f"| {name} | error | " + " | ".join(f"{e:+.0%}" for e in errors.values())
              + " | |")
        rows.append({"trace": str(path), "fitted_on": index < args.fit_runs,
                     "config": str(config),
                     "measured": truth.__dict__, "simulated": seen.__dict__,
                     "error": errors, "engine_work": run.get("engine_work")})
    _print_prompt_tokens(works)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "replay.json").write_text(json.dumps(
            {"serving_cost": cost.__dict__, "runs": rows}, indent=2))
        from tools.planner.plots import replay_plot

        replay_plot(args.out / "replay.png", rows)
        print(f"wrote {args.out / 'replay.json'} and {args.out / 'replay.png'}")
    return 0


def _served(args, config, calibration):
    """The replay's view of the cluster ``config`` served, with ``calibration``'s engines."""
    from tools.planner.replay import Served

    return Served(config.prefill.replicas, config.decode.replicas,
                  config.router.disaggregation_threshold_tokens, calibration["prefill"],
                  calibration["decode"], args.transfer_ms / 1000,
                  *_measured_transfer(args, config), block_size=config.engine.block_size,
                  routing={"prefill": config.router.routing.prefill,
                           "decode": config.router.routing.decode})


def _print_serving_cost(cost, fitted_on) -> None:
    names = ", ".join(f"{path.parent.name}/{path.name}" for path in fitted_on)
    print(f"serving layer fitted on {names}: each TTFT + ({cost.ttft_s * 1000:.1f} ms + "
          f"{cost.ttft_per_prompt_token_s * 1e6:.1f} us a prompt token) / (1 - "
          f"{cost.ttft_load_s * 1e6:.0f} us x streamed tokens/s); decode steps "
          f"x{cost.decode_slowdown:.2f} / (1 - {cost.decode_load_s * 1e6:.0f} us x "
          "streamed tokens/s)")


def _print_prompt_tokens(works) -> None:
    """Each trace's prompt tokens per pool and source: the engines' counters (what the
    run's `engine_work` recorded) beside the simulation's."""
    from tools.bench.engine_work import PROMPT_SOURCES

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


def _search_configurations(args, inputs):
    """The plan of ``inputs``, or, when several thresholds or TPs are given, the cheapest
    of each combination's plans and every combination's (else an empty dict)."""
    from tools.planner.output import configuration_table
    from tools.planner.search import cheapest, configurations, search

    if len(args.threshold) * len(args.prefill_tp) * len(args.decode_tp) == 1:
        return search(inputs), {}
    searched = {name: option if isinstance(option, str) else _plan_or_reason(option)
                for name, option in configurations(inputs, args.threshold, args.prefill_tp,
                                                   args.decode_tp).items()}
    chosen = cheapest(searched)
    print(configuration_table(searched, chosen, args.peak_to_mean) + "\n")
    return searched[chosen], searched


def _size(args) -> int:
    import yaml

    from tools.planner.output import day_figures, day_table, figures, lever_table, table
    from tools.planner.search import lever_variants
    from tools.planner.speculation import from_accepted_share

    started = time.monotonic()
    try:
        inputs = inputs_from(args)
        plan, searched = _search_configurations(args, inputs)
        inputs = plan.inputs
        levers = {}
        if args.lever_table:
            variants = lever_variants(inputs, args.table_prefix_hit,
                                      args.table_response_cache_hit, [
                                          from_accepted_share(args.table_spec_tokens, share,
                                                              args.table_spec_drafting)
                                          for share in args.table_spec_accepted])
            levers = {name: plan if variant == inputs else _plan_or_reason(variant)
                      for name, variant in variants.items()}
        document, days = _document_and_day(args, plan)
    except (ValueError, RuntimeError) as error:
        print(f"pdserve plan: {error}", file=sys.stderr)
        return 2
    answer = figures(plan, args.peak_to_mean)
    if days:
        answer["day"] = {name: day_figures(day) for name, day in days.items()}
    answer["search_s"] = time.monotonic() - started
    if searched:
        answer["configurations"] = {
            name: figures(option, args.peak_to_mean) if not isinstance(option, str)
            else {"none": option} for name, option in searched.items()}
    print(table(answer))
    if days:
        print("\n" + day_table(answer["day"]))
    if levers:
        print("\n" + lever_table(levers))
        answer["levers"] = {name: figures(lever, args.peak_to_mean)
                            if not isinstance(lever, str) else {"none": lever}
                            for name, lever in levers.items()}
    print(f"\n{answer['candidates_simulated']} clusters simulated for the plan; "
          f"{answer['search_s']:.0f} s in all")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.json").write_text(json.dumps(answer, indent=2))
        (args.out / "pdserve.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
        from tools.planner.plots import day_plot, plan_plot

        plan_plot(args.out / "plan.png", plan, args.peak_to_mean)
        written = [args.out / name for name in ("plan.json", "pdserve.yaml", "plan.png")]
        if days:
            day_plot(args.out / "day.png", days)
            written.append(args.out / "day.png")
        print("wrote " + ", ".join(map(str, written)))
    return 0


def _plan_or_reason(inputs):
    """The plan of ``inputs`` (a configuration or a lever), or why there is none: no
    cluster met the SLOs within the search's steps (verifying drafts, say, can slow every
    decode step past the ITL SLO)."""
    from tools.planner.search import search

    try:
        return search(inputs)
    except RuntimeError as error:
        return str(error).split(";")[0]


def _document_and_day(args, plan):
    """The planned cluster's config (loadable, or this fails; its autoscaling targets,
    step limits and floors fitted to the plan) and, unless ``--no-day``, its days under
    that config's autoscalers (None when it has none).

    With fitted floors (``--standby fitted``): the forecast day as written, the same plan
    under the base's floors instead, the policy alone (no windows, floors of one), then
    the written config on a day 10% busier than forecast and on one peaking an hour
    early (what the policy must cover above the floors).
    With the base's (``--standby base``): as written, without its standby windows, and
    without its night floors either."""
    from cluster.config import parse_config
    from tools.planner.output import config_document

    scaling = scaling_inputs(args, plan)
    if scaling.forecast is None:
        return config_document(plan, scaling.base, scaling.targets), None
    fitted = None
    if args.standby == "fitted":
        fitted = scaling.fitted_floors(plan, margin=args.standby_margin,
                                       shift_minutes=args.standby_shift_minutes)
    document = config_document(plan, scaling.base, scaling.targets, fitted)
    config = parse_config(document, source="the planned cluster")
    if not args.day or not config.autoscaling.enabled:
        return document, None
    based = (parse_config(config_document(plan, scaling.base, scaling.targets),
                          source="the base's floors") if fitted else None)
    return document, _days(day_runner(plan, scaling.sensors, scaling.forecast),
                           scaling.forecast, config, based)


@dataclass(frozen=True)
class ScalingInputs:
    """What a plan's written autoscaling is fitted from: the base config (as written and
    parsed), the loads the planned replicas would report (``day.sense``: at each sensed
    multiple of the peak with the day, at the peak alone without it; None when the base
    has no autoscaling), each pool's throughput targets and downscale step, the forecast
    day (None without autoscaling) and the peak's local time of day."""

    base: dict
    parsed: Any
    sensors: Any
    targets: dict
    forecast: Any
    peak_at: dt.time

    def fitted_floors(self, plan, margin: float, shift_minutes: int,
                      slot_minutes: int = 30) -> dict:
        """Each pool's standby floors fitted to the forecast day (``day.fit_standby``),
        both in the zone the peak's time is read in."""
        from tools.planner.day import fit_standby

        zone = _peak_zone(self.parsed.autoscaling).key
        peak_minute = self.peak_at.hour * 60 + self.peak_at.minute
        return {pool: fit_standby(replicas, peak_minute, self.forecast, slot_minutes,
                                  margin, shift_minutes, zone)
                for pool, replicas in plan.prediction.replicas.items()}


def plan_for_study(argv: list[str]):
    """``pdserve plan``'s arguments parsed from ``argv``, the plan it searches and its
    ``ScalingInputs``: for scripts that study a plan's day (tools/experiments/standby_fits.py,
    tools/experiments/max_replicas_cap.py)."""
    from tools.planner.search import search

    commands = argparse.ArgumentParser().add_subparsers(dest="command")
    add_parser(commands)
    args = commands.choices["plan"].parse_args(argv)
    plan = search(inputs_from(args))
    return args, plan, scaling_inputs(args, plan)


def scaling_inputs(args, plan) -> ScalingInputs:
    """``ScalingInputs`` of ``plan`` under ``pdserve plan``'s parsed ``args``
    (``--base-config``, ``--day``, ``--scaling-headroom``, ``--downscale-step``,
    ``--peak-at``, ``--peak-to-mean``, ``--startup-s``)."""
    import yaml

    from cluster.config import parse_config
    from tools.planner.day import DaySpec, autoscaling_targets, sense

    base = yaml.safe_load(args.base_config.read_text())
    parsed = parse_config(base, source=str(args.base_config))
    # The written targets need the planned load only; the day needs the loads around it
    sensors = None
    if parsed.autoscaling is not None:
        sensors = sense(plan) if args.day else sense(plan, multiples=(1.0,))
    targets = autoscaling_targets(plan, sensors, args.scaling_headroom) if sensors else {}
    _add_downscale_steps(args, plan, parsed, targets)
    forecast = None
    if parsed.autoscaling is not None:
        forecast = DaySpec(
            peak_at_s=_peak_epoch(args.peak_at, parsed.autoscaling),
            peak_to_mean=args.peak_to_mean, startup_s=args.startup_s,
            drain_s=next(p for p in sensors.points if p.multiple >= 1.0).e2e_p99_s)
    return ScalingInputs(base, parsed, sensors, targets, forecast, args.peak_at)


def _days(day_under, forecast, config, based=None) -> dict:
    """The days ``_document_and_day`` runs, by name: with fitted floors (``based``, the
    same plan under the base's floors, given), the forecast day, a busier one, one
    peaking early, the base's floors and the policy alone; with the base's, as written,
    without its windows, and without its night floors either."""
    from tools.planner.day import POOLS

    if based is not None:
        return {"as written": day_under(config),
                "the base's floors": day_under(based),
                "the policy alone": day_under(config, without_floors=True),
                "a day 10% busier": day_under(config, rate_scale=1.1),
                "its peak an hour early": day_under(
                    config, peak_at_s=forecast.peak_at_s - 3600)}
    days = {"as written": day_under(config)}
    if config.autoscaling.prefill.standby or config.autoscaling.decode.standby:
        days["without its standby windows"] = day_under(
            config.model_copy(update={"autoscaling": _without_windows(config.autoscaling)}))
    if any(config.scaling_bounds(next(iter(config.versions)), pool).min_replicas > 1
           for pool in POOLS):
        days["nor its night floors"] = day_under(config, without_floors=True)
    return days


def day_runner(plan, sensors, forecast):
    """``run(config, without_floors=False, **spec_changes)``: a day under ``config``'s
    autoscalers (without its standby windows and with night floors of one replica if
    asked), the forecast day changed by ``spec_changes``."""
    from dataclasses import replace

    from tools.planner.day import POOLS, simulate_day

    def run(config, without_floors: bool = False, **spec_changes):
        version = next(iter(config.versions))
        bounds = {pool: config.scaling_bounds(version, pool) for pool in POOLS}
        autoscaling = config.autoscaling
        if without_floors:
            bounds = {pool: bound.overridden(min_replicas=1) for pool, bound in bounds.items()}
            autoscaling = _without_windows(autoscaling)
        return simulate_day(
            replace(forecast, **spec_changes), sensors,
            tuple(plan.prediction.replicas[pool] for pool in POOLS),
            (plan.inputs.prefill_cost.tp, plan.inputs.decode_cost.tp), autoscaling,
            config.slo, bounds)
    return run


def _without_windows(autoscaling):
    """``autoscaling`` without either pool's standby windows."""
    from tools.planner.day import POOLS

    return autoscaling.model_copy(update={
        pool: getattr(autoscaling, pool).model_copy(update={"standby": None})
        for pool in POOLS})


def _add_downscale_steps(args, plan, base, targets: dict) -> None:
    """Each pool's ``max_downscale_step``: ``--downscale-step``, else the base config's or
    the step the planned size needs to follow the day down, whichever is larger."""
    from tools.planner.day import fitting_downscale_step

    if base.autoscaling is None:
        return
    for pool, replicas in plan.prediction.replicas.items():
        scaling = getattr(base.autoscaling, pool)
        step = args.downscale_step or max(scaling.max_downscale_step, fitting_downscale_step(
            replicas, scaling.downscale_cooldown_s, args.peak_to_mean))
        targets.setdefault(pool, {})["max_downscale_step"] = step


def _peak_epoch(peak_at: dt.time, autoscaling) -> float:
    """Epoch seconds of ``peak_at`` on a fixed Wednesday, local to the standby schedule's
    zone (UTC without one)."""
    return dt.datetime.combine(dt.date(2026, 1, 7), peak_at,
                               tzinfo=_peak_zone(autoscaling)).timestamp()


def _peak_zone(autoscaling):
    """The zone ``--peak-at`` is local to: the base's standby schedule's (decode's, else
    prefill's), UTC without one."""
    from zoneinfo import ZoneInfo

    schedule = autoscaling.decode.standby or autoscaling.prefill.standby
    return schedule.zone if schedule else ZoneInfo("UTC")
