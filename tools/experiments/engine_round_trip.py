"""What a request costs between a vLLM ``AsyncLLM`` caller and its engine core, beyond the
engine's own time: the hop each pdserve replica makes to its engine, twice on the
disaggregated path (prefill engine, then decode engine) where vLLM's own server makes it
once.

    .venv/bin/python tools/experiments/engine_round_trip.py \
        --config ray_configs/bench.yaml --requests 30

Starts one engine with the decode pool's settings (its cores and environment, no KV
connector) in this process's ``AsyncLLM``, as a replica holds it, and sends short prompts
one at a time for one token with one final output, as a prefill replica asks. For each it
splits the wall time of ``generate``, from the call to the output, at the engine core's own
timestamps (the request's metrics; CLOCK_MONOTONIC, one clock for every process of the
host): the way in (the call to the engine core queuing it), the engine's time (queued to
first token) and the way back (the first token to the caller). Prints medians and p95s.

The prompt goes in two forms, alternating, each timed on its own: ``rendered``, the
``TokensInput`` (``vllm.inputs.tokens_input``) that vLLM's own server hands ``AsyncLLM`` and
pdserve's replicas hand it since 2026-12-05, and ``raw``, the ``TokensPrompt`` they handed
it before, which ``AsyncLLM`` renders on a thread of its renderer's pool first.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time
from pathlib import Path

from cluster.config import load_config
from cluster.engine.args import engine_kwargs, engine_settings_env
from cluster.percentile import percentile


async def measure(config, requests: int, prompt_tokens: int) -> list[dict[str, float]]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.inputs.engine import tokens_input
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    kwargs = {**engine_kwargs(config, "decode", None), "disable_log_stats": False}
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    params = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)
    vocab = engine.vllm_config.model_config.get_vocab_size()
    rows = []
    forms = {"rendered": tokens_input, "raw": lambda ids: TokensPrompt(prompt_token_ids=ids)}
    try:
        for index in range(2 * requests + 6):  # six to warm up; no two prompts share a block
            form = ("rendered", "raw")[index % 2]
            prompt = forms[form]([(index * 7919 + k * 31) % (vocab - 10) + 10
                                  for k in range(prompt_tokens)])
            called = time.monotonic()
            final = None
            async for output in engine.generate(prompt, params, f"round-trip-{index}"):
                final = output
            returned = time.monotonic()
            metrics = final.metrics
            if index >= 6 and metrics is not None and metrics.queued_ts:
                rows.append({
                    "form": form,
                    "wall_ms": (returned - called) * 1e3,
                    "way_in_ms": (metrics.queued_ts - called) * 1e3,
                    "engine_ms": (metrics.first_token_ts - metrics.queued_ts) * 1e3,
                    "way_back_ms": (returned - metrics.first_token_ts) * 1e3,
                })
            await asyncio.sleep(0.05)  # let the engine go idle, as between sparse requests
    finally:
        engine.shutdown()
        del engine  # its __del__ would shut it down again at exit, with modules gone
        gc.collect()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("ray_configs/bench.yaml"))
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="a JSON file of every request")
    args = parser.parse_args()
    config = load_config(args.config)
    os.environ.update(engine_settings_env(config, "decode"))  # the engine core inherits it
    rows = asyncio.run(measure(config, args.requests, args.prompt_tokens))
    if not rows:
        raise SystemExit("no request carried the engine's timestamps")
    print(f"{len(rows)} requests of {args.prompt_tokens} prompt tokens, one token each, "
          "the prompt's two forms alternating")
    print(f"  {'ms, p50 (p95)':<14}{'rendered':>16}{'raw':>16}{'rendered / raw':>16}")
    for key in ("wall_ms", "way_in_ms", "engine_ms", "way_back_ms"):
        cells, medians = [], []
        for form in ("rendered", "raw"):
            values = sorted(row[key] for row in rows if row["form"] == form)
            medians.append(percentile(values, 50))
            cells.append(f"{medians[-1]:.2f} ({percentile(values, 95):.2f})")
        ratio = f"{medians[0] / medians[1]:.2f}" if medians[1] else "-"
        print(f"  {key[:-3]:<14}{cells[0]:>16}{cells[1]:>16}{ratio:>16}")
    if args.out is not None:
        args.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
