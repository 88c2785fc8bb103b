"""The ``canary`` section of the config: a gated rollout of one served name (pure).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from cluster.strict import StrictModel


class CanaryConfig(StrictModel):
    """A canary rollout of one served name: the gate steps the candidate's share up."""

    served_model: str = Field(min_length=1, description="the served name being rolled out")
    baseline: str = Field(description="the version serving today")
    candidate: str = Field(description="the version being rolled out")
    steps: list[int] = Field(default_factory=lambda: [5, 25, 50, 100],
                             description="candidate shares (percent), one per promotion")
    window_s: float = Field(300, gt=0, description="outcomes compared over this window")
    min_requests: int = Field(50, ge=1, description="candidate requests needed to decide")
    max_error_rate_delta: float = Field(
        0.01, ge=0, description="roll back when the candidate's error rate exceeds the "
        "baseline's by more than this (absolute)"
    )
    max_ttft_p95_ratio: float = Field(
        1.2, ge=1, description="roll back when the candidate's p95 TTFT exceeds the "
        "baseline's times this (at least 1: below, a candidate as fast as the baseline "
        "would roll back)")
    max_itl_p95_ratio: float = Field(
        1.2, ge=1, description="the same for p95 inter-token latency")
    interval_s: float = Field(10, gt=0, description="how often the gate decides")
    evaluation_command: list[str] | None = Field(
        None, description="argv run before each promotion; a non-zero exit vetoes it"
    )
    evaluation_timeout_s: float = Field(600, gt=0)
    rollback_on_veto: bool = Field(
        False, description="a veto of the evaluation command rolls back instead of holding")
    max_samples_per_version: int = Field(
        10_000, ge=1, description="outcomes the gate keeps per version (the newest): bounds "
        "its memory; at high traffic the window's statistics are those of the newest")

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[int]) -> list[int]:
        if not steps or steps != sorted(set(steps)) or steps[0] <= 0 or steps[-1] != 100:
            raise ValueError("steps must rise strictly from above 0 to 100")
        return steps
