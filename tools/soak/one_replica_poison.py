"""A poison request on a cluster with one replica per pool: the service comes back.

    .venv/bin/python -m tools.soak.one_replica_poison

The fault suite's cluster cut to one replica per pool, its decode engine keeping vLLM
0.32's own rewind of a discarded seeded sample (``PDSERVE_SEEDED_CPU=vllm``), which ends
a CPU engine on a seeded prompt it prefills in chunks. Three seeded ~2,400-token prompts
with distinct heads are sent one after another, the first with n = 2 (the decode engine
prefills it: its engine dies), the next two with n = 1. Before a request's Serve calls each
had an id of their own (router/transport.py), this left the decode pool unreachable for
good: every later request hung, ``/health`` answered 503 while Serve reported the
replacement replica healthy. Now: each answer's status, then how long until a plain
request, ``/health`` and ``/admin/stats`` all answer again (exit 1 if not within
``--within-s``).
"""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

import httpx
import yaml

from cluster.config import load_config
from tools import processes

REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = REPO / "tests/integration/pdserve-faults.yaml"
LOG_DIR = REPO / ".cache" / "soak"


def one_replica_config(path: Path) -> Path:
    config = yaml.safe_load(BASE_CONFIG.read_text())
    config["prefill"]["replicas"] = config["decode"]["replicas"] = 1
    config["decode"]["env"]["PDSERVE_SEEDED_CPU"] = "vllm"
    path.write_text(yaml.safe_dump(config))
    return path


def seeded(model: str, n: int) -> dict:
    head = uuid.uuid4().hex[:8]
    prompt = " ".join(f"{head}{i}" for i in range(300))
    return {"model": model, "prompt": prompt, "temperature": 1.0, "seed": 5, "n": n,
            "max_tokens": 8, "ignore_eos": True}


def answers_again(url: str, model: str) -> bool:
    """A plain request, /health and /admin/stats all answer (each within 30 s)."""
    try:
        plain = httpx.post(f"{url}/v1/completions", timeout=30,
                           json={"model": model, "prompt": "back?", "max_tokens": 4})
        health = httpx.get(f"{url}/health", timeout=30)
        stats = httpx.get(f"{url}/admin/stats", timeout=30)
    except httpx.HTTPError:
        return False
    return (plain.status_code, health.status_code, stats.status_code) == (200, 200, 200)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--within-s", type=float, default=300)
    args = parser.parse_args(argv)
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    config_path = one_replica_config(LOG_DIR / "one-replica-poison.yaml")
    config = load_config(config_path)
    model, url = config.model.name, f"http://{config.router.host}:{config.router.port}"
    server = processes.start_pdserve(config_path, config, LOG_DIR, REPO,
                                     name="one-replica-poison")
    with processes.running(server):
        for n in (2, 1, 1):
            sent = time.monotonic()
            response = httpx.post(f"{url}/v1/completions", json=seeded(model, n), timeout=600)
            print(f"seeded n={n}: {response.status_code} after {time.monotonic() - sent:.1f}s "
                  f"{response.text[:160]}", flush=True)
        started, deadline = time.monotonic(), time.monotonic() + args.within_s
        while not answers_again(url, model):
            if time.monotonic() > deadline:
                print(f"NOT serving again {args.within_s:.0f}s after the last poison; "
                      f"see {server.log}")
                return 1
            time.sleep(2)
        print(f"serving again {time.monotonic() - started:.1f}s after the last poison's answer "
              "(a plain request, /health and /admin/stats: 200)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
