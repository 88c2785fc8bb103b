"""The cluster a simulation runs (pure): its pools, engines' limits and router tier."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cluster.config import DecodeRoutingConfig, PrefillRoutingConfig
from router.admission import AdmissionPolicy
from tools.planner.speculation import Speculation

StepTime = Callable[[int, float, int], float]   # (new tokens, token pairs, context) -> s


@dataclass(frozen=True)
class EngineLimits:
    """One engine's vLLM limits, and its replica's Serve limit on requests held."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    kv_capacity_tokens: int = 10**9
    # Serve's max_ongoing_requests of the pool: a replica holding this many requests
    # turns the next away and the router tries its next choice (None: no limit)
    max_ongoing: int | None = None


@dataclass(frozen=True)
class RouterTier:
    """The router replicas in front of the engines. Each admits by pdserve's own
    ``AdmissionController`` (``admission`` is one replica's policy), and Serve's proxy
    sends a request to the one of two replicas drawn at random with fewer requests in it
    (its power-of-two-choices router). A request costs its prompt plus ``max_tokens``
    (None: its answer's length, a client that asks for what it gets)."""

    replicas: int
    admission: AdmissionPolicy
    max_tokens: int | None = None
    long_prompt_tokens: int | None = None      # the long lane's threshold (None: none)


@dataclass(frozen=True)
class ClusterSpec:
    """The simulated cluster: its pools, their step costs and limits, and its router."""

    prefill_replicas: int
    decode_replicas: int
    prefill_step: StepTime
    decode_step: StepTime
    transfer_s: Callable[[int], float]          # prompt tokens -> seconds
    prefill_limits: EngineLimits = EngineLimits()
    decode_limits: EngineLimits = EngineLimits()
    threshold_tokens: int = 0                   # router.disaggregation_threshold_tokens
    report_interval_s: float = 1.0              # replicas' load reports (0: always fresh)
    block_size: int = 16                        # engine.block_size
    # router.routing.{prefill,decode} (None: the config's defaults)
    prefill_routing: PrefillRoutingConfig | None = None
    decode_routing: DecodeRoutingConfig | None = None
    routers: RouterTier | None = None           # None: every request admitted at once
    # True: every router replica routes on one view (its tally, prefix index and cache
    # belief shared), as if each saw the others' sends: no herding, an optimistic bound
    shared_router_view: bool = False
    # the decode pool's speculative decoding (decode.speculative; None: off)
    speculation: Speculation | None = None
