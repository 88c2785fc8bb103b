"""The machine ``pdserve up`` starts a local cluster on (shell): whether the router's port
is free, which cores the cluster's processes may run on, and the line that says it serves.

Both the CLI and the tools that launch servers (tools/processes.py, the Ray Serve LLM
baseline) use these, so they live below the CLI rather than in it.
"""

from __future__ import annotations

import os
import socket
import sys

from cluster.config import PDServeConfig
from cluster.cores import parse_cores

SERVING_BANNER = "pdserve is serving"  # printed once serve.run has returned: ready


def port_is_free(host: str, port: int) -> bool:
    """True if nothing listens on ``host:port`` (a bind succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def run_on_serving_cores(config: PDServeConfig) -> int:
    """Move this process to ``ray.serving_cores`` before it starts the local cluster,
    whose processes (Ray's, Serve's, the replicas and the engine schedulers they start)
    inherit it; each engine's worker binds itself to its pool's cores."""
    if config.ray.serving_cores is None:
        return 0
    cores, available = parse_cores(config.ray.serving_cores), os.sched_getaffinity(0)
    if not cores <= available:
        print(f"pdserve: ray.serving_cores {config.ray.serving_cores!r} names cores "
              f"{sorted(cores - available)}, which this process may not run on (it may run "
              f"on {sorted(available)})", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, cores)
    return 0
