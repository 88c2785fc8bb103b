"""``pdserve plan calibrate``: step times of this machine's engines, fitted (shell).

For each pool of a config, a vLLM engine with that pool's settings and cores runs in a
process of its own (no Ray, no NIXL: the engine alone) through a sweep, and every step is
timed around ``LLMEngine.step``:

- prefill: one prompt at a time, of 16 to 8,192 tokens (chunked as the pool's token
  budget chunks it), three distinct prompts of each length;
- decode: batches of 1 to 64 streams of 64-token prompts, 48 tokens each.

The samples are fitted by tools/planner/fitted.py and written as JSON, which
``pdserve plan replay`` and ``pdserve plan --calibration`` use instead of the roofline.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

PROMPT_LENGTHS = (16, 64, 256, 512, 1024, 2048, 4096, 8192)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_PROMPT, DECODE_TOKENS = 64, 48


def calibrate(config_path: Path, out: Path, prompt_lengths=PROMPT_LENGTHS,
              decode_batches=DECODE_BATCHES) -> dict:
    """Run the sweep for both pools, fit, write ``out``; return what was written."""
    from cluster.checkpoints import ensure_checkpoints
    from cluster.config import load_config
    from cluster.engine.args import engine_settings_env
    from cluster.percentile import percentile
    from tools.planner.fitted import StepSample, fit, relative_errors

    config = load_config(config_path)
    ensure_checkpoints(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {"config": str(config_path)}
    for role in ("prefill", "decode"):
        samples_path = out.with_name(f"{out.stem}-{role}-samples.json")
        env = {**os.environ, **engine_settings_env(config, role),
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        subprocess.run([sys.executable, "-m", "tools.planner.calibrate", str(config_path),
                        role, str(samples_path), ",".join(map(str, prompt_lengths)),
                        ",".join(map(str, decode_batches))], env=env, check=True)
        measured = json.loads(samples_path.read_text())
        samples = [StepSample(**row) for row in measured.pop("samples")]
        cost = fit(samples)
        errors = [abs(e) for e in relative_errors(cost, samples)]
        result[role] = {"cost": cost.as_dict(), **measured, "samples": len(samples),
                        "median_abs_error": percentile(errors, 50),
                        "p95_abs_error": percentile(errors, 95)}
    out.write_text(json.dumps(result, indent=2))
    return result


def _sweep(config_path: Path, role: str, out: Path, prompt_lengths: list[int],
           decode_batches: list[int]) -> None:
    """In the engine's own process: run the sweep and write the samples."""
    from vllm import EngineArgs, SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    from cluster.config import load_config
    from cluster.engine.args import engine_kwargs
    from tools.planner.fitted import StepSample
    from tools.planner.model import prefill_pairs

    config = load_config(config_path)
    kwargs = engine_kwargs(config, role, None)
    kwargs["enable_prefix_caching"] = False         # every prompt computed in full
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    budget = engine.vllm_config.scheduler_config.max_num_batched_tokens
    cache = engine.vllm_config.cache_config
    vocab = engine.model_config.get_vocab_size()
    rng = random.Random(0)
    samples: list[StepSample] = []
    ids = iter(range(10**9))

    def prompt(length: int) -> dict:
        return {"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(length)]}

    def timed_step() -> float:
        started = time.perf_counter()
        engine.step()
        return time.perf_counter() - started

    # warm-up: the first steps of an engine pay for allocation and caches
    engine.add_request(str(next(ids)), prompt(256), SamplingParams(max_tokens=8))
    while engine.has_unfinished_requests():
        engine.step()
    for length in prompt_lengths:
        if length > config.engine.max_model_len - 8:
            continue
        for _ in range(3):
            engine.add_request(str(next(ids)), prompt(length),
                               SamplingParams(max_tokens=1, ignore_eos=True))
            done = 0
            while done < length:
                chunk = min(budget, length - done)
                seconds = timed_step()
                samples.append(StepSample(chunk, prefill_pairs(chunk, done), done, seconds))
                done += chunk
            while engine.has_unfinished_requests():
                engine.step()
    for batch in decode_batches:
        if batch > config.engine.max_num_seqs:
            continue
        for _ in range(batch):
            engine.add_request(str(next(ids)), prompt(DECODE_PROMPT),
                               SamplingParams(max_tokens=DECODE_TOKENS, ignore_eos=True))
        prefill_steps = -(-batch * DECODE_PROMPT // budget)
        for _ in range(prefill_steps + 1):          # the prompts, and the first token
            engine.step()
        generated = 1
        while engine.has_unfinished_requests() and generated < DECODE_TOKENS:
            context = batch * (DECODE_PROMPT + generated)
            seconds = timed_step()
            if generated > 2:                        # past the batch's first steps
                samples.append(StepSample(batch, context + batch, context, seconds))
            generated += 1
        while engine.has_unfinished_requests():
            engine.step()
    out.write_text(json.dumps({
        "samples": [asdict(s) for s in samples], "max_num_batched_tokens": budget,
        "max_num_seqs": engine.vllm_config.scheduler_config.max_num_seqs,
        "kv_capacity_tokens": (cache.num_gpu_blocks or 0) * cache.block_size}))


if __name__ == "__main__":
    _sweep(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]),
           [int(n) for n in sys.argv[4].split(",")], [int(n) for n in sys.argv[5].split(",")])
