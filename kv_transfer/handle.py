"""The KV handle: where a finished prefill left its KV blocks, and for how long (pure).

The prefill engine returns it (vLLM's ``kv_transfer_params``) and the router passes it
unchanged to the decode engine, which pulls the blocks; unread, they are freed when the
lease (vLLM's ``kv_lease_duration``) runs out. The prefill replica stamps it with
``claim_by``, a deadline well inside the lease, past which a decode replica prefills the
prompt itself. Why: docs/design.md, "A handle is pulled only well inside its lease".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# A decode engine must take a handle within this share of the lease; the rest covers adding
# the request to the engine (from then on it renews the lease) and the difference between
# the clocks of the prefill and the decode host.
CLAIM_SHARE_OF_LEASE = 2 / 3


def engine_extra_args(kv_transfer_params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``SamplingParams.extra_args`` that hand ``kv_transfer_params`` to the engine's
    connector (None when there are none)."""
    return {"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params else None


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
    # pdserve's own fields, never passed to vLLM, in wall-clock time (seconds since the
    # epoch): after claim_by no decode engine may pull these blocks (see the module
    # docstring); after lease_until the prefill engine has freed them unless renewed.
    claim_by: float | None = None
    lease_until: float | None = None

    def with_lease(self, finished_at: float, lease_s: float) -> KVHandle:
        """This handle, for a lease of ``lease_s`` that started at ``finished_at``: to be
        claimed within ``CLAIM_SHARE_OF_LEASE`` of it."""
        return self.model_copy(update={
            "claim_by": finished_at + lease_s * CLAIM_SHARE_OF_LEASE,
            "lease_until": finished_at + lease_s,
        })

    def claimable_at(self, now: float) -> bool:
        """Whether a decode engine may still pull the blocks at wall-clock time ``now``."""
        return self.claim_by is None or now < self.claim_by

    def lease_running_at(self, now: float) -> bool:
        """Whether the prefill engine may still hold the blocks at ``now`` (worth releasing
        them; after the lease, a release would only be logged there as a stray read)."""
        return self.lease_until is None or now < self.lease_until

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
        return self.model_dump(mode="python", exclude={"claim_by", "lease_until"})


def _count_blocks(group: Any) -> int:
    # vLLM sends either a flat list of ints (one group) or a list of lists (HMA groups).
    if isinstance(group, list | tuple):
        return len(group)
    return 1
