"""kv_transfer/shared_kv.py on real memory: a KV cache allocated as a memfd, published in
an agent's metadata, and mapped by another process, which reads the owner's bytes. (The
NIXL agent subclass itself is exercised by `bench transfer`'s shm path on two real agents,
tests/component/test_bench_transfer.py, and on the engines by test_placement.)"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kv_transfer import shared_kv
from kv_transfer.shared_kv import (
    PeerMemory,
    SharedKvAllocation,
    host_identity,
    split_trailer,
    with_trailer,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs Linux memfd")

SIZE = 1 << 20


def _own_shared_memory(conn) -> None:
    """A child that allocates its KV as vLLM would inside the context, fills it, sends
    its trailer and waits until told to go."""
    with SharedKvAllocation():
        cache = torch.zeros(SIZE, dtype=torch.int8, device="cpu")
    cache.copy_(torch.arange(SIZE, dtype=torch.int64).remainder(127).to(torch.int8))
    _, info = split_trailer(with_trailer(b"nixl-metadata"))
    conn.send(info)
    conn.recv()


@pytest.fixture
def owner():
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_own_shared_memory, args=(child,), daemon=True)
    process.start()
    assert parent.poll(60), "the owner process did not start"
    yield parent.recv(), process
    parent.send("stop")
    process.join(10)
    if process.is_alive():
        process.kill()


def test_only_the_caches_int8_buffer_is_allocated_in_shared_memory():
    before = len(shared_kv._exported)
    with SharedKvAllocation():
        floats = torch.zeros(16, dtype=torch.float32)
        cache = torch.zeros(4096, dtype=torch.int8, device=torch.device("cpu"))
    assert len(shared_kv._exported) == before + 1
    published = shared_kv._exported[-1]
    assert (published["addr"], published["size"]) == (cache.data_ptr(), 4096)
    assert floats.data_ptr() != published["addr"]
    assert not cache.any()  # zeroed, as torch.zeros promises
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines()
              if shared_kv.MEMFD_NAME in line]
    assert any(line.split()[1] == "rw-s" for line in mapped), mapped


def test_the_trailer_rides_on_nixls_metadata_and_comes_off_whole():
    assert split_trailer(b"only nixl's") == (b"only nixl's", None)
    with SharedKvAllocation():
        torch.zeros(4096, dtype=torch.int8)
    metadata, info = split_trailer(with_trailer(b"nixl\x00bytes"))
    assert metadata == b"nixl\x00bytes"
    assert info["pid"] == os.getpid() and info["host"] == host_identity()
    assert info["segments"][-1]["size"] == 4096


def test_another_process_maps_the_owners_cache_and_reads_its_bytes(owner):
    info, _ = owner
    peer = PeerMemory.open(info)
    try:
        [segment] = info["segments"]
        mapped = peer.segments.local_addresses(np.array([segment["addr"]], dtype=np.int64),
                                               np.array([SIZE], dtype=np.int64))
        local = torch.empty(SIZE, dtype=torch.int8)
        ctypes.memmove(local.data_ptr(), int(mapped[0]), SIZE)
        expected = torch.arange(SIZE, dtype=torch.int64).remainder(127).to(torch.int8)
        assert torch.equal(local, expected)
    finally:
        peer.close()


def test_a_peer_that_cannot_be_mapped_is_refused_with_a_reason(owner):
    info, process = owner
    with pytest.raises(ValueError, match="another host"):
        PeerMemory.open({**info, "host": "another-boot/pid:[1]"})
    wrong_inode = [{**segment, "inode": segment["inode"] + 1} for segment in info["segments"]]
    with pytest.raises(ValueError, match="not the KV memory"):
        PeerMemory.open({**info, "segments": wrong_inode})
    process.kill()
    process.join(10)
    with pytest.raises(OSError):  # its /proc/<pid>/fd is gone with it
        PeerMemory.open(info)

