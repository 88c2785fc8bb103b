"""`pdserve bench transfer` (tools/bench/transfer.py) on real NIXL agents in two
processes: every transport it measures delivers the owner's bytes (checked inside) and a
rate."""

from __future__ import annotations

import pytest

from tools.bench.transfer import measure_transfers


@pytest.mark.timeout(300)
def test_each_transport_reads_the_owners_blocks_from_another_process():
    rows = measure_transfers([1], repeats=2, transports=["tcp", "cma", "shm"])
    assert [(row["transport"], row["mib"]) for row in rows] == [("tcp", 1), ("cma", 1),
                                                                ("shm", 1)]
    assert [row["moved_by"] for row in rows] == ["UCX", "UCX", "shared memory"]
    for row in rows:
        assert row["blocks"] == 64  # 1 MiB of 16 KiB blocks, one descriptor each
        assert row["nixl_gbps"] > 0 and row["memcpy_gbps"] > 0
        assert row["ratio"] == pytest.approx(row["nixl_gbps"] / row["memcpy_gbps"])


@pytest.mark.timeout(300)
def test_a_larger_block_is_read_as_fewer_larger_descriptors():
    rows = measure_transfers([1], repeats=2, transports=["cma"], block_sizes=[64 * 1024])
    assert [(row["block_kib"], row["blocks"]) for row in rows] == [(64, 16)]
    assert rows[0]["nixl_gbps"] > 0  # and the bytes were checked inside


def test_an_unknown_transport_is_refused_before_any_process_starts():
    with pytest.raises(KeyError):
        measure_transfers([1], repeats=1, transports=["carrier-pigeon"])
