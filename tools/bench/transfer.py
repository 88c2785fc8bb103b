"""KV-transfer micro-benchmark: NIXL READs between two processes vs a host memory copy.

Two processes, as two engines are: an owner registers a CPU buffer laid out as KV blocks
(a prefill engine's cache), a reader READs all of them into its own buffer, one descriptor
per block, the way a decode engine pulls. Both run NIXL's UCX backend with the transports
``UCX_TLS`` names, without NIXL's spinning progress thread (as the CPU engines run, see
docs/design.md): the reader progresses through its transfer's state, the owner through its
notifications, as vLLM's connector does on every engine step (here in a tight loop, so the
owner's side is never the one waiting for a step).

Each transport is measured in fresh processes, since UCX reads ``UCX_TLS`` once per
process: ``tcp`` is the path between hosts (here over loopback), ``cma`` (cross-memory
attach: the kernel copies straight from the owner's pages) and ``sm`` (every shared-memory
transport UCX has) are same-host paths. The same bytes copied with ``torch`` in the reader
(a plain host ``memcpy``) are the baseline: the ratio says how close each path comes to
the machine's memory bandwidth.

``shm`` is pdserve's own same-host path (``kv_transfer.shared_memory``, the default): the
owner's buffer is a memfd, as a prefill engine's KV cache is, and both agents are
``kv_transfer.shared_kv``'s subclass of NIXL's agent, which maps the owner's memory and
does the READ as memory copies (NIXL over ``tcp,self`` stays the fallback). The reader
prepares its descriptor lists and each READ the way vLLM's connector does
(``get_xfer_descs``, ``prep_xfer_dlist``, ``make_prepped_xfer``), and the time of a READ
runs from preparing it to its end, so the copy plan of ``shm`` is timed too.

A descriptor is one block: ``block_bytes`` (16 KiB by default, one 32-token K or V block of
one layer of the bench model; a larger engine ``block_size`` makes larger ones). Each block
size is measured in processes of its own too.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from contextlib import contextmanager

BLOCK_BYTES = 16 * 1024  # one 32-token K or V block of one layer of the bench model

# UCX_TLS per transport: "self" for an agent's own loopback, "tcp" also carries the
# connection set-up, which UCX's shared-memory transports cannot do alone.
TRANSPORTS = {"tcp": "tcp,self", "cma": "tcp,cma,self", "sm": "tcp,sm,self",
              "shm": "tcp,self"}
SHARED_MEMORY = {"shm"}  # the transports that read through kv_transfer.shared_kv
SEED = 7  # the owner's bytes; the reader regenerates them to check what arrived


def measure_transfers(sizes_mib: list[int], repeats: int,
                      transports: list[str] | None = None,
                      block_sizes: list[int] | None = None) -> list[dict]:
    """Best-of-``repeats`` GB/s per block size, transport and size, NIXL READ and host
    memcpy (``block_sizes`` in bytes, each a descriptor; default: ``BLOCK_BYTES``)."""
    rows = []
    for block_bytes in block_sizes or [BLOCK_BYTES]:
        for transport in transports or list(TRANSPORTS):
            with _owner_process(transport, sizes_mib, block_bytes) as (meta, buffers, ctx):
                rows.extend(_read_in_child(ctx, transport, meta, buffers, sizes_mib,
                                           repeats, block_bytes))
    return rows


@contextmanager
def _owner_process(transport: str, sizes_mib: list[int], block_bytes: int):
    """A process that owns one registered buffer per size and progresses its agent
    until the context ends; yields its agent metadata and the buffers' block addresses."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_serve_blocks, args=(child, transport, sizes_mib,
                                                      block_bytes), daemon=True)
    process.start()
    try:
        reply = _reply(parent, transport, "owner", timeout_s=120)
        yield reply["metadata"], reply["buffers"], ctx
    finally:
        parent.send("stop")
        _reap(process)


def _read_in_child(ctx, transport: str, owner_meta: bytes, buffers: dict[int, list],
                   sizes_mib: list[int], repeats: int, block_bytes: int) -> list[dict]:
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_read_blocks, daemon=True, args=(
        child, transport, owner_meta, buffers, sizes_mib, repeats, block_bytes))
    process.start()
    try:
        rows = _reply(parent, transport, "reader", timeout_s=600)
    finally:
        _reap(process)
    return [{"transport": transport, **row} for row in rows]


def _reply(conn, transport: str, side: str, timeout_s: float):
    """What a child process sent; its error (a string) raised here, in the benchmark."""
    if not conn.poll(timeout_s):
        raise RuntimeError(f"the NIXL {side} process ({transport}) did not answer")
    reply = conn.recv()
    if isinstance(reply, str):
        raise RuntimeError(f"NIXL with UCX_TLS={TRANSPORTS[transport]}: {reply}")
    return reply


def _reap(process) -> None:
    process.join(30)
    if process.is_alive():
        process.kill()


def _agent(name: str, transport: str):
    os.environ["UCX_TLS"] = TRANSPORTS[transport]  # before the agent: UCX reads it at start
    from nixl._api import nixl_agent, nixl_agent_config

    agent_class = nixl_agent
    if transport in SHARED_MEMORY:
        from kv_transfer.shared_kv import shared_memory_agent

        agent_class = shared_memory_agent(nixl_agent)
    return agent_class(name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))


def _blocks(num_bytes: int, block_bytes: int) -> int:
    return max(1, num_bytes // block_bytes)


def _owned_buffer(transport: str, num_blocks: int, block_bytes: int):
    """The owner's buffer: a memfd for the shared-memory path (as a prefill engine's KV
    cache is there), process memory otherwise."""
    import torch

    if transport in SHARED_MEMORY:
        from kv_transfer.shared_kv import allocate_shared

        shared = allocate_shared(num_blocks * block_bytes)
        return shared.view(torch.uint8).view(num_blocks, block_bytes)
    return torch.empty((num_blocks, block_bytes), dtype=torch.uint8)


def _serve_blocks(conn, transport: str, sizes_mib: list[int], block_bytes: int) -> None:
    """The owner (child process): register a seeded buffer per size, send where its
    blocks are, progress the agent until told to stop."""
    try:
        import torch

        agent = _agent("bench-owner", transport)
        generator = torch.Generator().manual_seed(SEED)
        tensors, buffers = [], {}
        for mib in sizes_mib:
            num_blocks = _blocks(mib * 2**20, block_bytes)
            tensor = _owned_buffer(transport, num_blocks, block_bytes)
            tensor.copy_(torch.randint(0, 255, (num_blocks, block_bytes), dtype=torch.uint8,
                                       generator=generator))
            agent.register_memory(tensor)
            tensors.append(tensor)
            buffers[mib] = [(tensor[i].data_ptr(), block_bytes, 0)
                            for i in range(tensor.shape[0])]
        conn.send({"metadata": agent.get_agent_metadata(), "buffers": buffers})
    except Exception as error:  # the parent reports it
        conn.send(f"{type(error).__name__}: {error}")
        return
    while not conn.poll(0):
        agent.get_new_notifs()  # progresses the owner's side of the reads


def _read_blocks(conn, transport: str, owner_meta: bytes, buffers: dict[int, list],
                 sizes_mib: list[int], repeats: int, block_bytes: int) -> None:
    """The reader (child process): READ every size ``repeats`` times, check the bytes,
    and time a memcpy of the same size after each READ, so that both see the same moments
    of a machine whose memory bandwidth varies."""
    try:
        import torch

        agent = _agent("bench-reader", transport)
        owner = agent.add_remote_agent(owner_meta)
        generator = torch.Generator().manual_seed(SEED)
        rows = []
        for mib in sizes_mib:
            expected = torch.randint(0, 255, (_blocks(mib * 2**20, block_bytes), block_bytes),
                                     dtype=torch.uint8, generator=generator)
            memcpy = _Memcpy(expected.numel())
            seconds, moved_by = _best_read(agent, owner, buffers[mib], expected, repeats,
                                           between=memcpy.time)
            copy_s = memcpy.best
            num_bytes = expected.numel()
            rows.append({"mib": mib, "block_kib": block_bytes // 1024, "moved_by": moved_by,
                         "blocks": expected.shape[0],
                         "nixl_gbps": num_bytes / seconds / 1e9,
                         "memcpy_gbps": num_bytes / copy_s / 1e9, "ratio": copy_s / seconds})
        conn.send(rows)
    except Exception as error:
        conn.send(f"{type(error).__name__}: {error}")


def _best_read(agent, owner: str, remote_blocks: list, expected, repeats: int,
               between=lambda: None) -> tuple[float, str]:
    """The best time of a READ of every block, and what moved them: a NIXL backend
    ("UCX") or "shared memory" (kv_transfer.shared_kv's copies)."""
    import numpy as np
    import torch

    local = torch.zeros_like(expected)
    registered = agent.register_memory(local)
    try:
        block_bytes = local.shape[1]
        local_rows = np.array([(local[i].data_ptr(), block_bytes, 0)
                               for i in range(local.shape[0])], dtype=np.uint64)
        local_side = agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", agent.get_xfer_descs(local_rows, "DRAM"))
        remote_side = agent.prep_xfer_dlist(
            owner, agent.get_xfer_descs(np.array(remote_blocks, dtype=np.uint64), "DRAM"))
        ids = np.arange(local.shape[0])
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            handle = agent.make_prepped_xfer("READ", local_side, ids, remote_side, ids)
            state = agent.transfer(handle)
            while state not in ("DONE", "ERR"):
                state = agent.check_xfer_state(handle)
            elapsed = time.perf_counter() - started
            moved_by = _moved_by(agent, handle)
            agent.release_xfer_handle(handle)
            if state != "DONE":
                raise RuntimeError("NIXL transfer failed")
            best = min(best, elapsed)
            between()
        if not torch.equal(local, expected):
            raise RuntimeError("NIXL transfer delivered wrong bytes")
        return best, moved_by
    finally:
        agent.deregister_memory(registered)


def _moved_by(agent, handle) -> str:
    from kv_transfer.shared_kv import SharedRead

    if isinstance(handle, SharedRead):
        return "shared memory"
    return agent.query_xfer_backend(handle)


class _Memcpy:
    """The baseline: a host memcpy (``torch`` ``copy_``) of ``num_bytes``, timed once per
    call; ``best`` is the fastest so far."""

    def __init__(self, num_bytes: int):
        import torch

        self.source = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8)
        self.target = torch.empty_like(self.source)
        self.best = float("inf")

    def time(self) -> None:
        started = time.perf_counter()
        self.target.copy_(self.source)
        self.best = min(self.best, time.perf_counter() - started)
