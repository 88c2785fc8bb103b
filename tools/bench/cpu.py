"""CPU time of pdserve's processes over a benchmark run, by role (shell: reads /proc).

Where the serving layer's CPU goes is the other half of its overhead: on a machine whose
cores the engines share, every CPU-second the router, Serve's proxy or an engine replica's
Python spends on a token is taken from an engine step. A run samples every process's
user+system time before and after, attributes each process to a role by its title (Ray
and vLLM name their processes) and by its ancestors (an engine's processes are children
of the replica that hosts it), and divides by the tokens streamed. Linux only; elsewhere
``cpu_seconds_by_role`` returns nothing and the bench prints no table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

# In the order the bench prints them.
ROLES = ("router", "proxy", "decode replica", "decode engine", "prefill replica",
         "prefill engine", "engine", "ray services", "other")


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    title: str
    cpu_s: float


def role_of(title: str) -> str | None:
    """The role of a process by its title alone (engine processes: by their ancestors)."""
    if title.startswith("ray::ServeReplica:"):
        deployment = title.split(":")[-1].split(" ")[0]
        for pool in ("prefill", "decode"):
            if deployment.startswith(f"{pool}-"):
                return f"{pool} replica"
        return "router" if deployment.startswith("router") else "ray services"
    if title.startswith("ray::ProxyActor") or _program(title) == "haproxy":
        return "proxy"  # the ingress either way: Serve's proxy, or HAProxy (router.ingress)
    if title.startswith(("ray::", "raylet", "gcs_server")) or "/ray/" in title.split(" ")[0]:
        return "ray services"
    return None


def _program(title: str) -> str:
    """The file name of the program a command line runs."""
    return title.split(" ")[0].rsplit("/", 1)[-1]


def roles(processes: dict[int, Process]) -> dict[int, str]:
    """Each process's role; a process with no role of its own takes an engine's role
    when a pool's replica is among its ancestors (vLLM's EngineCore and workers), and
    "engine" when it is an engine process of vLLM's own server."""
    found: dict[int, str] = {}
    for pid, process in processes.items():
        role = role_of(process.title)
        if role is None:
            role = _engine_role(pid, processes)
        if role is None and _is_vllm_engine(process.title):
            role = "engine"  # vLLM's own server's engine: its API server stays "other"
        if role is not None:
            found[pid] = role
    return found


def _is_vllm_engine(title: str) -> bool:
    """An engine process vLLM spawned (titled ``VLLM::EngineCore``, ``VLLM::Worker``, or
    still showing multiprocessing's spawn command line)."""
    return title.startswith("VLLM::") or "multiprocessing.spawn" in title


def _engine_role(pid: int, processes: dict[int, Process]) -> str | None:
    seen: set[int] = set()
    parent = processes[pid].ppid
    while parent in processes and parent not in seen:
        seen.add(parent)
        role = role_of(processes[parent].title)
        if role in ("prefill replica", "decode replica"):
            return role.replace("replica", "engine")
        parent = processes[parent].ppid
    return None


def cpu_by_role(before: dict[int, Process], after: dict[int, Process],
                root: int) -> dict[str, float]:
    """CPU-seconds each role of ``root``'s process tree used between two samples
    (processes started between them count from zero; roles as ``roles``, else "other")."""
    tree = descendants(root, after)
    found = roles({pid: after[pid] for pid in tree} | _ancestors_of(tree, after))
    used: dict[str, float] = {}
    for pid in tree:
        role = found.get(pid, "other")
        start = before[pid].cpu_s if pid in before else 0.0
        used[role] = used.get(role, 0.0) + max(0.0, after[pid].cpu_s - start)
    return used


def beyond_idle(used: dict[str, float], idle_rate: dict[str, float],
                seconds: float) -> dict[str, float]:
    """CPU-seconds each role used over ``seconds`` beyond its idle rate (CPU-seconds per
    second: Ray's reports, Serve's polls, engines' gauges), never below zero."""
    return {role: max(0.0, cpu_s - idle_rate.get(role, 0.0) * seconds)
            for role, cpu_s in used.items()}


def descendants(root: int, processes: dict[int, Process]) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, process in processes.items():
        children.setdefault(process.ppid, []).append(pid)
    found, pending = set(), [root]
    while pending:
        pid = pending.pop()
        if pid in found or pid not in processes:
            continue
        found.add(pid)
        pending.extend(children.get(pid, ()))
    return found


def _ancestors_of(pids: set[int], processes: dict[int, Process]) -> dict[int, Process]:
    """The processes above ``pids`` (an engine's role comes from its replica above it)."""
    above: dict[int, Process] = {}
    for pid in pids:
        parent = processes[pid].ppid
        while parent in processes and parent not in above:
            above[parent] = processes[parent]
            parent = processes[parent].ppid
    return above


def sample_processes(proc: Path = PROC) -> dict[int, Process]:
    """Every readable process's parent, title and CPU time so far."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    table: dict[int, Process] = {}
    for entry in proc.glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            continue  # gone, or not ours to read
        # the command name in parentheses may hold spaces: split after its closing ")"
        fields = stat[stat.rindex(")") + 2:].split()
        table[int(entry.name)] = Process(int(entry.name), int(fields[1]), title,
                                         (int(fields[11]) + int(fields[12])) / ticks)
    return table
