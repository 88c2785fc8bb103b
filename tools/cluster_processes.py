"""Finding a local pdserve cluster's processes by their titles (shell: psutil), for the
tests and the soak that kill them."""

from __future__ import annotations

import psutil


def is_replica(process: psutil.Process, deployment: str) -> bool:
    """Whether a ``psutil`` process (iterated with its "name") is a replica of the pdserve
    app's ``deployment``: Ray titles it after the actor, then ".method" while a call runs."""
    title, name = f"ray::ServeReplica:pdserve:{deployment}", process.info["name"] or ""
    return name == title or name.startswith(f"{title}.")


def is_spawned_as(process: psutil.Process, title: str) -> bool:
    """A process vLLM spawned as ``title`` (``VLLM::EngineCore``, ``VLLM::Worker``): titled
    so, or still showing multiprocessing's spawn command line (vLLM does not always get to
    set its title). An engine core is spawned by its replica (titled ``ray::...``), a
    worker by its engine core."""
    try:
        cmdline = " ".join(process.cmdline())
        return (process.name() == title or cmdline.startswith(title)
                or "multiprocessing.spawn" in cmdline)
    except psutil.NoSuchProcess:
        return False


def replicas(deployment: str) -> list[tuple[psutil.Process, list[psutil.Process]]]:
    """The deployment's replica actors, each with its EngineCore processes."""
    found = []
    for process in psutil.process_iter(["name"]):
        if is_replica(process, deployment):
            try:
                cores = [child for child in process.children()
                         if is_spawned_as(child, "VLLM::EngineCore")]
            except psutil.NoSuchProcess:
                continue
            found.append((process, cores))
    return found


def gone(pids: list[int]) -> bool:
    """Every one of ``pids`` has exited (a zombie waiting for its parent counts as gone)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True
