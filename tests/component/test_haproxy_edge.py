"""``pdserve-haproxy`` in front of the real HAProxy binary that Ray Serve bundles: the
gateway errors HAProxy answers on its own come out as pdserve's JSON 503 with
``Retry-After``, not the plain-text 500 Ray writes, when the server under a request is
killed (502) and when none is left to take one (503).

HAProxy runs as Ray 2.60 starts it (``-db -f CONFIG``), with a config of the same shape as
Ray's where it matters: ``errorfile`` 502/503/504 naming one page in the config's folder,
written first with Ray's text, ``http-reuse always``, retries on connection failures only.
The upstream is a real keep-alive HTTP/1.1 server process, killed with SIGKILL.

What HAProxy answers for a killed server depends on the connection the request rode: a new
one gets the 502 (pdserve's page); an idle one HAProxy reused gets no answer at all, the
client's connection is closed, as a server closing an idle keep-alive connection would.
Both are pinned here, as Ray configures HAProxy.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.serve_env import HAPROXY_BINARY_ENV, HAPROXY_COMMAND
from router.haproxy_edge import error_page
from router.proxy_edge import LOST_REPLICA_RETRY_AFTER_S

RAY_PAGE = ("HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
            "Content-Length: 21\r\n\r\nInternal Server Error")
# An upstream that answers /ok and, on /hang, says so on stdout and never answers.
UPSTREAM = """
import http.server, sys, threading
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Serve's replicas: HAProxy reuses it
    def do_GET(self):
        if self.path == "/hang":
            print("hanging", flush=True)
            threading.Event().wait()  # never answers: the test kills this process
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
CONFIG = """global
    maxconn 100
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    option redispatch 1
    retry-on conn-failure
    retries 2
    errorfile 502 {page}
    errorfile 503 {page}
    errorfile 504 {page}
frontend http_frontend
    bind 127.0.0.1:{port}
    default_backend router
backend router
    http-reuse always
    server replica 127.0.0.1:{upstream}
"""
DEADLINE_S = 30


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {DEADLINE_S} s")


def _get(port: int, path: str) -> tuple[int, http.client.HTTPMessage, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen, Path, subprocess.Popen]]:
    """(HAProxy's port, the upstream process, the error page, HAProxy's process)."""
    command = Path(sys.executable).with_name(HAPROXY_COMMAND)
    assert command.is_file(), f"{command}: pdserve is installed with its commands"
    port, upstream_port = _free_port(), _free_port()
    page = tmp_path / "500.http"
    page.write_text(RAY_PAGE)
    config = tmp_path / "haproxy.cfg"
    config.write_text(CONFIG.format(page=page, port=port, upstream=upstream_port))
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(upstream_port)],
                                stdout=subprocess.PIPE, text=True)
    # started as Ray starts it: with the variable that names this command in its environment
    haproxy = subprocess.Popen([str(command), "-db", "-f", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, HAPROXY_BINARY_ENV: str(command)})
    try:
        _wait_for_port(upstream_port, upstream)
        _wait_for_port(port, haproxy)
        yield port, upstream, page, haproxy
    finally:
        _stop(haproxy)
        _stop(upstream)


def _assert_pdserve_answer(status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
    """(Header names are matched regardless of case: HAProxy sends them in lower case.)"""
    assert status == 503, body
    assert headers["Retry-After"] == str(LOST_REPLICA_RETRY_AFTER_S)
    assert headers["Content-Type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["type"] == error["code"] == "service_unavailable"
    assert "send the request again" in error["message"]


def _kill_under_a_request(port: int, upstream: subprocess.Popen) -> http.client.HTTPConnection:
    """A request that hangs in the upstream, which is then SIGKILLed; its connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE_S)
    connection.request("GET", "/hang")
    reached, _, _ = select.select([upstream.stdout], [], [], DEADLINE_S)
    assert reached, f"the request did not reach the upstream in {DEADLINE_S} s"
    assert upstream.stdout.readline().strip() == "hanging"
    upstream.send_signal(signal.SIGKILL)
    upstream.wait(timeout=DEADLINE_S)
    return connection


def test_haproxy_answers_a_killed_or_missing_upstream_with_pdserves_json_503(edge):
    port, upstream, page, haproxy = edge
    # the command became HAProxy itself (Ray signals the process it started) ...
    assert Path(f"/proc/{haproxy.pid}/comm").read_text().strip() == "haproxy"
    # ... after writing pdserve's page over Ray's
    assert page.read_bytes() == error_page()

    # the upstream killed under the first request, on a new connection: HAProxy's 502
    connection = _kill_under_a_request(port, upstream)
    response = connection.getresponse()
    _assert_pdserve_answer(response.status, response.headers, response.read())
    connection.close()

    # nothing left to send to: HAProxy's 503 after its retries
    _assert_pdserve_answer(*_get(port, "/ok"))


def test_a_request_on_a_reused_connection_to_a_killed_upstream_is_closed_unanswered(edge):
    port, upstream, _, _ = edge
    assert _get(port, "/ok")[:1] == (200,)  # passes through; HAProxy keeps the connection
    connection = _kill_under_a_request(port, upstream)  # rides the kept connection
    with pytest.raises(http.client.RemoteDisconnected):
        connection.getresponse()
    connection.close()
    _assert_pdserve_answer(*_get(port, "/ok"))  # the next request: the 503 page again


# ---- where `pdserve up` finds the command -----------------------------------------------


def _config_with_ingress(ingress: str):
    from cluster.config import parse_config

    return parse_config({"model": {"name": "m", "path": "/m"}, "router": {"ingress": ingress}})


def test_pdserve_up_starts_haproxy_through_the_command_beside_its_interpreter(
        tmp_path, monkeypatch, capsys):
    from cluster import cli

    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    command = tmp_path / HAPROXY_COMMAND
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    assert cli._haproxy_command(_config_with_ingress("haproxy")) == str(command)
    assert cli._haproxy_command(_config_with_ingress("proxy")) is None
    assert capsys.readouterr().err == ""


def test_without_the_command_pdserve_up_says_haproxy_keeps_rays_page(
        tmp_path, monkeypatch, capsys):
    """Installed without its console scripts (or with one that cannot run), pdserve still
    starts, and says what the cluster then lacks."""
    from cluster import cli

    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert cli._haproxy_command(_config_with_ingress("haproxy")) is None
    (tmp_path / HAPROXY_COMMAND).write_text("not executable")
    assert cli._haproxy_command(_config_with_ingress("haproxy")) is None
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 2
    assert all(f"{tmp_path / HAPROXY_COMMAND} is missing or not executable" in line
               and "Ray's plain-text 500" in line for line in warnings)
