"""The processes a vLLM engine runs in, and what is left of them once it died (shell:
psutil, sockets).

vLLM's engine core runs in a child process of the replica, and on CPU its model runner in
a worker process under that (``MultiprocExecutor``); the worker holds the engine's NIXL
side-channel listener. When the core dies of an error of its own, the worker can outlive
it, and the port with it: the replacement replica, which takes its predecessor's port
(kv_transfer/ports.py), then cannot bind it and its engine never comes up. So the tree is
recorded once the engine is up, and whatever of it still runs after the engine died is
killed (docs/design.md, "Quarantine").
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from collections.abc import Sequence
from typing import Any


def engine_processes(engine: Any) -> list[Any]:
    """The engine's EngineCore processes (``multiprocessing`` processes, with ``pid`` and
    ``exitcode``); none for an engine without (a test's stand-in)."""
    manager = getattr(getattr(engine, "engine_core", None), "resources", None)
    return list(getattr(getattr(manager, "engine_manager", None), "processes", None) or [])


def record_tree(engine: Any) -> list[Any]:
    """The engine's processes and everything under them now (``psutil.Process``es: they
    remember their start time, so a pid reused later is never mistaken for them)."""
    import psutil

    tree = []
    for process in engine_processes(engine):
        with contextlib.suppress(psutil.NoSuchProcess):
            core = psutil.Process(process.pid)
            tree += [core, *core.children(recursive=True)]
    return tree


def kill_tree(engine: Any, recorded: list[Any] = ()) -> list[int]:
    """SIGKILL the engine's processes, everything under them now and whatever of
    ``recorded`` still runs (a stopped or stuck process acts on nothing gentler), and
    return the pids killed. vLLM's monitor then finds the core gone and fails the
    engine's requests (``EngineDeadError``)."""
    return kill_running([*record_tree(engine), *recorded])


def kill_running(processes: list[Any]) -> list[int]:
    """SIGKILL those of ``processes`` that still run; the pids killed, each once."""
    import psutil

    killed: list[int] = []
    for process in processes:
        if process.pid in killed:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                process.kill()
                killed.append(process.pid)
    return killed


def outlived(processes: list[Any], timeout_s: float) -> list[Any]:
    """Those of ``processes`` still running after waiting up to ``timeout_s`` for them."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    return alive


def first_free_ports(host: str, firsts: Sequence[int], width: int, timeout_s: float,
                     poll_s: float = 0.5) -> int:
    """The first of ``firsts`` whose ``width`` ports from it can all be listened on at
    ``host``, polled until ``timeout_s``; then ``RuntimeError`` naming the process that
    holds the first. A replica whose ports are all held fails at once with the reason,
    instead of an engine whose worker cannot bind and whose start never ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        for first in firsts:
            if all(_can_listen(host, port) for port in range(first, first + width)):
                return first
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"NIXL side-channel port {firsts[0]} on {host} is still held by "
                f"{listener_of(firsts[0])} after {timeout_s:.0f} s, and no other port of "
                "its pool is free; this replica's engine cannot listen")
        time.sleep(poll_s)


def _can_listen(host: str, port: int) -> bool:
    # SO_REUSEADDR as ZeroMQ binds: a closed listener's TIME_WAIT does not count as held.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def listener_of(port: int) -> str:
    """Which process listens on ``port``, as far as this user may see."""
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        for connection in psutil.net_connections(kind="tcp"):
            if connection.laddr and connection.laddr.port == port and connection.pid \
                    and connection.status == psutil.CONN_LISTEN:
                process = psutil.Process(connection.pid)
                return f"pid {connection.pid} ({' '.join(process.cmdline()[:3])[:120]})"
    return "another process"
