"""The KV handle, side-channel ports and connector configs (pure parts of kv_transfer)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kv_transfer import (
    KVHandle,
    PortPlan,
    connector_config,
    prefill_request_params,
    side_channel_port,
)
from kv_transfer.ports import side_channel_ports_to_try

# What vLLM's NIXL producer returned for a 1,040-token prompt with 32-token blocks.
PRODUCER_PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [list(range(1, 34))],
    "remote_engine_id": "prefill-abc-127.0.0.1-15600",
    "remote_request_id": "cmpl-1-a78d9a0e",
    "remote_host": "127.0.0.1",
    "remote_port": 15600,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": 1040,
    "remote_blocks_expiry_time": None,
    "transfer_mode": "pull",
}


def test_handle_round_trips_every_field_including_unknown_ones():
    handle = KVHandle.model_validate(PRODUCER_PARAMS)
    assert handle.to_params() == PRODUCER_PARAMS  # dcp_size, transfer_mode kept verbatim
    assert handle.num_blocks == 33
    assert handle.carries_kv


def test_handle_without_blocks_carries_no_kv():
    handle = KVHandle.model_validate({**PRODUCER_PARAMS, "remote_block_ids": [[]]})
    assert handle.num_blocks == 0 and not handle.carries_kv


def test_handle_rejects_missing_address():
    params = dict(PRODUCER_PARAMS)
    del params["remote_host"]
    with pytest.raises(ValueError, match="remote_host"):
        KVHandle.model_validate(params)


def test_prefill_params_ask_for_remote_decode():
    params = prefill_request_params()
    assert params["do_remote_decode"] is True and params["do_remote_prefill"] is False


def test_connector_roles():
    assert connector_config("prefill", "e1")["kv_role"] == "kv_producer"
    # A failed pull is recomputed by the decode engine unless the config says otherwise.
    assert connector_config("decode", "e2")["kv_load_failure_policy"] == "recompute"
    assert connector_config("decode", "e2", load_failure_policy="fail")[
        "kv_load_failure_policy"] == "fail"
    decode = connector_config("decode", "e2", buffer_device="cuda", backends=["UCX", "GDS"])
    assert decode["kv_role"] == "kv_consumer"
    assert decode["kv_buffer_device"] == "cuda"
    assert decode["engine_id"] == "e2"
    assert decode["kv_connector_extra_config"] == {"backends": ["UCX", "GDS"],
                                                   "kv_lease_duration": 30}
    # both roles read the lease: the producer frees at its end, the consumer renews it
    for role in ("prefill", "decode"):
        assert connector_config(role, "e", lease_s=8)["kv_connector_extra_config"][
            "kv_lease_duration"] == 8


def test_a_handle_is_claimable_until_two_thirds_of_its_lease():
    handle = KVHandle.model_validate(PRODUCER_PARAMS)
    assert handle.claimable_at(1e12)  # no deadline stamped: always (vLLM's own handles)
    assert handle.lease_running_at(1e12)
    stamped = handle.with_lease(finished_at=1000.0, lease_s=30)
    assert stamped.claimable_at(1000.0) and stamped.claimable_at(1019.9)
    assert not stamped.claimable_at(1020.0) and not stamped.claimable_at(1031.0)
    # past the claim deadline the blocks may still be held (worth releasing) until 1030
    assert stamped.lease_running_at(1029.9) and not stamped.lease_running_at(1030.0)
    # the deadline is pdserve's: vLLM never sees it, and the rest of the handle is unchanged
    assert stamped.to_params() == PRODUCER_PARAMS
    assert KVHandle.model_validate(stamped.model_dump()) == stamped


@given(
    ports_per_replica=st.integers(1, 8),
    replicas=st.integers(1, 16),
    pools=st.integers(1, 6),
)
def test_ports_never_collide(ports_per_replica, replicas, pools):
    plan = PortPlan(base_port=15600, span=16 * 8, ports_per_replica=ports_per_replica)
    used: set[int] = set()
    for pool in range(pools):
        for rank in range(replicas):
            first = side_channel_port(plan, pool, rank)
            block = set(range(first, first + ports_per_replica))
            assert not block & used, "two engines on one node would share a port"
            used |= block


def test_port_plan_limits():
    plan = PortPlan(base_port=15600, span=4, ports_per_replica=2)
    assert side_channel_port(plan, 1, 1) == 15600 + 4 + 2
    with pytest.raises(ValueError, match="side_channel_port_span"):
        side_channel_port(plan, 0, 2)
    with pytest.raises(ValueError, match="out of range"):
        side_channel_port(PortPlan(base_port=65530, span=8), 1, 0)
    with pytest.raises(ValueError):
        PortPlan(base_port=80, span=8)


def test_a_replica_tries_its_own_port_then_its_pools_other_slots_from_the_top():
    """Serve may give a running replica another rank while its engine keeps its port: the
    next replica given the old rank falls back to another slot of the same pool, first
    those no starting replica owns (ranks are given from 0 up)."""
    plan = PortPlan(base_port=15600, span=4)
    assert side_channel_ports_to_try(plan, pool_index=1, replica_rank=1) == [
        15605, 15607, 15606, 15604]
    for rank in range(4):
        ports = side_channel_ports_to_try(plan, pool_index=0, replica_rank=rank)
        assert ports[0] == side_channel_port(plan, 0, rank)
        assert sorted(ports) == list(range(15600, 15604))  # its pool's slice, each once
