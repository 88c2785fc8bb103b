"""Same-host KV through shared memory: the prefill engine's cache, mapped by the decode engine.

Three parts, switched on in the engine processes by ``kv_transfer/vllm_plugin.py`` when
``kv_transfer.shared_memory`` is on: ``SharedKvAllocation`` makes a prefill engine's KV
cache a memfd; ``with_trailer`` / ``split_trailer`` carry its segments in the NIXL agent
metadata of vLLM's handshake; ``shared_memory_agent``'s NIXL agent subclass turns a READ of
a same-host peer's host memory into copies (``kv_transfer/copy_plan.py``) and hands
everything else to NIXL unchanged. Why, the failure cases and the checks: docs/design.md,
"Same-host KV moves through the prefill engine's shared cache, between hosts by NIXL".
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import threading
import time
from types import SimpleNamespace
from typing import Any

from torch.overrides import TorchFunctionMode

from kv_transfer.copy_plan import (
    Copy,
    Segment,
    SegmentMap,
    copies_for_read,
    descriptor_table,
)

logger = logging.getLogger("vllm.pdserve")

MEMFD_NAME = "pdserve-kv"  # as it shows in /proc/<pid>/maps: "/memfd:pdserve-kv (deleted)"
TRAILER_MAGIC = b"\x00pdserve-shared-kv\x00"
_LOCAL_AGENTS = ("NIXL_INIT_AGENT", "")
SWEEP_INTERVAL_S = 10.0  # how often a reader looks for peers that have died

# This process's shared KV buffers: what the trailer publishes. The fds stay open for the
# life of the process (a peer opens them through /proc), the tensors keep the mappings.
# vLLM allocates a CPU engine's cache once per worker process; a tensor's Python object
# says nothing of its memory's life (the engine keeps only views of it), so there is no
# earlier moment to close them.
_exported: list[dict[str, int]] = []


def allocate_shared(num_bytes: int):
    """A zeroed int8 CPU tensor of ``num_bytes`` in a memfd, published in this process's
    trailer. A memfd has no name to leak: its pages go when the last mapping does."""
    import torch

    fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
    os.ftruncate(fd, num_bytes)  # a new memfd reads as zeros, as torch.zeros would
    tensor = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=num_bytes,
                             dtype=torch.int8)
    _exported.append({"fd": fd, "addr": tensor.data_ptr(), "size": num_bytes,
                      "inode": os.fstat(fd).st_ino})
    return tensor


class SharedKvAllocation(TorchFunctionMode):
    """Inside it, a CPU engine's KV cache is allocated in shared memory.

    vLLM 0.32's ``allocate_kv_cache`` makes the cache's one backing buffer with
    ``torch.zeros(size, dtype=torch.int8, device=...)``; in this context such a call on the
    CPU returns ``allocate_shared(size)``. Every other call runs as it would.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        import torch

        kwargs = kwargs or {}
        if (func is torch.zeros and len(args) == 1 and isinstance(args[0], int)
                and kwargs.get("dtype") is torch.int8
                and torch.device(kwargs.get("device") or "cpu").type == "cpu"):
            logger.info("pdserve: the KV cache (%d MiB) is shared memory, for same-host "
                        "decode engines to map", args[0] >> 20)
            return allocate_shared(args[0])
        return func(*args, **kwargs)


def host_identity() -> str:
    """Equal in two processes exactly when a pid of one names the same process in the
    other: the same boot of the same kernel, the same PID namespace."""
    with open("/proc/sys/kernel/random/boot_id") as boot:
        return f"{boot.read().strip()}/{os.readlink('/proc/self/ns/pid')}"


def with_trailer(metadata: bytes) -> bytes:
    """NIXL agent metadata with this process's shared segments appended (unchanged when
    it has none)."""
    if not _exported:
        return metadata
    info = {"host": host_identity(), "pid": os.getpid(), "segments": _exported}
    return metadata + TRAILER_MAGIC + json.dumps(info).encode()


def split_trailer(metadata: bytes) -> tuple[bytes, dict[str, Any] | None]:
    """NIXL's own metadata, and the peer's shared segments if it sent any."""
    at = metadata.rfind(TRAILER_MAGIC)
    if at < 0:
        return metadata, None
    return metadata[:at], json.loads(metadata[at + len(TRAILER_MAGIC):])


class _Libc:
    """mmap/munmap by address: Python's mmap objects cannot be unmapped while any
    address taken from them is alive, and the copies work on addresses."""

    PROT_READ = 1
    MAP_SHARED = 1
    MAP_FAILED = ctypes.c_void_p(-1).value

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        self.munmap = libc.munmap
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

    def map_read_only(self, fd: int, size: int) -> int:
        addr = self.mmap(None, size, self.PROT_READ, self.MAP_SHARED, fd, 0)
        if addr in (None, self.MAP_FAILED):
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
        return addr


_libc: _Libc | None = None


def _get_libc() -> _Libc:
    global _libc
    if _libc is None:
        _libc = _Libc()
    return _libc


class PeerMemory:
    """A same-host peer's shared segments, mapped read-only into this process."""

    def __init__(self, segments: list[Segment], owner: tuple[int, int, int] | None = None):
        self.segments = SegmentMap(segments)
        self._mapped = [(segment.local_addr, segment.size) for segment in segments]
        self._owner = owner  # (pid, fd, inode) of the first segment, to see it gone
        self.closed = False

    def owner_alive(self) -> bool:
        """Whether the process that published the memory still holds it (its fd still
        names the same memfd); a dead owner's pages live on only in our mapping."""
        if self._owner is None:
            return True
        pid, fd, inode = self._owner
        try:
            return os.stat(f"/proc/{pid}/fd/{fd}").st_ino == inode
        except OSError:
            return False

    @classmethod
    def open(cls, info: dict[str, Any]) -> PeerMemory:
        """Map what ``info`` (a peer's trailer) describes; OSError or ValueError when
        this process cannot (another host, a peer gone, no permission)."""
        if info.get("host") != host_identity():
            raise ValueError("the peer runs on another host (or PID namespace)")
        libc, segments = _get_libc(), []
        try:
            for published in info["segments"]:
                segments.append(cls._map(libc, info["pid"], published))
        except BaseException:
            for segment in segments:
                libc.munmap(segment.local_addr, segment.size)
            raise
        first = info["segments"][0] if info["segments"] else None
        owner = (info["pid"], first["fd"], first["inode"]) if first else None
        return cls(segments, owner)

    @staticmethod
    def _map(libc: _Libc, pid: int, published: dict[str, int]) -> Segment:
        fd = os.open(f"/proc/{pid}/fd/{published['fd']}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            status = os.fstat(fd)
            if status.st_ino != published["inode"] or status.st_size < published["size"]:
                raise ValueError(f"fd {published['fd']} of pid {pid} is not the KV memory "
                                 "it published (the process is gone, its pid reused)")
            local_addr = libc.map_read_only(fd, published["size"])
        finally:
            os.close(fd)
        return Segment(peer_addr=published["addr"], size=published["size"],
                       local_addr=local_addr)

    def close(self) -> None:
        """Unmap; a ``SharedRead`` made before and run after then fails instead of
        reading unmapped memory."""
        self.closed = True
        libc = _get_libc()
        for addr, size in self._mapped:
            libc.munmap(addr, size)
        self._mapped = []


# From this length a copy runs as torch's ``copy_`` of two views, below as ``memmove``.
# glibc's memmove streams a long copy with non-temporal stores, past the caches: half of
# torch's speed from 1 MiB up on this machine, where torch's copy is the memcpy that
# `pdserve bench transfer` compares with; a view costs ~1.3 µs, a block's memmove ~0.3.
TENSOR_COPY_BYTES = 256 * 1024


def _bytes_at(addr: int, length: int):
    """A uint8 tensor over ``length`` bytes at ``addr`` (no copy; the memory stays its
    owner's)."""
    import torch

    return torch.frombuffer((ctypes.c_uint8 * length).from_address(addr), dtype=torch.uint8)


class SharedRead:
    """A READ done by copying: what ``make_prepped_xfer`` returns in place of NIXL's
    handle for a peer whose memory is mapped. ``transfer`` runs it."""

    def __init__(self, copies: list[Copy], agent: str, notif_msg: bytes, peer: PeerMemory):
        self.copies = copies
        self.agent = agent
        self.notif_msg = notif_msg
        self.peer = peer
        self.state = "PROC"  # until transferred
        self.telemetry = None

    def run(self) -> None:
        if self.peer.closed:  # its owner died (or vLLM dropped it) since the READ was made
            self.state = "ERR"
            return
        started = time.perf_counter()
        memmove = ctypes.memmove
        for destination, source, length in self.copies:
            if length < TENSOR_COPY_BYTES:
                memmove(destination, source, length)
            else:
                _bytes_at(destination, length).copy_(_bytes_at(source, length))
        elapsed_us = (time.perf_counter() - started) * 1e6
        # The fields vLLM's NIXL stats read from NIXL's telemetry (µs, bytes, descriptors).
        self.telemetry = SimpleNamespace(
            startTime=int(started * 1e6), postDuration=elapsed_us, xferDuration=elapsed_us,
            totalBytes=sum(length for _, _, length in self.copies),
            descCount=len(self.copies))
        self.state = "DONE"


def shared_memory_agent(base: type) -> type:
    """A subclass of NIXL's agent class ``base`` that publishes this process's shared KV
    and READs a same-host peer's by copying (module docstring)."""

    class SharedMemoryAgent(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._peers: dict[str, PeerMemory] = {}  # mapped, on the engine's thread
            self._published: dict[str, dict[str, Any]] = {}  # trailers not yet mapped
            # Per thread: vLLM prepares lists on the engine's thread and, for a new peer,
            # on its handshake thread, each as a get_xfer_descs then a prep_xfer_dlist.
            self._described = threading.local()
            # id(handle): its agent, its (address, length) table, its memory type
            self._prepped: dict[int, tuple[str, Any, str | None]] = {}
            self._next_sweep = 0.0

        # -- the handshake: publish ours, map theirs --------------------------------------
        def get_agent_metadata(self) -> bytes:
            return with_trailer(super().get_agent_metadata())

        def add_remote_agent(self, metadata: bytes) -> str:
            metadata, info = split_trailer(metadata)
            name = super().add_remote_agent(metadata)
            if info is not None:
                # vLLM runs handshakes on a thread of its own while the engine's thread
                # copies: the peer is mapped later, at its first READ, on the engine's
                # thread, which also unmaps (remove_remote_agent, _forget_dead_peers).
                self._published[name] = info
            return name

        def _peer(self, name: str) -> PeerMemory | None:
            """The peer's mapped memory, mapping it at its first READ; None when it
            published none or cannot be mapped (then NIXL moves its KV)."""
            peer = self._peers.get(name)
            if peer is not None:
                return peer
            info = self._published.pop(name, None)
            if info is None:
                return None
            try:
                peer = PeerMemory.open(info)
            except (OSError, ValueError, KeyError) as error:
                logger.info("pdserve: KV from NIXL agent %s moves over NIXL, not shared "
                            "memory: %s", name, error)
                return None
            self._peers[name] = peer
            logger.info("pdserve: KV from NIXL agent %s moves through shared memory", name)
            return peer

        def _drop_peer(self, name: str) -> None:
            peer = self._peers.pop(name, None)
            if peer is not None:
                peer.close()

        def remove_remote_agent(self, agent: str):
            self._published.pop(agent, None)
            self._drop_peer(agent)
            return super().remove_remote_agent(agent)

        # -- descriptor lists: remember their addresses -----------------------------------
        # vLLM makes a NIXL list of an Nx3 array (get_xfer_descs), then prepares that
        # list (prep_xfer_dlist, which calls get_xfer_descs again, with the list).
        def get_xfer_descs(self, descs, mem_type=None):
            dlist = super().get_xfer_descs(descs, mem_type)
            rows = descriptor_table(descs)
            if rows is not None:
                self._described.last = (dlist, rows, mem_type)
            return dlist

        def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, backends=None):
            remembered = getattr(self._described, "last", None)
            self._described.last = None
            rows = descriptor_table(xfer_list)
            if rows is None and remembered is not None and remembered[0] is xfer_list:
                _, rows, mem_type = remembered
            handle = super().prep_xfer_dlist(agent_name, xfer_list, mem_type, backends or [])
            self._described.last = None
            if rows is not None:
                self._prepped[id(handle)] = (agent_name, rows, mem_type)
            else:  # a handle at a reused id must not inherit an old table
                self._prepped.pop(id(handle), None)
            return handle

        def release_dlist_handle(self, handle):
            self._prepped.pop(id(handle), None)
            return super().release_dlist_handle(handle)

        # -- transfers: a READ from a mapped peer is a copy -------------------------------
        def make_prepped_xfer(self, operation, local_xfer_side, local_indices,
                              remote_xfer_side, remote_indices, notif_msg=b"",
                              backends=None, skip_desc_merge=False):
            self._forget_dead_peers()
            read = self._shared_read(operation, local_xfer_side, local_indices,
                                     remote_xfer_side, remote_indices, notif_msg)
            if read is not None:
                return read
            return super().make_prepped_xfer(
                operation, local_xfer_side, local_indices, remote_xfer_side,
                remote_indices, notif_msg, backends or [], skip_desc_merge)

        def get_new_notifs(self):
            # vLLM asks for notifications on every step of the engine, on the thread that
            # copies: so a dead peer is unmapped even by an engine that READs nothing more
            # from this host (decode-local traffic, its prefill pool scaled down).
            self._forget_dead_peers()
            return super().get_new_notifs()

        def _forget_dead_peers(self) -> None:
            """Unmap the memory of peers that have died, at most once per
            ``SWEEP_INTERVAL_S``: the mapping alone keeps a dead engine's whole cache in
            memory, beside its replacement's, until vLLM drops the peer (when another
            engine takes its address, or after vLLM's engine TTL of an hour). Runs on the
            engine's thread, the one that copies, so no copy is under way. Later READs
            from such a peer go to NIXL, which fails them as it did before."""
            now = time.monotonic()
            if now < self._next_sweep:
                return
            self._next_sweep = now + SWEEP_INTERVAL_S
            for name, peer in list(self._peers.items()):
                if not peer.owner_alive():
                    self._forget(name)

        def _forget(self, name: str) -> None:
            self._drop_peer(name)
            logger.info("pdserve: NIXL agent %s is gone; its KV memory is unmapped", name)

        def _shared_read(self, operation, local_side, local_indices, remote_side,
                         remote_indices, notif_msg) -> SharedRead | None:
            local = self._prepped.get(id(local_side))
            remote = self._prepped.get(id(remote_side))
            if operation != "READ" or local is None or remote is None:
                return None
            # Host memory on both sides only: a GPU's blocks are NIXL's (NVLink, RDMA).
            if local[0] not in _LOCAL_AGENTS or local[2] != "DRAM" or remote[2] != "DRAM":
                return None
            peer = self._peer(remote[0])
            if peer is None:
                return None
            if not peer.owner_alive():  # its KV is not read: NIXL fails the READ, and
                self._forget(remote[0])  # vLLM's load_failure_policy applies, as before
                return None
            copies = copies_for_read(local[1], local_indices, remote[1], remote_indices,
                                     peer.segments)
            if copies is None:
                return None
            return SharedRead(copies, remote[0], notif_msg, peer)

        def transfer(self, handle, notif_msg: bytes = b""):
            if not isinstance(handle, SharedRead):
                return super().transfer(handle, notif_msg)
            handle.run()
            message = notif_msg or handle.notif_msg
            if message and handle.state == "DONE":
                self._notify(handle.agent, message)
            return handle.state

        def _notify(self, agent: str, message: bytes) -> None:
            # The KV is here whatever happens to the notification; without it the prefill
            # engine frees the blocks when their lease runs out, as after a lost NIXL one.
            try:
                super().send_notif(agent, message)
            except Exception as error:  # NIXL raises its own types
                logger.warning("pdserve: could not tell NIXL agent %s its KV was read "
                               "(%s); its blocks free at the lease's end", agent, error)

        def check_xfer_state(self, handle):
            if isinstance(handle, SharedRead):
                return handle.state
            return super().check_xfer_state(handle)

        def get_xfer_telemetry(self, handle):
            if isinstance(handle, SharedRead):
                return handle.telemetry
            return super().get_xfer_telemetry(handle)

        def release_xfer_handle(self, handle):
            if isinstance(handle, SharedRead):
                return None
            return super().release_xfer_handle(handle)

    SharedMemoryAgent.__name__ = SharedMemoryAgent.__qualname__ = (
        f"SharedMemory{base.__name__}")
    return SharedMemoryAgent
