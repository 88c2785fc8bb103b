"""The planner against the real cluster on this machine (docs/planning.md, validation 5):

    .venv/bin/python tools/experiments/plan_validation.py --out bench-results/plan-validation

1. ``pdserve plan calibrate``: each pool's engine of ``--config`` timed through a sweep;
2. the cluster of ``--config`` served, one unrecorded warm-up run of the first rate (the
   first requests after a start are slower), then ``pdserve bench run`` at each of
   ``--rates``, ``--repeats`` times with the same seed (the same trace: what differs
   between them is the measurement's own noise), each run's prompts salted apart so
   that none finds another's in the prefix caches;
3. ``pdserve plan replay``: the runs at ``--fit-rates`` (the first rates of ``--rates``;
   default the first) fit the serving layer's cost, which grows with the tokens streamed
   per second when they are two loads or more (tools/planner/serving_cost.py); every
   run is then replayed, and the others are predicted.

``--held-out-set`` serves a second cluster after the first (another threshold, say; the
same engines, so the same calibration) and runs ``--held-out-rates`` on it; its runs are
predicted with the serving layer fitted on the first cluster's:

    .venv/bin/python tools/experiments/plan_validation.py --rates 1,1.5,2 --fit-rates 1,1.5 \
        --held-out-set router.disaggregation_threshold_tokens=256 --held-out-rates 1.5,2

``--trace`` also records a public trace's slice on the first cluster (``bench run
--trace``, time-scaled to each of ``--trace-rates``), after the synthetic runs; its runs
are predicted with the serving layer fitted on those (docs/planning.md, "On a real trace"):

    .venv/bin/python tools/experiments/plan_validation.py --rates 1,1.5 --fit-rates 1,1.5 \
        --repeats 2 --num-requests 60 --trace $TRACES/azure_llm_2023_conv.csv \
        --trace-rates 1,1.5 --trace-args "--max-requests 60"

``--set`` changes the served config (``bench variants``' syntax: ``a.b=1,c=2``) and
``--workload-args`` adds ``pdserve bench run`` workload flags: conversations and shared
heads, whose prefix-cache work the replay predicts beside the engines' counters (with
conversations, ``tools/experiments/answer_reuse.py`` measures how much of an answer the next turn
repeats, and the replay takes it):

    .venv/bin/python tools/experiments/plan_validation.py --rates 1,2 --repeats 2 \
        --set decode.replicas=2,ray.num_cpus=3,router.disaggregation_threshold_tokens=256 \
        --workload-args "--turns 3 --think-s 1 --shared-prefix-tokens 512 --prefix-groups 4"
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from cluster.checkpoints import ensure_checkpoints
from cluster.config import load_config
from tools import processes
from tools.bench.defaults import REPO
from tools.bench.variants import apply_overrides, parse_variant


def pdserve(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "cluster.cli", *args], check=True, cwd=REPO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "ray_configs/bench.yaml")
    parser.add_argument("--rates", default="1,2,4")
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fit-rates", default=None,
                        help="the first of --rates whose runs fit the serving layer's "
                        "cost (default: the first rate)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results/plan-validation")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="a calibration file to use (default: calibrate now)")
    parser.add_argument("--set", default="", help="overrides of --config, a.b=1,c=2")
    parser.add_argument("--workload-args", default="",
                        help="more `pdserve bench run` workload flags, quoted")
    parser.add_argument("--held-out-set", default="",
                        help="overrides of the served config for a second cluster, whose "
                        "runs are all held out, a.b=1,c=2")
    parser.add_argument("--held-out-rates", default=None,
                        help="the second cluster's rates (default --rates)")
    parser.add_argument("--trace", type=Path, default=None,
                        help="also record this request trace's slice (`bench run --trace`) "
                        "at each of --trace-rates, --repeats times, on the first cluster; "
                        "its runs are all predicted")
    parser.add_argument("--trace-rates", default="1",
                        help="the trace slice's mean rates, requests/s (time-scaled)")
    parser.add_argument("--trace-args", default="--max-requests 60",
                        help="more `pdserve bench run --trace` flags (the slice), quoted")
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    fit_rates = ([float(rate) for rate in args.fit_rates.split(",")] if args.fit_rates
                 else rates[:1])
    if rates[:len(fit_rates)] != fit_rates:
        parser.error("--fit-rates must be the first rates of --rates")
    args.out.mkdir(parents=True, exist_ok=True)
    args.config = served_config(args.config, args.set, args.out / "config.yaml")
    config = load_config(args.config)
    ensure_checkpoints(config)
    calibration = args.calibration or args.out / "calibration.json"
    if args.calibration is None:
        pdserve("plan", "calibrate", "--config", str(args.config), "--out", str(calibration))
    reuse = serve_and_run(args, args.config, args.rates, "")
    traces = recorded(args, args.rates, "")
    trace_runs = ([] if args.trace is None
                  else recorded(args, args.trace_rates, "trace-", args.trace.stem))
    held_out = []
    if args.held_out_set:
        held_out_config = served_config(args.config, args.held_out_set,
                                        args.out / "held-out-config.yaml")
        held_out_rates = args.held_out_rates or args.rates
        serve_and_run(args, held_out_config, held_out_rates, "held-out-")
        held_out = ["--held-out-config", str(held_out_config), *[
            part for trace in recorded(args, held_out_rates, "held-out-")
            for part in ("--held-out-trace", str(trace))]]
    pdserve("plan", "replay", "--config", str(args.config), "--calibration",
            str(calibration), "--out", str(args.out), *reuse, *held_out,
            "--fit-runs", str(len(fit_rates) * args.repeats),
            *[part for trace in traces + trace_runs for part in ("--trace", str(trace))])


def recorded(args, rates: str, prefix: str, workload: str = "reference") -> list[Path]:
    """The runs of ``workload`` (``bench run`` names them after it: the synthetic
    workload's name, a trace file's stem) that ``serve_and_run`` recorded at ``rates``
    into ``{prefix}repeat{N}/``: by rate, then repeat."""
    return [args.out / f"{prefix}repeat{repeat}" / f"run-{workload}-{float(rate)}.json"
            for rate in rates.split(",") for repeat in range(1, args.repeats + 1)]


def served_config(config: Path, overrides: str, out: Path) -> Path:
    """``config`` with ``overrides`` (a.b=1,c=2) applied, written to ``out``; ``config``
    itself without any."""
    if not overrides:
        return config
    document = apply_overrides(yaml.safe_load(config.read_text()),
                               parse_variant(f"served:{overrides}").overrides)
    out.write_text(yaml.safe_dump(document, sort_keys=False))
    return out


def serve_and_run(args, config_path: Path, rates: str, prefix: str) -> list[str]:
    """Serve ``config_path``, warm it up, and record ``pdserve bench run`` at ``rates``,
    ``--repeats`` times, into ``{prefix}repeat{N}/``; the replay's ``--answer-reuse``
    flags (measured here when the workload has turns)."""
    config = load_config(config_path)
    base_url = f"http://{config.router.host}:{config.router.port}"
    server = processes.start_pdserve(config_path, config, args.out / f"{prefix}logs", REPO)
    bench_run = ("bench", "run", "--config", str(config_path), "--base-url", base_url,
                 "--model", config.model.name, "--workload", "reference",
                 "--num-requests", str(args.num_requests), "--seed", "0",
                 "--tokenizer", str(config.model.path), "--no-progress",
                 *shlex.split(args.workload_args))
    # Each run its own salt (and each rate of a sweep its own): the same trace, but no run
    # finds an earlier one's prompts in the engines' prefix caches, as the simulation,
    # which starts each replay cold, does not.
    with processes.running(server):
        pdserve(*bench_run, "--rate", rates.split(",")[0], "--prompt-salt",
                f"{prefix}warm-up", "--out", str(args.out / f"{prefix}warm-up"))
        for repeat in range(1, args.repeats + 1):
            pdserve(*bench_run, "--rates", rates, "--prompt-salt", f"{prefix}repeat{repeat}",
                    "--out", str(args.out / f"{prefix}repeat{repeat}"))
        if args.trace is not None and not prefix:
            # the same slice each repeat, its prompts salted apart by the seed
            for repeat in range(1, args.repeats + 1):
                pdserve("bench", "run", "--config", str(config_path), "--base-url", base_url,
                        "--model", config.model.name, "--tokenizer", str(config.model.path),
                        "--no-progress", "--trace", str(args.trace),
                        *shlex.split(args.trace_args), "--rates", args.trace_rates,
                        "--seed", str(1000 + repeat),
                        "--out", str(args.out / f"trace-repeat{repeat}"))
        if "--turns" not in args.workload_args or prefix:
            return []
        # how much of an answer the next turn repeats
        subprocess.run([sys.executable, "tools/experiments/answer_reuse.py", "--base-url", base_url,
                        "--model", config.model.name, "--tokenizer", str(config.model.path),
                        "--out", str(args.out / "answer-reuse.json")], check=True, cwd=REPO)
        return ["--answer-reuse", str(args.out / "answer-reuse.json")]


if __name__ == "__main__":
    main()
