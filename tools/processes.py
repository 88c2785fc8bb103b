"""Starting and stopping whole servers as child processes (for the benchmark and tests).

``pdserve up`` and vLLM's own OpenAI server run in their own process groups with their
output in a log file; ``stop`` ends them the way a person would (SIGINT for pdserve, so it
shuts Ray down cleanly) and kills the group only if that fails. ``running`` is the whole
life of one: wait until it is ready, use it, stop it whatever happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from cluster.config import PDServeConfig
from cluster.engine.args import baseline_env, baseline_flags
from cluster.local_node import SERVING_BANNER
from kv_transfer.connector import Role


class ServerFailed(RuntimeError):
    """A server exited or did not become ready; the message ends with its log's tail."""


@dataclass
class ManagedServer:
    name: str
    process: subprocess.Popen
    log: Path
    base_url: str
    ready_line: str | None = None  # also wait for this in its output (not only health)
    health_path: str = "/health"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start(name: str, args: list[str], base_url: str, log_dir: Path, cwd: Path,
          env: dict[str, str] | None = None) -> ManagedServer:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    process = subprocess.Popen(
        args, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, **(env or {})},
        preexec_fn=_interruptible,
    )
    return ManagedServer(name, process, log, base_url)


def _interruptible() -> None:
    """In the child before exec: SIGINT back to its default action.

    A non-interactive shell starts a background job (``make test &``) with SIGINT ignored,
    and an ignored signal stays ignored across exec: ``stop``'s SIGINT would then be lost
    and every server would sit out the timeout before being killed.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_ready(server: ManagedServer, timeout_s: float = 420) -> None:
    """Until its health path answers 200 and, if the server has one, its ready line was
    printed.

    pdserve's router answers /health before ``serve.run`` has returned (other deployments
    may still be starting): until its banner, ``pdserve up`` is still starting, and a
    SIGINT then is an interrupted start (exit 130), not a shutdown.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerFailed(f"{server.name} exited with {server.process.returncode}; "
                               f"log {server.log}:\n{server.log_tail()}")
        if (_answers(server.base_url + server.health_path)
                and _printed(server, server.ready_line)):
            return
        time.sleep(2)
    raise ServerFailed(f"{server.name} not ready after {timeout_s:.0f}s; log {server.log}")


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _printed(server: ManagedServer, line: str | None) -> bool:
    if line is None:
        return True
    try:
        return line in server.log.read_text(errors="replace")
    except OSError:
        return False


def stop(server: ManagedServer, sig: int = signal.SIGINT, timeout_s: float = 120) -> int | None:
    """Signal the server and wait; kill its process group if it does not exit in time.

    Returns its exit status, or None if it had to be killed.
    """
    if server.process.poll() is not None:
        return server.process.returncode
    server.process.send_signal(sig)
    try:
        return server.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
        return None


@contextmanager
def running(server: ManagedServer) -> Iterator[ManagedServer]:
    """``server`` (just started) once it is ready; stopped on leaving, even on an error."""
    try:
        wait_ready(server)
        yield server
    finally:
        stop(server)


def start_pdserve(config_path: Path, config: PDServeConfig, log_dir: Path,
                  cwd: Path, name: str = "pdserve") -> ManagedServer:
    """``pdserve up`` with ``config_path`` as a child process; its log is ``name``'s."""
    base_url = f"http://{config.router.host}:{config.router.port}"
    args = [sys.executable, "-m", "cluster.cli", "up", "--config", str(config_path)]
    server = start(name, args, base_url, log_dir, cwd)
    server.ready_line = SERVING_BANNER
    return server


def frontend_flags(config: PDServeConfig) -> list[str]:
    """What pdserve's router sets in vLLM's OpenAI layer for the primary version
    (router/vllm_frontend.py), so that the baseline answers the same requests the same way."""
    flags = ["--enable-prompt-tokens-details"]
    parser = config.versions[config.model.version].tool_parser
    if parser is not None:
        flags += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    return flags  # the reasoning parser is an engine argument: in the baseline's flags


def start_vllm_server(config: PDServeConfig, port: int, log_dir: Path, cwd: Path, *,
                      name: str = "vllm", role: Role = "decode",
                      cpu_bind: str | None = None, extra_flags: tuple[str, ...] = (),
                      extra_env: dict[str, str] | None = None) -> ManagedServer:
    """vLLM's own OpenAI server: one colocated engine with the ``role`` pool's engine
    settings (cluster.engine.args: ``baseline_flags``, ``baseline_env``), on the cores
    ``cpu_bind`` names (None: unbound).

    The decode pool is the default stand-in: like a colocated engine, a decode engine
    also prefills (the prompts pdserve does not disaggregate). ``extra_flags`` and
    ``extra_env`` add to the pool's (a KV connector's config, say).
    """
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            *baseline_flags(config, role), *extra_flags, *frontend_flags(config),
            "--host", "127.0.0.1", "--port", str(port)]
    env = {**(extra_env or {}), **baseline_env(config, role, cpu_bind)}
    return start(name, args, f"http://127.0.0.1:{port}", log_dir, cwd, env)
