"""kv_transfer/copy_plan.py: a NIXL READ from mapped peer memory as memory copies."""

from __future__ import annotations

import numpy as np

from kv_transfer.copy_plan import Segment, SegmentMap, copies_for_read, descriptor_table

BLOCK = 16 * 1024
PEER_BASE = 0x7F00_0000_0000  # where the peer's cache lies in the peer
MAPPED_AT = 0x7E00_0000_0000  # where this process mapped it
LOCAL_BASE = 0x7D00_0000_0000  # this process's own cache


def table(base: int, blocks: int, length: int = BLOCK) -> np.ndarray:
    return descriptor_table(np.array([(base + i * length, length, 0) for i in range(blocks)],
                                     dtype=np.uint64))


def peer(blocks: int = 64) -> SegmentMap:
    return SegmentMap([Segment(peer_addr=PEER_BASE, size=blocks * BLOCK,
                               local_addr=MAPPED_AT)])


def test_consecutive_blocks_on_both_sides_are_one_copy():
    copies = copies_for_read(table(LOCAL_BASE, 8), [2, 3, 4], table(PEER_BASE, 64),
                             [10, 11, 12], peer())
    assert copies == [(LOCAL_BASE + 2 * BLOCK, MAPPED_AT + 10 * BLOCK, 3 * BLOCK)]


def test_a_break_on_either_side_starts_a_new_copy():
    copies = copies_for_read(table(LOCAL_BASE, 8), [0, 1, 3, 4], table(PEER_BASE, 64),
                             [5, 6, 7, 9], peer())
    assert copies == [
        (LOCAL_BASE, MAPPED_AT + 5 * BLOCK, 2 * BLOCK),  # 0,1 <- 5,6
        (LOCAL_BASE + 3 * BLOCK, MAPPED_AT + 7 * BLOCK, BLOCK),  # local 2 skipped
        (LOCAL_BASE + 4 * BLOCK, MAPPED_AT + 9 * BLOCK, BLOCK),  # remote 8 skipped
    ]
    assert sum(length for _, _, length in copies) == 4 * BLOCK


def test_blocks_in_reverse_order_copy_one_by_one():
    copies = copies_for_read(table(LOCAL_BASE, 4), [0, 1, 2], table(PEER_BASE, 64),
                             [3, 2, 1], peer())
    assert [source - MAPPED_AT for _, source, _ in copies] == [3 * BLOCK, 2 * BLOCK, BLOCK]


def test_each_remote_block_is_found_in_its_own_segment():
    segments = SegmentMap([
        Segment(peer_addr=PEER_BASE + 1_000 * BLOCK, size=4 * BLOCK, local_addr=MAPPED_AT),
        Segment(peer_addr=PEER_BASE, size=4 * BLOCK, local_addr=MAPPED_AT + 100 * BLOCK),
    ])
    remote = descriptor_table([(PEER_BASE + BLOCK, BLOCK, 0),
                               (PEER_BASE + 1_003 * BLOCK, BLOCK, 0)])
    copies = copies_for_read(table(LOCAL_BASE, 2), [0, 1], remote, [0, 1], segments)
    assert [source for _, source, _ in copies] == [MAPPED_AT + 101 * BLOCK,
                                                   MAPPED_AT + 3 * BLOCK]


def test_anything_not_wholly_inside_the_mapping_is_left_to_nixl():
    remote = table(PEER_BASE, 64)
    local = table(LOCAL_BASE, 8)
    assert copies_for_read(local, [0], remote, [64 - 1], peer(64)) is not None
    assert copies_for_read(local, [0], remote, [63], peer(63)) is None  # past the end
    below = descriptor_table([(PEER_BASE - BLOCK, BLOCK, 0)])
    assert copies_for_read(local, [0], below, [0], peer()) is None  # before the start
    straddling = descriptor_table([(PEER_BASE + 63 * BLOCK + 1, BLOCK, 0)])
    assert copies_for_read(local, [0], straddling, [0], peer()) is None
    assert copies_for_read(local, [0], remote, [0], SegmentMap([])) is None


def test_a_read_that_does_not_pair_up_is_left_to_nixl():
    local, remote = table(LOCAL_BASE, 8), table(PEER_BASE, 64)
    assert copies_for_read(local, [0, 1], remote, [0], peer()) is None  # counts differ
    assert copies_for_read(local, [8], remote, [0], peer()) is None  # past the local table
    assert copies_for_read(local, [-1], remote, [0], peer()) is None
    assert copies_for_read(local, [], remote, [], peer()) is None
    halves = table(PEER_BASE, 64, length=BLOCK // 2)
    assert copies_for_read(local, [0], halves, [0], peer()) is None  # lengths differ


def test_descriptor_tables_come_from_the_forms_vllm_passes():
    rows = [(LOCAL_BASE, BLOCK, 0), (LOCAL_BASE + BLOCK, BLOCK, 0)]
    expected = [[LOCAL_BASE, BLOCK], [LOCAL_BASE + BLOCK, BLOCK]]
    assert descriptor_table(rows).tolist() == expected
    assert descriptor_table(np.array(rows, dtype=np.uint64)).tolist() == expected
    assert descriptor_table(np.zeros((2, 5), dtype=np.uint64)) is None  # strided lists
    assert descriptor_table([]) is None
    assert descriptor_table(object()) is None
