"""The NIXL agent subclass of kv_transfer/shared_kv.py: which READs it does by copying,
which it leaves to NIXL, and what the prefill engine is told.

NIXL's agent is replaced by a recording stand-in (the subclass only calls its public
methods), the memory is real: the "peer" is a memfd of this process, published and
mapped as a prefill engine's cache is, so the copies move real bytes. Two real agents in
two processes are exercised by tests/component/test_bench_transfer.py.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from kv_transfer import shared_kv
from kv_transfer.shared_kv import (
    TRAILER_MAGIC,
    SharedKvAllocation,
    SharedRead,
    shared_memory_agent,
    split_trailer,
)
from tests.component.test_shared_kv import owner  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs Linux memfd")

BLOCK = 4096
BLOCKS = 16


class RecordingAgent:
    """The part of NIXL's ``nixl_agent`` the subclass calls; records what reaches NIXL."""

    def __init__(self, name, config=None):
        self.name = name
        self.nixl_reads: list[tuple] = []
        self.notifs: list[tuple[str, bytes]] = []
        self.fail_notifs = False
        self.removed: list[str] = []

    def get_agent_metadata(self) -> bytes:
        return b"nixl:" + self.name.encode()

    def add_remote_agent(self, metadata: bytes) -> str:
        return metadata.decode().removeprefix("nixl:")

    def remove_remote_agent(self, agent: str):
        self.removed.append(agent)

    def get_xfer_descs(self, descs, mem_type=None):
        return ("dlist", id(descs))

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=()):
        self.get_xfer_descs(xfer_list, mem_type)  # as NIXL's own does
        return object()

    def release_dlist_handle(self, handle):
        return None

    def make_prepped_xfer(self, operation, local_side, local_indices, remote_side,
                          remote_indices, notif_msg=b"", backends=(), skip_desc_merge=False):
        self.nixl_reads.append((operation, list(local_indices), list(remote_indices)))
        return ("nixl-handle", len(self.nixl_reads))

    def transfer(self, handle, notif_msg=b""):
        return "PROC"

    def check_xfer_state(self, handle):
        return "DONE"

    def get_xfer_telemetry(self, handle):
        return "nixl-telemetry"

    def release_xfer_handle(self, handle):
        return None

    def get_new_notifs(self):
        return {}

    def send_notif(self, agent, notif_msg):
        if self.fail_notifs:
            raise RuntimeError("peer gone")
        self.notifs.append((agent, notif_msg))


Agent = shared_memory_agent(RecordingAgent)


def rows(tensor: torch.Tensor) -> np.ndarray:
    return np.array([(tensor[i].data_ptr(), BLOCK, 0) for i in range(tensor.shape[0])],
                    dtype=np.uint64)


@pytest.fixture
def cache():
    """A prefill engine's cache: shared memory, filled with a known pattern."""
    with SharedKvAllocation():
        buffer = torch.zeros(BLOCKS * BLOCK, dtype=torch.int8)
    blocks = buffer.view(torch.uint8).view(BLOCKS, BLOCK)
    blocks.copy_(torch.arange(BLOCKS, dtype=torch.uint8).unsqueeze(1).expand(BLOCKS, BLOCK))
    return blocks


def reader_of(owner_metadata: bytes):
    """A decode engine's agent that has done the handshake with the owner; its local
    blocks and the two prepared descriptor lists, made as vLLM makes them."""
    reader = Agent("decode")
    peer = reader.add_remote_agent(owner_metadata)
    local = torch.zeros(BLOCKS, BLOCK, dtype=torch.uint8)
    local_side = reader.prep_xfer_dlist("NIXL_INIT_AGENT",
                                        reader.get_xfer_descs(rows(local), "DRAM"))
    return reader, peer, local, local_side


def test_a_read_from_a_mapped_peer_is_a_copy_then_the_reads_notification(cache):
    prefill = Agent("prefill")
    reader, peer, local, local_side = reader_of(prefill.get_agent_metadata())
    remote_side = reader.prep_xfer_dlist(peer, reader.get_xfer_descs(rows(cache), "DRAM"))
    handle = reader.make_prepped_xfer("READ", local_side, np.array([0, 1, 5]),
                                      remote_side, np.array([3, 4, 9]), notif_msg=b"req-1:1")
    assert isinstance(handle, SharedRead) and reader.nixl_reads == []
    assert not local.any()  # nothing moves before transfer()
    assert reader.transfer(handle) == "DONE" == reader.check_xfer_state(handle)
    assert [int(local[i, 0]) for i in (0, 1, 5)] == [3, 4, 9]
    assert torch.equal(local[[0, 1, 5]], cache[[3, 4, 9]])
    assert not local[[2, 3, 4, 6]].any()  # only the blocks asked for
    assert reader.notifs == [(peer, b"req-1:1")]  # the prefill engine frees its blocks
    telemetry = reader.get_xfer_telemetry(handle)
    assert (telemetry.totalBytes, telemetry.descCount) == (3 * BLOCK, 2)  # 0,1 merged


def test_the_trailer_never_reaches_nixl(cache):
    prefill = Agent("prefill")
    metadata = prefill.get_agent_metadata()
    nixls, info = split_trailer(metadata)
    assert nixls == b"nixl:prefill" and info is not None
    assert RecordingAgent("x").add_remote_agent(nixls) == "prefill"


def test_reads_it_cannot_copy_go_to_nixl_unchanged(cache):
    prefill = Agent("prefill")
    reader, peer, _local, local_side = reader_of(prefill.get_agent_metadata())
    remote_side = reader.prep_xfer_dlist(peer, reader.get_xfer_descs(rows(cache), "DRAM"))
    write = reader.make_prepped_xfer("WRITE", local_side, [0], remote_side, [0])
    elsewhere = rows(torch.zeros(2, BLOCK, dtype=torch.uint8))  # not the mapped cache
    other_side = reader.prep_xfer_dlist(peer, reader.get_xfer_descs(elsewhere, "DRAM"))
    outside = reader.make_prepped_xfer("READ", local_side, [0], other_side, [1])
    assert not isinstance(write, SharedRead) and not isinstance(outside, SharedRead)
    assert reader.nixl_reads == [("WRITE", [0], [0]), ("READ", [0], [1])]
    assert reader.transfer(outside) == "PROC"  # NIXL's own answer


def test_a_peer_on_another_host_is_read_over_nixl(cache):
    prefill = Agent("prefill")
    nixls, info = split_trailer(prefill.get_agent_metadata())
    moved = {**info, "host": "another-boot/pid:[4026531836]"}
    reader, peer, _local, local_side = reader_of(
        nixls + TRAILER_MAGIC + json.dumps(moved).encode())
    remote_side = reader.prep_xfer_dlist(peer, reader.get_xfer_descs(rows(cache), "DRAM"))
    handle = reader.make_prepped_xfer("READ", local_side, [0], remote_side, [0])
    assert not isinstance(handle, SharedRead) and len(reader.nixl_reads) == 1


def test_a_lost_notification_keeps_the_copied_kv(cache):
    prefill = Agent("prefill")
    reader, peer, local, local_side = reader_of(prefill.get_agent_metadata())
    remote_side = reader.prep_xfer_dlist(peer, reader.get_xfer_descs(rows(cache), "DRAM"))
    reader.fail_notifs = True
    handle = reader.make_prepped_xfer("READ", local_side, [2], remote_side, [7],
                                      notif_msg=b"req-2:1")
    assert reader.transfer(handle) == "DONE"
    assert torch.equal(local[2], cache[7])


def test_dropping_a_peer_unmaps_it_and_its_reads_go_to_nixl(cache):
    prefill = Agent("prefill")
    metadata = prefill.get_agent_metadata()
    published = len(split_trailer(metadata)[1]["segments"])  # every cache this process made
    mapped_before = read_only_kv_mappings()
    reader, peer, local, local_side = reader_of(metadata)
    remote_side = reader.prep_xfer_dlist(peer, reader.get_xfer_descs(rows(cache), "DRAM"))
    assert read_only_kv_mappings() == mapped_before  # mapped at the first READ, not before
    made_before = reader.make_prepped_xfer("READ", local_side, [0], remote_side, [5])
    assert isinstance(made_before, SharedRead)
    assert read_only_kv_mappings() == mapped_before + published
    reader.remove_remote_agent(peer)
    assert reader.removed == [peer]
    assert read_only_kv_mappings() == mapped_before
    handle = reader.make_prepped_xfer("READ", local_side, [0], remote_side, [0])
    assert not isinstance(handle, SharedRead)
    # A READ made before the peer went fails rather than read unmapped memory.
    assert reader.transfer(made_before) == "ERR" == reader.check_xfer_state(made_before)
    assert not local[0].any() and reader.notifs == []


def test_device_memory_on_either_side_is_left_to_nixl(cache):
    prefill = Agent("prefill")
    reader, peer, _local, local_side = reader_of(prefill.get_agent_metadata())
    remote_vram = reader.prep_xfer_dlist(peer, reader.get_xfer_descs(rows(cache), "VRAM"))
    assert not isinstance(
        reader.make_prepped_xfer("READ", local_side, [0], remote_vram, [0]), SharedRead)
    local_vram = reader.prep_xfer_dlist(
        "NIXL_INIT_AGENT", rows(torch.zeros(BLOCKS, BLOCK, dtype=torch.uint8)), "VRAM")
    remote_dram = reader.prep_xfer_dlist(peer, reader.get_xfer_descs(rows(cache), "DRAM"))
    assert not isinstance(
        reader.make_prepped_xfer("READ", local_vram, [0], remote_dram, [0]), SharedRead)
    assert len(reader.nixl_reads) == 2


class ReusingAgent(RecordingAgent):
    """A NIXL whose descriptor-list handles come back at the same address, as a freed
    handle's id() can be reused by the next one."""

    handle = object()

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=()):
        return self.handle


def test_a_handle_at_a_reused_id_does_not_inherit_an_old_table(cache):
    prefill = shared_memory_agent(ReusingAgent)("prefill")
    reader = shared_memory_agent(ReusingAgent)("decode")
    peer = reader.add_remote_agent(prefill.get_agent_metadata())
    local_side = reader.prep_xfer_dlist("NIXL_INIT_AGENT", reader.get_xfer_descs(
        rows(torch.zeros(BLOCKS, BLOCK, dtype=torch.uint8)), "DRAM"))
    remote_side = reader.prep_xfer_dlist(peer, [cache[0], cache[1]])  # no table: tensors
    assert remote_side is local_side
    read = reader.make_prepped_xfer("READ", local_side, [0], remote_side, [0])
    assert not isinstance(read, SharedRead) and len(reader.nixl_reads) == 1


def read_only_kv_mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if "pdserve-kv" in line and " r--s " in line)


def reading_whole_cache_of(info: dict):
    """A reader after its handshake with the owner that published ``info``, and the local
    and remote descriptor lists of a READ of the owner's whole cache."""
    [segment] = info["segments"]
    reader, peer, _local, local_side = reader_of(
        b"nixl:prefill" + TRAILER_MAGIC + json.dumps(info).encode())
    remote = np.array([(segment["addr"] + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)],
                      dtype=np.uint64)
    return reader, local_side, reader.prep_xfer_dlist(peer, reader.get_xfer_descs(remote,
                                                                                  "DRAM"))


def test_a_dead_owners_kv_is_not_read_and_its_memory_is_unmapped(owner):  # noqa: F811
    """A prefill engine that died: its pages live on in the reader's mapping, but its KV
    is not read from there; the READ goes to NIXL (which fails it, and vLLM's
    load_failure_policy applies, as before shared memory), and the mapping goes."""
    info, process = owner
    reader, local_side, remote_side = reading_whole_cache_of(info)
    alive = reader.make_prepped_xfer("READ", local_side, [0], remote_side, [0])
    assert isinstance(alive, SharedRead)
    mapped = read_only_kv_mappings()
    process.kill()
    process.join(10)
    after_death = reader.make_prepped_xfer("READ", local_side, [0], remote_side, [0])
    assert not isinstance(after_death, SharedRead) and len(reader.nixl_reads) == 1
    assert read_only_kv_mappings() == mapped - 1
    assert reader.transfer(alive) == "ERR"  # made while it lived, run after: not copied


def test_a_dead_owners_memory_is_unmapped_by_an_engine_that_reads_no_more(
        owner, monkeypatch):  # noqa: F811
    """A decode engine whose traffic no longer READs from this host (decode-local prompts,
    its prefill replicas scaled down) still steps, and vLLM asks its agent for
    notifications on every step: the dead prefill engine's cache is unmapped there too,
    not kept resident until another READ."""
    monkeypatch.setattr(shared_kv, "SWEEP_INTERVAL_S", 0.0)  # every step sweeps
    info, process = owner
    reader, local_side, remote_side = reading_whole_cache_of(info)
    assert isinstance(reader.make_prepped_xfer("READ", local_side, [0], remote_side, [0]),
                      SharedRead)
    mapped = read_only_kv_mappings()
    assert reader.get_new_notifs() == {}  # a step while it lives unmaps nothing
    assert read_only_kv_mappings() == mapped
    process.kill()
    process.join(10)
    assert reader.get_new_notifs() == {}
    assert read_only_kv_mappings() == mapped - 1
