"""The KV handle: where a finished prefill left its KV blocks, and for how long (pure).

The prefill engine returns it (vLLM's ``kv_transfer_params`` of a request finished with
``do_remote_decode``); the router passes it, unchanged, to the decode engine, whose
NixlConnector reads the blocks from ``remote_host:remote_port`` and then tells the prefill
engine to free them. If no decode engine ever reads them, the prefill engine frees them
when the lease (vLLM's ``kv_lease_duration``) runs out.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def prefill_request_params() -> dict[str, Any]:
    """``kv_transfer_params`` that make a request a producer-side prefill.

    The prefill engine computes the prompt, keeps its blocks for a remote decode and
    reports where they are in the finished output.
    """
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }


class KVHandle(BaseModel):
    """vLLM's ``kv_transfer_params`` as returned by a NIXL producer, typed.

    Unknown fields that a newer vLLM adds are kept and passed through (``extra="allow"``):
    the router must never drop part of a handle it does not understand.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    do_remote_prefill: bool = Field(description="True: the consumer must pull the KV")
    do_remote_decode: bool = False
    remote_engine_id: str
    remote_request_id: str | None = None
    remote_block_ids: list[Any] = Field(description="block ids per KV-cache group")
    remote_host: str
    remote_port: int
    tp_size: int = 1
    remote_num_tokens: int = 0
    remote_blocks_expiry_time: float | None = None

    @property
    def num_blocks(self) -> int:
        """Blocks held for this request on the prefill side (all KV-cache groups)."""
        return sum(_count_blocks(group) for group in self.remote_block_ids)

    @property
    def carries_kv(self) -> bool:
        """False when the prefill kept nothing (e.g. a prompt shorter than one block)."""
        return self.do_remote_prefill and self.num_blocks > 0

    def to_params(self) -> dict[str, Any]:
        """The ``kv_transfer_params`` dict for the decode engine's request."""
        return self.model_dump(mode="python")


def _count_blocks(group: Any) -> int:
    # vLLM sends either a flat list of ints (one group) or a list of lists (HMA groups).
    if isinstance(group, list | tuple):
        return len(group)
    return 1
