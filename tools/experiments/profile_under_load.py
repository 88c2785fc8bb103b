"""Where the serving processes' CPU goes under a steady load: py-spy on the proxy, the
router and the decode replica while streamed completions arrive at a fixed rate.

    .venv/bin/python tools/experiments/profile_under_load.py --rate 4 --seconds 40

Starts pdserve on ``ray_configs/bench.yaml`` with every prompt on the decode-local path
(as ``pdserve bench overhead --paths decode_local`` does), sends the sweep's workload
(~200-token prompts, 32 streamed tokens, Poisson arrivals) and, from a few seconds in,
records each process with py-spy for ``--profile-s``. Prints, per process, the frames
that hold the most samples (inclusive: a frame and everything it called) and the
functions that were running themselves (leaves), both as shares of the process's samples,
and writes the raw collapsed stacks under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cluster.config import load_config, parse_config  # noqa: E402
from tools import processes  # noqa: E402
from tools.bench import overhead  # noqa: E402
from tools.bench.measure import token_counter  # noqa: E402
from tools.bench.runner import run_workload  # noqa: E402
from tools.bench.servers import warm_up, write_config  # noqa: E402
from tools.bench.workload import WorkloadSpec, plan  # noqa: E402

TITLES = {"proxy": "ray::ProxyActor", "router": "ray::ServeReplica:pdserve:router",
          "decode replica": "ray::ServeReplica:pdserve:decode-v1"}


def serving_pids() -> dict[str, int]:
    found = {}
    for process in psutil.process_iter(["pid", "cmdline"]):
        title = " ".join(process.info["cmdline"] or [])
        for role, prefix in TITLES.items():
            if title.startswith(prefix) and role not in found:
                found[role] = process.info["pid"]
    return found


def shares(collapsed: str, top: int) -> tuple[int, list, list]:
    """(samples, the ``top`` frames by inclusive share, the ``top`` leaves by share)."""
    inclusive, leaves, total = Counter(), Counter(), 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")[1:]  # the first is the thread
        total += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
        if frames:
            leaves[frames[-1]] += int(count)
    return total, inclusive.most_common(top), leaves.most_common(top)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=40.0, help="the load's length")
    parser.add_argument("--profile-s", type=int, default=25)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "profile")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config_path = REPO / "ray_configs/bench.yaml"
    base = load_config(config_path)
    document = overhead.config_for_path(yaml.safe_load(config_path.read_text()),
                                        "decode_local", base)
    setup = write_config(document, args.out / "profile.yaml")
    config = parse_config(document, source=str(setup))
    counter = token_counter(str(config.model.path))
    spec = WorkloadSpec(name="reference", rate=args.rate,
                        num_requests=int(args.rate * args.seconds), seed=11,
                        prompt_salt="profile")
    requests = overhead.shorten(plan(spec, counter), 32, 800, keep_times=True)
    server = processes.start_pdserve(setup, config, args.out, REPO, name="profile")
    with processes.running(server):
        warm_up(server.base_url, config.model.name)
        pids = serving_pids()
        load = threading.Thread(target=lambda: asyncio.run(run_workload(
            server.base_url, config.model.name, [replace(r) for r in requests],
            progress=False)))
        load.start()
        time.sleep(5)  # into the steady part of the load
        spies = {role: subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
             "--duration", str(args.profile_s), "--rate", "200", "--format", "raw",
             "--nonblocking", "-o", str(args.out / f"{role.replace(' ', '-')}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for role, pid in pids.items()}
        for spy in spies.values():
            spy.wait(timeout=args.profile_s + 60)
        load.join()
    for role in pids:
        total, frames, leaves = shares(
            (args.out / f"{role.replace(' ', '-')}.txt").read_text(), args.top)
        print(f"\n== {role}: {total} samples")
        print("  inclusive:")
        for frame, count in frames:
            print(f"    {100 * count / total:5.1f}%  {frame}")
        print("  running itself:")
        for frame, count in leaves:
            print(f"    {100 * count / total:5.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
