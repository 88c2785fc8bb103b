"""The floor of one Serve call on this machine: what a pool stage costs beyond its engine.

    .venv/bin/python tools/experiments/serve_call_floor.py --calls 200

pdserve's router reaches each engine pool through a Serve handle (router/transport.py):
the disaggregated path makes two such calls before its first token, a unary one to the
prefill pool and a streaming one to the decode pool. This serves two deployments on a
local Ray with pdserve's Serve environment (cluster/serve_env.py, the gRPC data plane)
and times, from inside a caller deployment as the router calls, a call to a replica that
does nothing: unary (echo a payload the size of a short prompt's request) and streaming
(the first item of a generator). What a pool stage costs beyond that floor and its engine
is pdserve's (its replica's and vLLM's AsyncLLM's hand-offs); the floor itself is Serve's.
Prints p50/p95 per kind and writes them to ``--out``.

``--gap-ms``: wait that long after each call, as between the requests of a lightly loaded
server (``pdserve bench overhead`` sends one at a time), so that each call finds the
processes it crosses idle; the default, 0, times calls back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from cluster.percentile import percentile
from cluster.serve_env import node_env
from router.transport import GRPC_OPTIONS

PAYLOAD = tuple(range(500))  # a ~500-token prompt's ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--transport", choices=["grpc", "ray"], default="grpc")
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="idle time after each call (default: none, back to back)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/serve-call-floor.json"))
    args = parser.parse_args()
    os.environ.update(node_env(args.transport))  # before Ray and Serve are imported
    import ray
    from ray import serve

    @serve.deployment(max_ongoing_requests=64)
    class Echo:
        async def unary(self, payload):
            return payload

        async def stream(self, payload):
            yield payload[:1]

    @serve.deployment
    class Caller:
        def __init__(self, echo):
            self._echo = echo.options(**GRPC_OPTIONS) if args.transport == "grpc" else echo

        async def measure(self, calls: int, gap_s: float) -> dict[str, list[float]]:
            timings: dict[str, list[float]] = {"unary": [], "stream_first_item": []}
            for _ in range(calls):
                started = time.perf_counter()
                await self._echo.unary.remote(PAYLOAD)
                timings["unary"].append(time.perf_counter() - started)
                await asyncio.sleep(gap_s)
                started = time.perf_counter()
                async for _ in self._echo.options(stream=True).stream.remote(PAYLOAD):
                    timings["stream_first_item"].append(time.perf_counter() - started)
                    break
                await asyncio.sleep(gap_s)
            return timings

    async def drive() -> dict[str, list[float]]:
        # a handle routes on its caller's loop with pdserve's Serve environment, so the
        # driver's calls, and Serve's shutdown of its handles, run on one loop
        caller = serve.run(Caller.bind(Echo.bind()), name="floor", route_prefix=None)
        try:
            await caller.measure.remote(20, 0.0)  # warm: connections, code paths
            return await caller.measure.remote(args.calls, args.gap_ms / 1000)
        finally:
            await serve.shutdown_async()

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        timings = asyncio.run(drive())
    finally:
        ray.shutdown()
    summary = {kind: {"p50_ms": percentile(values, 50) * 1000,
                      "p95_ms": percentile(values, 95) * 1000, "calls": len(values)}
               for kind, values in timings.items()}
    for kind, row in summary.items():
        print(f"{kind:>18}: p50 {row['p50_ms']:.2f} ms, p95 {row['p95_ms']:.2f} ms "
              f"({row['calls']} calls, {args.transport}, {args.gap_ms:g} ms apart)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"transport": args.transport, "gap_ms": args.gap_ms,
                                    **summary}, indent=2))


if __name__ == "__main__":
    main()
