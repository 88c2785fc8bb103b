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
from tests.integration.conftest import CONFIG, MODEL
from tests.integration.openai_http import generate
from tests.integration.test_equivalence import prose
from tools.cluster_processes import is_spawned_as

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


KV_MEMFD = "/memfd:pdserve-kv"  # kv_transfer/shared_kv.py's MEMFD_NAME, as /proc shows it


def kv_mappings(pid: int) -> list[tuple[str, int]]:
    """(permissions, inode) of each mapping of a pdserve KV memfd in the process."""
    mappings = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(KV_MEMFD):
            mappings.append((fields[1], int(fields[4])))
    return mappings


def test_same_host_kv_moves_through_the_prefill_engines_shared_cache(pdserve):
    """kv_transfer.shared_memory (on in the test config, as by default): each prefill
    engine's KV cache is a memfd it maps read-write, and a decode engine that pulled a
    prompt's KV from it maps that same memfd read-only, to copy the blocks from; a decode
    engine's own cache is not shared. The answer is checked against colocated vLLM in
    test_equivalence; here, where the bytes came from."""
    assert CONFIG.kv_transfer.shared_memory
    result = generate(pdserve, "completion", MODEL, prose(230, seed=41), stream=False,
                      max_tokens=4, temperature=0)
    assert result.status == 200 and len(result.prompt_token_ids) > 1000, result.error
    mappings = {pid: kv_mappings(pid) for pid, _ in cluster_workers()}
    shared_caches = {inode for maps in mappings.values()
                     for permissions, inode in maps if permissions == "rw-s"}
    prefill_engines = [pid for pid, maps in mappings.items()
                       if any(permissions == "rw-s" for permissions, _ in maps)]
    assert len(prefill_engines) == len(CONFIG.versions), mappings
    readers = [pid for pid, maps in mappings.items() if pid not in prefill_engines
               and any(permissions == "r--s" and inode in shared_caches
                       for permissions, inode in maps)]
    assert readers, mappings  # the decode engine that pulled this prompt's KV
