"""The ``ray`` section of the config: how `pdserve up` reaches Ray (pure).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from cluster.cores import parse_cores
from cluster.strict import StrictModel


class RayConfig(StrictModel):
    """How `pdserve up` reaches Ray: start a local cluster or join one (`address`)."""

    address: str | None = Field(None, description="e.g. 'auto' to join `ray up`'s cluster")
    num_cpus: int | None = Field(None, ge=1, description="logical CPUs of a local cluster")
    node_ip_address: str | None = Field(
        None, description="IP of a local cluster's node (127.0.0.1 keeps it on loopback)"
    )
    metrics_export_port: int | None = Field(
        8080, ge=1024, le=65535,
        description="where a local cluster's node serves Prometheus /metrics (None: Ray picks)",
    )
    serving_cores: str | None = Field(
        None, description="the cores a local cluster's own processes run on (Ray, Serve's "
        "proxy, the router, the pools' replicas and engine schedulers), e.g. '0'; each "
        "engine computes on its pool's VLLM_CPU_OMP_THREADS_BIND cores. Keep the decode "
        "engines' cores out of it, so nothing takes their steps' time (docs/design.md, "
        "'Engines compute on their own cores'). None: every core",
    )

    @field_validator("serving_cores")
    @classmethod
    def _a_core_list(cls, cores: str | None) -> str | None:
        if cores is not None:
            parse_cores(cores)  # ValueError: pydantic reports it under the field's path
        return cores
