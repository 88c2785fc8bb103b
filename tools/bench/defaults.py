"""The bench commands' defaults and fixed ports (pure): light enough for the parser.

``pdserve`` loads ``tools/bench/cli.py`` at every invocation to build its parser, so what
the flags default to lives here, apart from the modules that measure (and load httpx, Ray
and the config's models).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH_CONFIG = REPO / "ray_configs/bench.yaml"
IDLE_SAMPLE_S = 10.0  # how long each server's idle CPU is sampled before its run (default)
# The ports of the servers started beside pdserve: a lone vLLM (bench compare's colocated
# setup, bench overhead's baseline) and Ray Serve LLM's PD application.
COMPARE_REFERENCE_PORT = 8400
SERVE_LLM_PORT = 8600
