"""KV-transfer micro-benchmark: NIXL READs between two agents vs a host memory copy.

Two NIXL agents (UCX backend, TCP on loopback — the transport the CPU engines use) each
register a CPU buffer laid out as KV blocks; one agent READs the other's blocks, as a decode
engine pulls a prefill engine's. Like the CPU engines (see docs/design.md), the agents run
without NIXL's spinning progress thread: both sides are progressed by polling, the reader
through its transfer state and the owner through its notifications, as vLLM's connector
does on every engine step. The same bytes copied with ``torch`` (a plain host
``memcpy``) are the baseline: the ratio says how close the transfer path comes to the
machine's memory bandwidth.
"""

from __future__ import annotations

import os
import time

BLOCK_BYTES = 16 * 1024  # one 32-token block of the tiny model, one layer (see design.md)


def _agents():
    os.environ.setdefault("UCX_TLS", "tcp,self")
    from nixl._api import nixl_agent, nixl_agent_config

    config = nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
    return nixl_agent("bench-reader", config), nixl_agent("bench-owner", config)


def _nixl_read_seconds(reader, owner, num_bytes: int, repeats: int) -> float:
    import torch

    blocks = max(1, num_bytes // BLOCK_BYTES)
    local = torch.zeros(blocks, BLOCK_BYTES, dtype=torch.uint8)
    remote = torch.randint(0, 255, (blocks, BLOCK_BYTES), dtype=torch.uint8)
    local_reg = reader.register_memory(local)
    remote_reg = owner.register_memory(remote)
    remote_name = reader.add_remote_agent(owner.get_agent_metadata())
    try:
        # One descriptor per block, as vLLM's connector reads block by block.
        local_descs = reader.get_xfer_descs([local[i] for i in range(blocks)])
        remote_descs = owner.get_xfer_descs([remote[i] for i in range(blocks)])
        best = float("inf")
        for _ in range(repeats):
            handle = reader.initialize_xfer("READ", local_descs, remote_descs, remote_name)
            started = time.perf_counter()
            state = reader.transfer(handle)
            while state not in ("DONE", "ERR"):
                owner.get_new_notifs()  # progresses the owner's side of the READ
                state = reader.check_xfer_state(handle)
            elapsed = time.perf_counter() - started
            reader.release_xfer_handle(handle)
            if state != "DONE":
                raise RuntimeError("NIXL transfer failed")
            best = min(best, elapsed)
        if not torch.equal(local, remote):
            raise RuntimeError("NIXL transfer delivered wrong bytes")
        return best
    finally:
        reader.remove_remote_agent(remote_name)
        reader.deregister_memory(local_reg)
        owner.deregister_memory(remote_reg)


def _memcpy_seconds(num_bytes: int, repeats: int) -> float:
    import torch

    source = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return best


def measure_transfers(sizes_mib: list[int], repeats: int) -> list[dict]:
    """Best-of-``repeats`` GB/s for each size: NIXL READ and host memcpy."""
    reader, owner = _agents()
    rows = []
    for mib in sizes_mib:
        num_bytes = mib * 2**20
        nixl_s = _nixl_read_seconds(reader, owner, num_bytes, repeats)
        copy_s = _memcpy_seconds(num_bytes, repeats)
        rows.append({
            "mib": mib, "blocks": num_bytes // BLOCK_BYTES,
            "nixl_gbps": num_bytes / nixl_s / 1e9, "memcpy_gbps": num_bytes / copy_s / 1e9,
            "ratio": copy_s / nixl_s,
        })
    return rows
