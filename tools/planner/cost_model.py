"""How long an engine step takes (pure): a roofline with fixed costs.

A step computes ``new_tokens`` tokens (prompt chunks and one token per decoding sequence)
that attend over ``token_pairs`` (query, key) pairs, and reads the weights once and the
KV cache of every token its sequences hold (``context_tokens``). Its time is the larger of
compute and memory time on ``tp`` accelerators, plus the tensor-parallel all-reduces, plus
a fixed cost per step (scheduling, kernel launches, sampling):

    t = max(F / (tp * peak * mfu(n)), bytes / (tp * bandwidth * mbu))
        + allreduce(tp, n) + step_overhead

With ``tp`` > 1 a layer all-reduces its activations twice (after attention and after the
MLP), ``n * hidden`` values in the activations' dtype (bf16, fp8 weights or not). A ring
moves ``2 (tp - 1) / tp`` of them over each accelerator's links to its peers, at
``allreduce_efficiency`` of their bandwidth, after a latency each (vLLM's own all-reduce
for small messages: a few microseconds): 160 of them a step for Llama-3.1-70B. They are
not overlapped with compute, as vLLM does not overlap them.

``mfu(n) = mfu * n / (n + n_half)``: a small step does not reach the large step's
efficiency (n_half = 0: flat). The defaults, MFU 0.5 and MBU 0.8 with 3 ms per step, are
those of the independent roofline in ../shared/notes/cost-levers-planner.md (B2). A KV
transfer takes ``latency + bytes / (link * efficiency)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tools.planner.hardware import Accelerator
from tools.planner.model import DTYPE_BYTES, ModelShape


@dataclass(frozen=True)
class Roofline:
    model: ModelShape
    accelerator: Accelerator
    tp: int = 1
    compute_dtype: str = "bf16"     # the weights' dtype and the tensor cores' (fp8: W8A8)
    kv_dtype: str = "bf16"
    mfu: float = 0.5
    n_half: float = 0.0
    mbu: float = 0.8
    step_overhead_s: float = 0.003
    allreduce_latency_s: float = 8e-6
    allreduce_efficiency: float = 0.8      # of the peer links' bandwidth (0: no all-reduce)

    def __post_init__(self) -> None:
        if self.tp < 1 or not 0 < self.mfu <= 1 or not 0 < self.mbu <= 1:
            raise ValueError("tp >= 1 and mfu, mbu in (0, 1] required")
        if self.allreduce_latency_s < 0 or not 0 <= self.allreduce_efficiency <= 1:
            raise ValueError("an all-reduce latency >= 0 and efficiency in [0, 1] required")
        self.accelerator.flops(self.compute_dtype)  # refuses a dtype it lacks

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token(self.kv_dtype)

    def kv_capacity_tokens(self, memory_utilization: float = 0.9) -> int:
        """KV tokens that fit beside the weights in ``tp`` accelerators' memory."""
        free = (self.tp * self.accelerator.memory_bytes * memory_utilization
                - self.model.weight_bytes(self.compute_dtype))
        return max(0, int(free // self.kv_bytes_per_token))

    def step_time(self, new_tokens: int, token_pairs: float, context_tokens: int) -> float:
        """Seconds for one step (see the module docstring); 0 for an empty step."""
        if new_tokens <= 0:
            return 0.0
        flops = (self.model.matmul_flops(new_tokens)
                 + self.model.attention_flops(token_pairs))
        efficiency = self.mfu * new_tokens / (new_tokens + self.n_half)
        compute = flops / (self.tp * self.accelerator.flops(self.compute_dtype) * efficiency)
        moved = (self.model.weight_bytes(self.compute_dtype)
                 + (context_tokens + new_tokens) * self.kv_bytes_per_token)
        memory = moved / (self.tp * self.accelerator.memory_bandwidth * self.mbu)
        return max(compute, memory) + self.allreduce_s(new_tokens) + self.step_overhead_s

    def allreduce_s(self, new_tokens: int) -> float:
        """The step's tensor-parallel all-reduces (0 at TP1 or with efficiency 0)."""
        if self.tp == 1 or self.allreduce_efficiency <= 0:
            return 0.0
        moved = (2 * (self.tp - 1) / self.tp * new_tokens * self.model.hidden
                 * DTYPE_BYTES["bf16"])
        each = (self.allreduce_latency_s
                + moved / (self.accelerator.peer_bandwidth * self.allreduce_efficiency))
        return 2 * self.model.layers * each


@dataclass(frozen=True)
class Transfer:
    """A KV transfer between pools: a fixed latency plus bytes over the sender's links."""

    bandwidth: float                # bytes/s, all of one replica's links together
    latency_s: float = 0.002
    efficiency: float = 0.8

    def time(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / (self.bandwidth * self.efficiency)


def measured_transfer(rows: Sequence[Mapping], transport: str, block_kib: int = 16) -> Transfer:
    """The KV transfer ``pdserve bench transfer`` measured over ``transport`` with
    descriptors of ``block_kib`` (its JSON's ``rows``): a least-squares line of each read's
    time on its bytes, so a fixed latency (at least 0) and bytes at the fitted bandwidth,
    taken as measured (efficiency 1)."""
    points = [(row["mib"] * 2**20, row["mib"] * 2**20 / (row["nixl_gbps"] * 1e9))
              for row in rows if row.get("transport", "tcp") == transport
              and row.get("block_kib", 16) == block_kib]
    if len({size for size, _ in points}) < 2:
        raise ValueError(f"bench transfer rows hold fewer than two sizes for {transport!r} "
                         f"with {block_kib} KiB blocks")
    mean_size = sum(size for size, _ in points) / len(points)
    mean_time = sum(time for _, time in points) / len(points)
    slope = (sum((size - mean_size) * (time - mean_time) for size, time in points)
             / sum((size - mean_size) ** 2 for size, _ in points))
    if slope <= 0:
        raise ValueError(f"bench transfer rows for {transport!r} do not grow with size")
    return Transfer(bandwidth=1 / slope, latency_s=max(0.0, mean_time - slope * mean_size),
                    efficiency=1.0)
