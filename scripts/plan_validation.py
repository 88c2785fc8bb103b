"""The planner against the real cluster on this machine (docs/planning.md, validation 5):

    .venv/bin/python scripts/plan_validation.py --out bench-results/plan-validation

1. ``pdserve plan calibrate``: each pool's engine of ``--config`` timed through a sweep;
2. the cluster of ``--config`` served, one unrecorded warm-up run of the first rate (the
   first requests after a start are slower), then ``pdserve bench run`` at each of
   ``--rates``, ``--repeats`` times with the same seed (the same trace: what differs
   between them is the measurement's own noise);
3. ``pdserve plan replay``: the first run at the first rate fits the serving layer's two
   constants; every run is then replayed and predicted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from cluster import processes
from cluster.bench.cli import REPO
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
    parser.add_argument("--out", type=Path, default=REPO / "bench-results/plan-validation")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="a calibration file to use (default: calibrate now)")
    args = parser.parse_args()
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
                 "--tokenizer", str(config.model.path), "--no-progress")
    with processes.running(server):
        pdserve(*bench_run, "--rate", first_rate, "--out", str(args.out / "warm-up"))
        for repeat in range(1, args.repeats + 1):
            pdserve(*bench_run, "--rates", args.rates,
                    "--out", str(args.out / f"repeat{repeat}"))
    rates = [float(rate) for rate in args.rates.split(",")]
    traces = [args.out / f"repeat{repeat}" / f"run-reference-{rate}.json"
              for rate in rates for repeat in range(1, args.repeats + 1)]
    pdserve("plan", "replay", "--config", str(args.config), "--calibration",
            str(calibration), "--out", str(args.out),
            *[part for trace in traces for part in ("--trace", str(trace))])


if __name__ == "__main__":
    main()
