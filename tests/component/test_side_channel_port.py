"""A replica waits for its NIXL side-channel port before it starts its engine
(cluster/engine/process_tree.py, ``first_free_ports``): a port still held past the wait
fails the start at once, naming the holder, instead of an engine whose worker cannot bind
and whose start never ends."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from cluster.engine.process_tree import first_free_ports


def _listener() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def test_a_free_port_is_taken_at_once():
    with _listener() as listener:
        port = listener.getsockname()[1]
    assert first_free_ports("127.0.0.1", [port], 1, timeout_s=0) == port


def test_a_port_still_held_fails_the_start_naming_its_holder():
    with _listener() as listener:
        port = listener.getsockname()[1]
        with pytest.raises(RuntimeError, match=rf"port {port} .* held by") as refused:
            first_free_ports("127.0.0.1", [port], 1, timeout_s=0.3, poll_s=0.05)
    # named by pid where this user may list sockets (psutil); "another process" elsewhere
    assert f"pid {os.getpid()}" in str(refused.value) or "another process" in str(refused.value)


def test_a_port_let_go_within_the_wait_is_taken():
    listener = _listener()
    port = listener.getsockname()[1]
    threading.Timer(0.3, listener.close).start()
    assert first_free_ports("127.0.0.1", [port], 1, timeout_s=10, poll_s=0.05) == port


def test_a_replica_whose_own_port_a_live_engine_holds_takes_the_next_free_one():
    """A running replica whose rank Serve reassigned keeps listening where it started; a
    replica given that rank later takes another of its pool's ports at once (it waited
    out the port for 60 s before, failed, and Serve started it again)."""
    with _listener() as held, _listener() as spare:
        own = held.getsockname()[1]
        free = spare.getsockname()[1]
        spare.close()  # a port known to be free
        assert first_free_ports("127.0.0.1", [own, free], 1, timeout_s=0) == free


def test_a_pool_with_every_port_held_fails_the_start_naming_the_holder():
    with _listener() as first, _listener() as second:
        ports = [first.getsockname()[1], second.getsockname()[1]]
        with pytest.raises(RuntimeError, match=rf"port {ports[0]} .* held by .* no other"):
            first_free_ports("127.0.0.1", ports, 1, timeout_s=0.2, poll_s=0.05)
