"""The canary's evaluation command (thin shell): may the canary take the next step?

An operator's command (an argv list, or a string run by ``/bin/sh``) run before a promotion,
with ``PDSERVE_CANARY_VERSION``, ``PDSERVE_BASELINE_VERSION``, ``PDSERVE_CANARY_PERCENT`` and
``PDSERVE_NEXT_PERCENT`` in its environment. Exit status 0 allows the promotion; anything
else vetoes it, and so, failing safe, does a command that cannot start or runs past its
timeout (its process group is killed). The veto's reason carries the tail of its stderr
(else stdout). Why: docs/design.md, "Model versions: their own pools, sticky weighted
choice, a gate that steps".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_KEEP_BYTES = 16_384   # of each output stream: its tail is all a reason shows
_DRAIN_S = 1.0         # how long to wait for the rest of the output once the command ended
_REAP_S = 5.0          # how long to wait for a killed command to be reaped


@dataclass(frozen=True)
class EvalContext:
    canary_version: str
    baseline_version: str
    canary_percent: int
    next_percent: int

    def environment(self) -> dict[str, str]:
        return {
            "PDSERVE_CANARY_VERSION": self.canary_version,
            "PDSERVE_BASELINE_VERSION": self.baseline_version,
            "PDSERVE_CANARY_PERCENT": str(self.canary_percent),
            "PDSERVE_NEXT_PERCENT": str(self.next_percent),
        }


@dataclass(frozen=True)
class EvalResult:
    allow: bool
    reason: str
    returncode: int | None = None  # None: never started, or killed at the timeout

    @property
    def veto(self) -> bool:
        """What ``canary.decide`` takes as its ``veto``."""
        return not self.allow


async def evaluate(command: Sequence[str] | str, context: EvalContext, timeout_s: float, *,
                   env: Mapping[str, str] | None = None, tail_lines: int = 5,
                   max_reason_chars: int = 500) -> EvalResult:
    """Run the evaluation ``command`` for ``context``; allow only on exit status 0.

    ``env`` replaces the inherited environment (default: this process's); the context's
    variables are added to it. Cancelling the caller kills the command.
    """
    environment = {**(os.environ if env is None else env), **context.environment()}
    try:
        transport, run = await _start(command, environment)
    except (OSError, ValueError, TypeError) as exc:
        return EvalResult(False, _clip(f"evaluation command could not start: {exc}",
                                       max_reason_chars))
    try:
        exited = await _within(run.exited, timeout_s)
        if not exited:
            _kill_group(transport)
            await _within(run.exited, _REAP_S)
        await _within(run.output_ended, _DRAIN_S)
        returncode = transport.get_returncode() if exited else None
    finally:
        _kill_group(transport)  # only does something if the caller was cancelled meanwhile
        transport.close()
    tail = _tail(run.tails[2], tail_lines) or _tail(run.tails[1], tail_lines)
    return _result(returncode, timeout_s, tail, max_reason_chars)


def evaluate_sync(command: Sequence[str] | str, context: EvalContext, timeout_s: float,
                  **options) -> EvalResult:
    """``evaluate`` for callers without an event loop (the CLI, tests)."""
    return asyncio.run(evaluate(command, context, timeout_s, **options))


class _Run(asyncio.SubprocessProtocol):
    """One run of the command: the tail of each output stream, when the process exited and
    when its output ended. The two differ when something it spawned still holds a pipe, which
    is why this is not ``asyncio.subprocess.Process``: its ``wait()`` waits for the pipes too.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.exited: asyncio.Future[None] = loop.create_future()
        self.output_ended: asyncio.Future[None] = loop.create_future()
        self.tails = {1: b"", 2: b""}  # by file descriptor: stdout, stderr
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        # only the end is kept: memory stays bounded however much the command prints
        self.tails[fd] = (self.tails[fd] + data)[-_KEEP_BYTES:]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open and not self.output_ended.done():
            self.output_ended.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def _start(command: Sequence[str] | str, environment: Mapping[str, str]
                 ) -> tuple[asyncio.SubprocessTransport, _Run]:
    loop = asyncio.get_running_loop()
    # A session of its own makes the command a process-group leader, so a timeout kills what
    # it spawned as well (a shell's children would otherwise outlive it and hold its pipes).
    options = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   env=dict(environment), start_new_session=True)
    if isinstance(command, str):
        if not command.strip():
            raise ValueError("the command is empty")
        return await loop.subprocess_shell(lambda: _Run(loop), command, **options)
    if not command:
        raise ValueError("the command is empty")
    return await loop.subprocess_exec(lambda: _Run(loop), *command, **options)


async def _within(future: asyncio.Future[None], timeout_s: float) -> bool:
    """Whether ``future`` completes within ``timeout_s`` (it is not cancelled if not)."""
    try:
        await asyncio.wait_for(asyncio.shield(future), timeout_s)
        return True
    except TimeoutError:
        return False


def _kill_group(transport: asyncio.SubprocessTransport) -> None:
    """Kill the command and everything it spawned, while the command still runs.

    Only then: once it has been reaped its pid, the group's id, could be reused by an
    unrelated process. Background children of a command that exited on its own are left to
    their owner; the output drain does not wait for them.
    """
    if transport.get_returncode() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(transport.get_pid(), signal.SIGKILL)


def _tail(output: bytes, lines: int) -> str:
    kept = [line.strip() for line in output.decode(errors="replace").splitlines()]
    return " | ".join([line for line in kept if line][-lines:])


def _result(returncode: int | None, timeout_s: float, tail: str, limit: int) -> EvalResult:
    said = f": {tail}" if tail else ""
    if returncode is None:
        return EvalResult(False, _clip(f"evaluation timed out after {timeout_s:g}s{said}", limit))
    if returncode == 0:
        return EvalResult(True, _clip(f"evaluation passed{said}", limit), 0)
    how = (f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}")
    return EvalResult(False, _clip(f"evaluation vetoed ({how}){said}", limit), returncode)


def _clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, keeping the end: a failure's last words say the most."""
    return text if len(text) <= limit else text[: limit // 3] + " … " + text[-(limit * 2 // 3 - 3):]
