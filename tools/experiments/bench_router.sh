#!/usr/bin/env bash
# The router's fairness levers against the same seeded workloads (docs/benchmarks.md):
#  1. per-request disaggregation: a sweep of router.disaggregation_threshold_tokens on the
#     interference workload (short chats plus a trickle of 4-8K prompts);
#  2. the long-prompt lane and the prefill pool's chunked-prefill cap, on a heavier mix
#     (30% long prompts at 1 req/s) under a token budget that two long prompts fill.
# Usage: tools/experiments/bench_router.sh [OUT_DIR]      (~30 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/router}
tok=.cache/models/tiny-llama-256x4-s0
.venv/bin/pdserve bench variants --config ray_configs/bench.yaml --workload interference \
    --rate 0.5 --num-requests 60 --seed 0 --no-progress --tokenizer "$tok" --out "$out/threshold" \
    --variant "t0:router.disaggregation_threshold_tokens=0" \
    --variant "t128:router.disaggregation_threshold_tokens=128" \
    --variant "t256:router.disaggregation_threshold_tokens=256" \
    --variant "t512:router.disaggregation_threshold_tokens=512" \
    --variant "t1024:router.disaggregation_threshold_tokens=1024"
budget="router.disaggregation_threshold_tokens=0,router.admission.token_budget=16384"
.venv/bin/pdserve bench variants --config ray_configs/bench.yaml --workload interference \
    --rate 1 --long-fraction 0.3 --num-requests 60 --seed 0 --no-progress --tokenizer "$tok" \
    --out "$out/lane" \
    --variant "base:$budget" \
    --variant "lane:$budget,router.admission.long_prompt_tokens=2048" \
    --variant "chunked:$budget,prefill.max_num_batched_tokens=512" \
    --variant "lane+chunked:$budget,router.admission.long_prompt_tokens=2048,prefill.max_num_batched_tokens=512"
