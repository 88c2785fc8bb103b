"""Finding vLLM's engine processes among a host's processes, for tests."""

from __future__ import annotations

import psutil


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
