"""A vLLM general plugin: how an engine's two processes share CPU cores (shell), and a
seeded request's exact sampling on a CPU engine.

vLLM loads it in the engine core and its worker (``vllm.general_plugins``); it reads the
environment ``cluster.engine.args`` sets (names in ``cluster.engine.plugin_env``):
``PDSERVE_ENGINE_WAIT=sleep`` (``engine.step_wait``) makes the queue readers between the
two processes sleep ``SLEEP_S`` instead of spinning and drops the engine core's 1 ms sleep
after an empty step once a request's KV has arrived (``PDSERVE_EMPTY_STEP_SLEEP=vllm``
keeps it); ``PDSERVE_SCHEDULER_NICE=N`` (``engine.scheduler_nice``) runs the engine core at
nice N. Why and what it measured: docs/design.md, "Engines compute on their own cores".
On a CPU engine it also makes a discarded sample (a prefill chunk's) leave the request's
seeded generator as it was (``cluster.engine.seeded_cpu``; ``PDSERVE_SEEDED_CPU=vllm``
keeps vLLM's own behaviour, a request that fails the engine, for a fault test).
"""

from __future__ import annotations

import logging
import multiprocessing
import os

from cluster.engine.plugin_env import EMPTY_STEP_SLEEP_ENV, NICE_ENV, SEEDED_CPU_ENV, WAIT_ENV
from cluster.engine.seeded_cpu import keep_discarded_samples_unseen

_BASE_NICE_ENV = "PDSERVE_BASE_NICE"  # the engine's nice before its core raised it
SLEEP_S = 100e-6
# vLLM 0.32's EngineCoreProc._process_engine_step: its sleep after a step with no model run.
VLLM_EMPTY_STEP_SLEEP_S = 0.001

logger = logging.getLogger("vllm.pdserve")  # vLLM's handlers print it in the engine logs


def register() -> None:
    """Entry point (``vllm.general_plugins``); idempotent, runs in every vLLM process."""
    if os.environ.get(WAIT_ENV) == "sleep":
        _sleep_while_waiting()
        if (multiprocessing.current_process().name.startswith("EngineCore")
                and os.environ.get(EMPTY_STEP_SLEEP_ENV) != "vllm"):
            _skip_empty_step_sleep_once_kv_arrived()
    if os.environ.get(NICE_ENV) is not None:
        _set_priority(multiprocessing.current_process().name)
    if os.environ.get(SEEDED_CPU_ENV) != "vllm":
        keep_discarded_samples_unseen()


def _sleep_while_waiting() -> None:
    import time  # here: cluster.engine.args (pure) imports this module's names

    from vllm.distributed.device_communicators import shm_broadcast

    shm_broadcast.sched_yield = lambda: time.sleep(SLEEP_S)


def _skip_empty_step_sleep_once_kv_arrived() -> None:
    from vllm.v1.engine import core

    original = core.EngineCoreProc._process_engine_step
    if getattr(original, "_pdserve_wrapped", False):
        return
    clock = EngineCoreClock(core.time)
    core.time = clock

    def process_engine_step(self):
        clock.scheduler = self.scheduler
        return original(self)

    process_engine_step._pdserve_wrapped = True
    core.EngineCoreProc._process_engine_step = process_engine_step


class EngineCoreClock:
    """The ``time`` module as vLLM's engine core module sees it, but for one sleep: the
    one after a step with no model run (``VLLM_EMPTY_STEP_SLEEP_S``) only yields the GIL
    when the scheduler holds a request whose KV has arrived (it computes next step). Any
    other use passes through to ``time``."""

    def __init__(self, time_module) -> None:
        self._time = time_module
        self.scheduler = None

    def __getattr__(self, name: str):
        return getattr(self._time, name)

    def sleep(self, seconds: float) -> None:
        if seconds == VLLM_EMPTY_STEP_SLEEP_S and getattr(
                self.scheduler, "finished_recving_kv_req_ids", None):
            seconds = 0
        self._time.sleep(seconds)


def _set_priority(process_name: str) -> None:
    """The engine core (vLLM names its process "EngineCore") takes ``NICE_ENV``; a worker
    ("VllmWorker-<rank>", started by the engine core and so inheriting its nice) goes back
    to the engine's base. Any other vLLM process is left alone."""
    if process_name.startswith("EngineCore"):
        os.environ.setdefault(_BASE_NICE_ENV, str(os.getpriority(os.PRIO_PROCESS, 0)))
        _nice_every_thread(int(os.environ[NICE_ENV]), "engine core")
    elif process_name.startswith("VllmWorker") and _BASE_NICE_ENV in os.environ:
        _nice_every_thread(int(os.environ[_BASE_NICE_ENV]), "worker")


def _nice_every_thread(nice: int, what: str) -> None:
    """Linux keeps a nice value per thread: set it on each thread of this process (those
    started later inherit it from the thread that starts them)."""
    try:
        for task in os.listdir("/proc/self/task"):
            os.setpriority(os.PRIO_PROCESS, int(task), nice)
    except PermissionError:
        logger.warning("pdserve: the %s could not take nice %d (raising a priority needs "
                       "CAP_SYS_NICE); it runs at %d", what, nice,
                       os.getpriority(os.PRIO_PROCESS, 0))
    except (OSError, ValueError):  # no /proc (not Linux): nothing to set
        pass
