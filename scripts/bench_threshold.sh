#!/usr/bin/env bash
# Short-request TTFT with and without per-request disaggregation: serves
# ray_configs/bench.yaml once per threshold and runs the same seeded interference workload
# against each. Usage: scripts/bench_threshold.sh [THRESHOLD ...]   (default: 0 512)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 0 ]] && set -- 0 512
out=${OUT:-bench-results}
mkdir -p "$out"
for t in "$@"; do
    config=$(mktemp --suffix=.yaml)
    sed "s/^router:/router:\n  disaggregation_threshold_tokens: $t/" ray_configs/bench.yaml > "$config"
    .venv/bin/pdserve up --config "$config" > "$out/pdserve-threshold-$t.log" 2>&1 &
    server=$!
    for _ in $(seq 1 100); do
        sleep 4
        curl -s -m 3 127.0.0.1:8300/health | grep -q ok && break
    done
    .venv/bin/pdserve bench run --base-url http://127.0.0.1:8300 --model tiny-llama-256x4 \
        --workload interference --rate 0.5 --num-requests 60 --seed 0 --no-progress \
        --tokenizer .cache/models/tiny-llama-256x4-s0 --out "$out/threshold-$t"
    kill -INT "$server"
    wait "$server" || true
    rm -f "$config"
done
