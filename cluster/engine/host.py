"""Hosts one vLLM ``AsyncLLM`` inside a Ray Serve replica (the shell around the engine).

Both pools use it: the prefill deployment as NIXL KV producer, the decode deployment as
KV consumer. It applies the pure decisions of ``engine_config`` (arguments, environment,
side-channel port), converts pdserve messages to vLLM objects, and keeps
``EngineStats`` current through vLLM's stat-logger interface (``stats_logger``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from cluster import metrics as m
from cluster.config import PDServeConfig
from cluster.engine.args import engine_env, engine_kwargs
from cluster.engine.callers import CallerWatch
from cluster.engine.cpu_check import check_engine
from cluster.engine.death import death_cause
from cluster.engine.load_report import LoadReporter
from cluster.engine.messages import EngineCrashed, EngineRequest
from cluster.engine.process_tree import (
    engine_processes,
    first_free_ports,
    kill_running,
    kill_tree,
    listener_of,
    outlived,
    record_tree,
)
from cluster.engine.stall import StepWatch, is_stalled
from cluster.engine.stats import EngineStats
from cluster.engine.stats_logger import publish_gauges, stats_logger_factory, vllm_metrics_logger
from cluster.recorder import Counts, Recorder
from kv_transfer.connector import Role, connector_config, engine_id_for

logger = logging.getLogger(__name__)

STALL_RECHECK_S = 1.0  # a stall seen by the health check is confirmed this much later
# How long a dead engine's processes are given to exit before its death is classified: one
# that died of its own error exits just after telling its client (cluster/engine/death.py).
DEATH_EXIT_WAIT_S = 2.0
# How long a starting replica waits for its side-channel port to be let go by whatever
# held it (its predecessor's processes, being stopped) before it fails with the reason.
PORT_FREE_WAIT_S = 60.0
SHUTDOWN_GRACE_S = 10.0  # how long a shut-down engine's processes are given to end


class EngineHost:
    """One running vLLM engine plus its statistics."""

    def __init__(self, engine: Any, stats: EngineStats,
                 recorder: Recorder | None = None, tags: dict[str, str] | None = None,
                 counts: Counts | None = None, steps: StepWatch | None = None,
                 stall_timeout_s: float | None = None):
        self._engine = engine
        self.stats = stats
        self._steps = steps or StepWatch()
        self._stall_timeout_s = stall_timeout_s
        self._hung_killed = False
        # The engine's processes as they run once it is up: what outlives its death is
        # killed (cluster/engine/process_tree.py).
        self._tree = record_tree(engine)
        self._leftovers_killed = False
        self._in_flight = 0  # requests handed to the engine and not ended
        # Once the engine died: how many requests it held, and whether of its own error.
        self._death: tuple[int, asyncio.Future[bool]] | None = None
        self.load = LoadReporter(stats.role)
        self._stop = threading.Event()
        self._callers = CallerWatch(lambda request_id: self._engine.abort(request_id))
        self._recorder, self._tags = recorder, tags
        self._counts = counts or Counts()
        if recorder is not None and tags is not None:
            threading.Thread(target=self._publish, args=(recorder, tags),
                             name="pdserve-gauges", daemon=True).start()

    def _publish(self, recorder: Recorder, tags: dict[str, str]) -> None:
        """The engine's gauges and the counts its steps gathered, every ENGINE_PUBLISH_S.
        A failed round is logged and the next one tried: the counts must not pile up."""
        while not self._stop.wait(m.ENGINE_PUBLISH_S):
            try:
                self._counts.flush(recorder)
                publish_gauges(recorder, tags, self.stats)
            except Exception:
                logger.exception("publishing the engine's metrics failed; trying again")
        self._counts.flush(recorder)

    @classmethod
    def start(
        cls,
        config: PDServeConfig,
        role: Role,
        *,
        replica_id: str,
        side_channel_host: str,
        side_channel_ports: Sequence[int],
        version: str,
    ) -> EngineHost:
        """Start an engine of ``role`` serving ``version``, listening for NIXL peers on the
        first of ``side_channel_ports`` that is free (the replica's own, unless a live
        engine holds it). Blocks until it is ready (tens of seconds)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        # This node's CPU, not the head's: machines differ (AVX2 only, AVX-512, AMX).
        check_engine(config, role, version)
        pool = config.pool(version, role)
        side_channel_port = first_free_ports(side_channel_host, side_channel_ports,
                                             pool.tensor_parallel_size, PORT_FREE_WAIT_S)
        if side_channel_port != side_channel_ports[0]:
            logger.warning("%s replica %s: its side-channel port %d is held (%s); its engine "
                           "listens on %d", role, replica_id, side_channel_ports[0],
                           listener_of(side_channel_ports[0]), side_channel_port)
        # The engine core runs in child processes that read these at their start.
        os.environ.update(
            engine_env(config, role, side_channel_host, side_channel_port, version))
        engine_id = engine_id_for(role, replica_id, side_channel_host, side_channel_port)
        kv_config = connector_config(
            role,
            engine_id,
            connector=config.kv_transfer.connector,
            buffer_device=config.kv_transfer.buffer_device,
            backends=config.kv_transfer.backends,
            load_failure_policy=config.kv_transfer.load_failure_policy,
            lease_s=config.kv_transfer.lease_s,
        )
        args = AsyncEngineArgs(**engine_kwargs(config, role, kv_config, version))
        stats = EngineStats(role=role, engine_id=engine_id)
        tags = {"version": version, "pool": role, "replica": engine_id}
        recorder, counts, steps = Recorder(), Counts(), StepWatch()
        engine = AsyncLLM.from_engine_args(
            args, stat_loggers=[stats_logger_factory(stats, recorder, counts, tags, steps),
                                vllm_metrics_logger(config.engine.vllm_metrics)]
        )
        logger.info("%s engine %s ready, NIXL side channel %s:%d",
                    role, engine_id, side_channel_host, side_channel_port)
        return cls(engine, stats, recorder, tags, counts, steps,
                   stall_timeout_s=config.engine.stall_timeout_s)

    async def generate(
        self, request: EngineRequest, params: Any,
    ) -> AsyncIterator[Any]:
        """Run ``request`` with ``params`` (vLLM ``SamplingParams``, which each pool builds:
        prefill/params.py, decode/params.py) and yield its ``RequestOutput``s. A prefill
        pass's token is discarded: only a decode engine's structured outputs are told where
        reasoning ended.

        Cancelling the consumer (a client that went away) aborts the request in the engine:
        vLLM's ``generate`` aborts on ``CancelledError``/``GeneratorExit``. A consumer that
        died (its router replica killed) cannot cancel: the caller watch aborts it.
        """
        from vllm.exceptions import VLLMClientError
        from vllm.inputs.engine import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError

        if self.engine_dead:
            # Arrived once its engine was dead: not one of the requests the engine died
            # holding, so never blamed for (nor counted in) a death it cannot have caused;
            # the router retries it elsewhere as after a kill.
            raise EngineDeadError()
        # Already rendered, as vLLM's own server hands it over: AsyncLLM then queues it at
        # once. A raw TokensPrompt would first be rendered on a thread of AsyncLLM's pool,
        # a thread hop each way on every request (tools/experiments/engine_round_trip.py).
        prompt = tokens_input(list(request.prompt_token_ids), cache_salt=request.cache_salt)
        # Only the engine that samples the answer applies structured outputs after reasoning.
        reasoning = {} if self.stats.role == "prefill" else {
            "reasoning_ended": request.reasoning_ended,
            "reasoning_parser_kwargs": request.reasoning_parser_kwargs,
        }
        # Until its first output a request's prompt is queued or being prefilled: the load
        # the prefill pool's router balances on (cluster.engine.routing_stats).
        prompt_tokens = len(request.prompt_token_ids)
        self.stats.queued_prefill_tokens += prompt_tokens
        queued = True
        last = called = time.monotonic()
        self._steps.submitted(called)
        self._callers.track(request.request_id, request.caller)
        self._in_flight += 1
        try:
            async for output in self._engine.generate(prompt, params, request.request_id,
                                                      **reasoning):
                now = time.monotonic()
                if queued:
                    self.stats.queued_prefill_tokens -= prompt_tokens
                    queued = False
                    self._observe_hops(output.metrics, called, now)
                    if self.stats.role == "prefill":  # this pool's share of TTFT
                        self.load.latency.observe(now, now - last)
                elif self.stats.role == "decode":
                    new_tokens = len(output.outputs[0].token_ids) if output.outputs else 0
                    if new_tokens:  # tokens that arrive together share the gap
                        self.load.latency.observe(now, (now - last) / new_tokens)
                last = now
                yield output
        except VLLMClientError:
            if queued:  # refused by the engine's input processor: it never held the request
                self._steps.refused()
            raise
        except EngineDeadError as error:
            held = await self._crashed_holding()
            if held is None:
                raise
            raise EngineCrashed(request.request_id, held) from error
        finally:
            self._in_flight -= 1
            self._callers.untrack(request.request_id)
            if queued:
                self.stats.queued_prefill_tokens -= prompt_tokens

    async def _crashed_holding(self) -> int | None:
        """The engine is dead: how many requests it held if it died of an error of its
        own, None if a signal killed it (cluster/engine/death.py). Decided once, when the
        first of its requests sees the death (the count is taken then, before any of them
        has left)."""
        crashed = self._judging_death()
        return self._death[0] if await asyncio.shield(crashed) else None

    def _judging_death(self) -> asyncio.Future[bool]:
        """The judgement of the engine's death (``_died_of_own_error``), started by
        whichever comes first: a request that sees it or the health check."""
        if self._death is None:
            self._death = (self._in_flight,
                           asyncio.ensure_future(self._died_of_own_error()))
        return self._death[1]

    async def _died_of_own_error(self) -> bool:
        processes = engine_processes(self._engine)
        deadline = time.monotonic() + DEATH_EXIT_WAIT_S
        while (any(process.exitcode is None for process in processes)
               and time.monotonic() < deadline):
            await asyncio.sleep(0.05)
        cause = death_cause([process.exitcode for process in processes], self._hung_killed)
        self._kill_leftovers()
        if cause == "crashed":
            logger.error("%s engine %s died of an error of its own with %d request(s) in "
                         "it", self.stats.role, self.stats.engine_id, self._death[0])
        return cause == "crashed"

    def _observe_hops(self, metrics: Any, called: float, received: float) -> None:
        """A request's way from this replica to its engine core and its first output's way
        back: ``metrics`` is vLLM's ``RequestStateStats``, stamped by the engine core with
        ``time.monotonic`` as ``called`` and ``received`` are (one clock for the host's
        processes, and the engine core runs on this replica's host).

        The way back is timed from the engine output that carried the output's last token
        (``last_token_ts``): the first token for a stream's first delta, the last one for an
        answer sent in one piece (a unary request, the prefill pass).
        """
        if metrics is None or not metrics.queued_ts or not metrics.last_token_ts:
            return  # an output that came before the engine saw the request (an abort)
        if self._recorder is None or self._tags is None:
            return  # nothing would flush them
        self._counts.observe(m.ENGINE_PHASE, {**self._tags, "phase": "to_engine"},
                             max(0.0, metrics.queued_ts - called))
        self._counts.observe(m.ENGINE_PHASE, {**self._tags, "phase": "from_engine"},
                             max(0.0, received - metrics.last_token_ts))

    async def wait_released(self, timeout_s: float, poll_s: float = 0.2) -> bool:
        """Wait until the engine holds no KV block and queues nothing (a prefill engine's
        blocks are held until decode engines have pulled them); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.stats.kv_cache_usage > 0 or self.stats.queued_prefill_tokens > 0:
            if self.engine_dead:  # its figures are frozen, and nothing can pull its blocks
                return False
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    @property
    def max_num_seqs(self) -> int:
        return self._engine.vllm_config.scheduler_config.max_num_seqs

    @property
    def engine_dead(self) -> bool:
        """The engine's core process died; this replica cannot serve until replaced."""
        return self._engine.errored

    async def abort(self, request_id: str) -> None:
        await self._engine.abort(request_id)

    async def check_health(self) -> None:
        """vLLM's check (the engine core died), and a hung engine: one that holds requests
        and has not stepped for ``engine.stall_timeout_s`` has its processes killed, so
        that its requests fail over at once and Serve replaces the replica. A dead
        engine's death is judged and its leftover processes killed first."""
        if self.engine_dead:
            # Judged first (its processes' exit statuses read: at most DEATH_EXIT_WAIT_S),
            # then its leftovers killed: a core still exiting with its error, killed here,
            # would read as killed from outside and its request be retried elsewhere.
            await asyncio.shield(self._judging_death())
        if self._hung_killed:
            await self._engine.check_health()  # vLLM's monitor may not have seen it yet
            raise RuntimeError("engine hung and killed; waiting to be replaced")
        if self._stall_past_limit_s() is not None:
            # Checked again after a moment: a replica that was itself paused (stopped,
            # swapped out) has the engine's reports of the meantime still to read.
            await asyncio.sleep(STALL_RECHECK_S)
            if (stalled_s := self._stall_past_limit_s()) is not None:
                self._hung_killed = True
                killed = kill_tree(self._engine, self._tree)
                logger.error("%s engine %s has held requests for %.0f s without a step: "
                             "taken for hung, its processes %s killed", self.stats.role,
                             self.stats.engine_id, stalled_s, killed)
                raise RuntimeError(f"engine hung: no step for {stalled_s:.0f} s with "
                                   f"requests in it; its processes {killed} were killed")
        await self._engine.check_health()

    def stalled_s(self) -> float:
        """Seconds the engine has held requests without a step (0: stepping or idle)."""
        return self._steps.stalled_s(time.monotonic())

    def _stall_past_limit_s(self) -> float | None:
        """``stalled_s()`` once it reached ``engine.stall_timeout_s``, else None."""
        stalled_s = self.stalled_s()
        return stalled_s if is_stalled(stalled_s, self._stall_timeout_s) else None

    async def reject_transfer(self, request_id: str, kv_transfer_params: dict) -> None:
        """Tell the prefill engine behind ``kv_transfer_params`` that nobody will pull
        them, so it frees their blocks now instead of when their lease expires."""
        await self._engine.notify_kv_transfer_request_rejected(request_id, kv_transfer_params)

    async def give_up_late_handle(self, request_id: str, kv_transfer_params: dict, *,
                                  release: bool) -> None:
        """A handle that came past its claim deadline (kv_transfer/handle.py): counted,
        logged, and with ``release`` (its lease may still run) its blocks released; the
        caller prefills the prompt instead."""
        logger.warning("request %s: its KV handle came past its claim deadline; prefilling "
                       "the prompt here instead of pulling blocks that may be reused",
                       request_id)
        self.stats.kv_handles_late += 1
        if self._recorder is not None and self._tags is not None:
            self._recorder.inc(m.KV_HANDLES_LATE, self._tags, 1)
        if not release:
            return
        try:
            await self.reject_transfer(f"{request_id}-late", kv_transfer_params)
        except Exception:  # the prefill engine may be gone: its blocks went with it
            logger.warning("request %s: releasing the late handle failed", request_id,
                           exc_info=True)

    def _kill_leftovers(self) -> None:
        """Kill what still runs of the dead engine's recorded processes (a worker that
        outlived its core holds the side-channel port the replacement replica needs)."""
        if self._leftovers_killed:
            return
        self._leftovers_killed = True
        if killed := kill_running(self._tree):
            logger.warning("%s engine %s is dead; its leftover processes %s were killed",
                           self.stats.role, self.stats.engine_id, killed)

    def shutdown(self) -> None:
        self._stop.set()
        self._engine.shutdown()
        # vLLM's shutdown asks its processes to end; what has not within the grace is killed.
        if killed := kill_running(outlived(self._tree, SHUTDOWN_GRACE_S)):
            logger.warning("%s engine %s shut down; its processes %s still ran and were "
                           "killed", self.stats.role, self.stats.engine_id, killed)

