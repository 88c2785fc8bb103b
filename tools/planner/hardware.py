"""Accelerators the planner sizes clusters of (pure).

Peak dense tensor FLOPs per dtype, memory bandwidth and size, the network bandwidth each
accelerator has to other nodes (what a KV transfer between pools crosses), the bandwidth
to its peers in the node (what tensor-parallel all-reduces cross), and a price per hour.
Peaks are the vendors' datasheet figures (dense, no sparsity); prices are assumptions of
the kind a cloud lists on demand, and an input: `pdserve plan --price`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Accelerator:
    name: str
    peak_flops: dict[str, float]        # dtype -> FLOP/s (dense)
    memory_bandwidth: float             # bytes/s
    memory_bytes: float
    link_bandwidth: float               # bytes/s to other nodes, per accelerator
    price_per_hour: float               # dollars
    peer_bandwidth: float = 450e9       # bytes/s to the node's others, one direction

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s computing in ``dtype``; a dtype without tensor-core support is
        refused rather than guessed."""
        if dtype not in self.peak_flops:
            raise ValueError(f"{self.name} has no {dtype} tensor throughput "
                             f"(has: {', '.join(sorted(self.peak_flops))})")
        return self.peak_flops[dtype]

    def priced(self, price_per_hour: float | None) -> Accelerator:
        return self if price_per_hour is None else replace(self, price_per_hour=price_per_hour)


CATALOG = {
    # H100 SXM: 989 TFLOP/s bf16, 1,979 fp8, 3.35 TB/s HBM3, 80 GB, 400 Gb/s InfiniBand,
    # NVLink 4 (900 GB/s both ways together)
    "h100": Accelerator("h100", {"bf16": 989.4e12, "fp8": 1978.9e12}, 3.35e12, 80e9,
                        50e9, 3.93, 450e9),
    # H200 SXM: the H100's compute and NVLink with 4.8 TB/s HBM3e and 141 GB
    "h200": Accelerator("h200", {"bf16": 989.4e12, "fp8": 1978.9e12}, 4.8e12, 141e9,
                        50e9, 4.50, 450e9),
    # A100 SXM 80 GB: 312 TFLOP/s bf16, no fp8, 2.04 TB/s, 200 Gb/s, NVLink 3 (600 GB/s)
    "a100": Accelerator("a100", {"bf16": 312e12}, 2.039e12, 80e9, 25e9, 2.20, 300e9),
}
