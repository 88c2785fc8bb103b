"""Each CPU engine computes on the cores its pool names, and nothing moves it off them.

On a CPU node the pools' cores are the CPU version of their own GPUs: the prefill engine
computes on core 0 and the decode engine on core 1 (``VLLM_CPU_OMP_THREADS_BIND`` in
tests/integration/pdserve-test.yaml), so that a long prefill cannot take steps from
running streams. vLLM 0.32's NIXL worker used to move the thread that computes a prefill
engine's model onto the decode engine's core (kv_transfer/vllm_plugin.py); this checks
every engine worker of the running cluster, by its threads' affinity in /proc.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from cluster.cores import parse_cores
from tests.integration.conftest import CONFIG
from tests.integration.engine_processes import is_spawned_as

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or not Path("/proc/self/task").is_dir(),
    reason="reads thread affinities from Linux's /proc")

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
PORT_ENV = "VLLM_NIXL_SIDE_CHANNEL_PORT"


def cluster_workers() -> list[tuple[int, dict[str, str]]]:
    """The vLLM worker processes of the test cluster (by their NIXL side-channel port,
    which only this cluster's engines have in its range) with their environment."""
    base = CONFIG.kv_transfer.side_channel_base_port
    pools = 2 * len(CONFIG.versions)  # each version's prefill and decode pool has a slice
    span = CONFIG.kv_transfer.side_channel_port_span * pools
    workers = []
    for process in psutil.process_iter():
        try:
            if not is_spawned_as(process, "VLLM::Worker") or \
                    not is_spawned_as(process.parent(), "VLLM::EngineCore"):
                continue
            env = process.environ()
        except (psutil.Error, AttributeError):  # gone meanwhile, or no parent
            continue
        if base <= int(env.get(PORT_ENV, "0")) < base + span:
            workers.append((process.pid, env))
    return workers


def test_every_engine_thread_stays_on_its_pools_cores(pdserve):
    if os.cpu_count() < 2:
        pytest.skip("the test config binds the pools to cores 0 and 1")
    workers = cluster_workers()
    expected_engines = 2 * len(CONFIG.versions)  # a prefill and a decode engine each
    assert len(workers) == expected_engines, workers
    binds = sorted(env[BIND_ENV] for _, env in workers)
    assert binds == sorted(["0", "1"] * len(CONFIG.versions)), binds
    for pid, env in workers:
        allowed = parse_cores(env[BIND_ENV])
        # the main thread runs the model (vLLM's OpenMP master thread with one core)
        assert os.sched_getaffinity(pid) == allowed, (pid, env[BIND_ENV])
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                affinity = os.sched_getaffinity(int(task.name))
            except OSError:
                continue  # a thread that ended meanwhile
            assert affinity <= allowed, (pid, task.name, affinity, env[BIND_ENV])
