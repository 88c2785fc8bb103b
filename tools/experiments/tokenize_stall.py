"""How long one huge prompt holds up the other streams of a router replica.

Streams greedy completions from a running pdserve and records the largest gap between two
of their chunks; in the middle of every other stream it posts a prompt of ``--mb``
megabytes, which the router tokenizes before refusing it as longer than the model's
context. Prints the median largest gap with and without the huge prompt, and their
ratio, over ``--rounds`` of each, alternating.

The default size is the largest prompt that is tokenized at all: vLLM's layer refuses a
prompt of more than 17 characters per token of context unread (139,264 characters for
the test model's 8,192 tokens), and pdserve refuses bodies over 2 MiB before that.

    .venv/bin/pdserve up --config tests/integration/pdserve-faults.yaml   # another shell
    .venv/bin/python tools/experiments/tokenize_stall.py \
        --url http://127.0.0.1:8500 --model tiny-llama
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import threading
import time

import httpx

from router.sse import sse_lines


def largest_gap(url: str, model: str, tokens: int, during=None) -> float:
    body = {"model": model, "prompt": "a stream", "temperature": 0, "max_tokens": tokens,
            "ignore_eos": True, "stream": True}
    arrivals: list[float] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
        for line in sse_lines(response.iter_bytes()):
            if line.startswith("data: {"):
                arrivals.append(time.monotonic())
                if during is not None and len(arrivals) == tokens // 4:
                    threading.Thread(target=during, daemon=True).start()
    return max(b - a for a, b in itertools.pairwise(arrivals))


def huge_prompt(url: str, model: str, megabytes: float) -> None:
    words = int(megabytes * 1_000_000 / 7)
    prompt = " ".join(f"w{i % 100_000}" for i in range(words))
    answer = httpx.post(f"{url}/v1/completions", timeout=300, content=json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": 1}))
    print(f"  huge prompt ({len(prompt) / 1e6:.1f} MB): {answer.status_code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8500")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--mb", type=float, default=0.135)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    alone, beside = [], []
    for _ in range(args.rounds):
        alone.append(largest_gap(args.url, args.model, args.tokens))
        beside.append(largest_gap(args.url, args.model, args.tokens, during=lambda: huge_prompt(
            args.url, args.model, args.mb)))
        print(f"  largest gap alone {alone[-1] * 1000:.1f} ms, beside it "
              f"{beside[-1] * 1000:.1f} ms")
    base, loaded = statistics.median(alone), statistics.median(beside)
    print(f"median largest gap: alone {base * 1000:.1f} ms, beside a {args.mb} MB prompt "
          f"{loaded * 1000:.1f} ms ({loaded / base:.1f}x)")


if __name__ == "__main__":
    main()
