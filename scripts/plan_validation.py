"""The planner against the real cluster on this machine (docs/planning.md, validation 5):

    .venv/bin/python scripts/plan_validation.py --out bench-results/plan-validation

1. ``pdserve plan calibrate``: each pool's engine of ``--config`` timed through a sweep;
2. the cluster of ``--config`` served, one unrecorded warm-up run of the first rate (the
   first requests after a start are slower), then ``pdserve bench run`` at each of
   ``--rates``, ``--repeats`` times with the same seed (the same trace: what differs
   between them is the measurement's own noise), each run's prompts salted apart so
   that none finds another's in the prefix caches;
3. ``pdserve plan replay``: the runs at ``--fit-rates`` (the first rates of ``--rates``;
   default the first) fit the serving layer's cost, which grows with the tokens streamed
   per second when they are two loads or more (cluster/planner/serving_cost.py); every
   run is then replayed, and the others are predicted.

``--set`` changes the served config (``bench variants``' syntax: ``a.b=1,c=2``) and
``--workload-args`` adds ``pdserve bench run`` workload flags: conversations and shared
heads, whose prefix-cache work the replay predicts beside the engines' counters (with
conversations, ``scripts/answer_reuse.py`` measures how much of an answer the next turn
repeats, and the replay takes it):

    .venv/bin/python scripts/plan_validation.py --rates 1,2 --repeats 2 \
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

from cluster import processes
from cluster.bench.cli import REPO
from cluster.bench.variants import apply_overrides, parse_variant
from cluster.checkpoints import ensure_checkpoints
from cluster.config import load_config


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
    args = parser.parse_args()
    rates = [float(rate) for rate in args.rates.split(",")]
    fit_rates = ([float(rate) for rate in args.fit_rates.split(",")] if args.fit_rates
                 else rates[:1])
    if rates[:len(fit_rates)] != fit_rates:
        parser.error("--fit-rates must be the first rates of --rates")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.set:
        document = apply_overrides(yaml.safe_load(args.config.read_text()),
                                   parse_variant(f"served:{args.set}").overrides)
        args.config = args.out / "config.yaml"
        args.config.write_text(yaml.safe_dump(document, sort_keys=False))
    config = load_config(args.config)
    ensure_checkpoints(config)
    calibration = args.calibration or args.out / "calibration.json"
    if args.calibration is None:
        pdserve("plan", "calibrate", "--config", str(args.config), "--out", str(calibration))
    base_url = f"http://{config.router.host}:{config.router.port}"
    server = processes.start_pdserve(args.config, config, args.out / "logs", REPO)
    first_rate = args.rates.split(",")[0]
    bench_run = ("bench", "run", "--config", str(args.config), "--base-url", base_url,
                 "--model", config.model.name, "--workload", "reference",
                 "--num-requests", str(args.num_requests), "--seed", "0",
                 "--tokenizer", str(config.model.path), "--no-progress",
                 *shlex.split(args.workload_args))
    # Each run its own salt (and each rate of a sweep its own): the same trace, but no run
    # finds an earlier one's prompts in the engines' prefix caches, as the simulation,
    # which starts each replay cold, does not.
    with processes.running(server):
        pdserve(*bench_run, "--rate", first_rate, "--prompt-salt", "warm-up",
                "--out", str(args.out / "warm-up"))
        for repeat in range(1, args.repeats + 1):
            pdserve(*bench_run, "--rates", args.rates, "--prompt-salt", f"repeat{repeat}",
                    "--out", str(args.out / f"repeat{repeat}"))
        reuse = []
        if "--turns" in args.workload_args:   # how much of an answer the next turn repeats
            subprocess.run([sys.executable, "scripts/answer_reuse.py", "--base-url",
                            base_url, "--model", config.model.name, "--tokenizer",
                            str(config.model.path), "--out",
                            str(args.out / "answer-reuse.json")], check=True, cwd=REPO)
            reuse = ["--answer-reuse", str(args.out / "answer-reuse.json")]
    traces = [args.out / f"repeat{repeat}" / f"run-reference-{rate}.json"
              for rate in rates for repeat in range(1, args.repeats + 1)]
    pdserve("plan", "replay", "--config", str(args.config), "--calibration",
            str(calibration), "--out", str(args.out), *reuse,
            "--fit-runs", str(len(fit_rates) * args.repeats),
            *[part for trace in traces for part in ("--trace", str(trace))])


if __name__ == "__main__":
    main()
