"""Model versions (pure): which version of a served model answers a request.

A served name maps to weighted versions (``chat -> {"v1": 95, "v2": 5}``; weight 0: never
chosen). With a sticky key (the ``user`` field, else the API key) the choice is weighted
rendezvous hashing over (served name, version, key), so a conversation keeps its version
while the weights hold and a weight change moves keys only onto or off that version;
without one, the injected uniform ``draw`` goes through the cumulative weights in
version-name order. Why: docs/design.md, "Model versions: their own pools, sticky
weighted choice, a gate that steps".
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from router.admission import ANONYMOUS, client_key

_UNIT = float(1 << 53)  # 53 random bits: every point k / 2**53 is an exact float in [0, 1)


def validate_weights(weights: Mapping[str, int]) -> None:
    """Raise ValueError unless ``weights`` are non-negative ints with at least one positive."""
    for name, weight in weights.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"version names must be non-empty strings, got {name!r}")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            raise ValueError(f"weight of {name!r} must be a non-negative int, got {weight!r}")
    if not any(weights.values()):
        raise ValueError(f"at least one version needs a positive weight: {dict(weights)}")


def choose_version(weights: Mapping[str, int], sticky_key: str | None, draw: float | None,
                   *, served_name: str = "") -> str:
    """The version that serves a request.

    With a ``sticky_key`` (non-empty) the choice depends only on (``served_name``, key,
    weights), see the module docstring; ``draw`` is then ignored. Without one, ``draw`` (a
    uniform random number in [0, 1) that the caller injects) picks a version.
    """
    validate_weights(weights)
    if sticky_key:
        return _rendezvous(weights, sticky_key, served_name)
    if draw is None or not 0.0 <= draw < 1.0:
        raise ValueError(f"without a sticky key a draw in [0, 1) is needed, got {draw!r}")
    return _by_draw(weights, draw)


def sticky_key_for(user: str | None, authorization: str | None,
                   by: str = "api_key") -> str | None:
    """The key that keeps a client on one version (``router.version_stickiness``):
    its API key, or with ``by`` "user" its ``user`` field first.

    The API key is hashed the way admission hashes it: raw keys go nowhere. None when the
    request carries none to use (then each request is drawn).
    """
    if by == "user" and user:
        return "user:" + user
    key = client_key(authorization, None)
    return None if key == ANONYMOUS else key


def split_for_canary(baseline: str, canary: str, canary_percent: int) -> dict[str, int]:
    """Weights that send ``canary_percent`` of the traffic to ``canary``, the rest to
    ``baseline``. Both keep an entry (possibly weight 0) so dashboards see both."""
    if baseline == canary:
        raise ValueError(f"the canary must differ from the baseline, both are {baseline!r}")
    if isinstance(canary_percent, bool) or not isinstance(canary_percent, int) \
            or not 0 <= canary_percent <= 100:
        raise ValueError(f"canary_percent must be an int in 0..100, got {canary_percent!r}")
    return {baseline: 100 - canary_percent, canary: canary_percent}


@dataclass(frozen=True)
class Rollout:
    """One served model's versions: a baseline and, while a rollout runs, a canary."""

    served_name: str
    baseline: str
    canary: str | None = None
    canary_percent: int = 0

    def __post_init__(self) -> None:
        if self.canary is None:
            if self.canary_percent != 0:
                raise ValueError("canary_percent must be 0 without a canary")
        else:
            split_for_canary(self.baseline, self.canary, self.canary_percent)  # validates

    @property
    def weights(self) -> dict[str, int]:
        if self.canary is None:
            return {self.baseline: 1}
        return split_for_canary(self.baseline, self.canary, self.canary_percent)

    def choose(self, sticky_key: str | None, draw: float | None) -> str:
        """``choose_version`` over this rollout's weights, salted with its served name."""
        return choose_version(self.weights, sticky_key, draw, served_name=self.served_name)

    def at_percent(self, percent: int) -> Rollout:
        """The rollout after the gate moved the canary to ``percent``.

        At 100 the canary becomes the baseline and the rollout ends. At 0 (rolled back) the
        canary stays named, with no traffic, so an operator sees what was rolled back.
        """
        if self.canary is None:
            raise ValueError(f"{self.served_name!r} has no canary to move")
        if percent == 100:
            return Rollout(self.served_name, self.canary)
        return Rollout(self.served_name, self.baseline, self.canary, percent)


def _rendezvous(weights: Mapping[str, int], key: str, served_name: str) -> str:
    arrivals = ((_exponential(served_name, version, key) / weight, version)
                for version, weight in weights.items() if weight > 0)
    return min(arrivals)[1]  # the name breaks an (improbable) tie, so the result is stable


def _exponential(served_name: str, version: str, key: str) -> float:
    """An Exp(1) sample that is a fixed function of its three inputs."""
    digest = hashlib.blake2b(digest_size=8)
    for part in (served_name, version, key):
        raw = part.encode()
        # length-prefixed, so ("ab", "c") and ("a", "bc") hash differently
        digest.update(len(raw).to_bytes(4, "big") + raw)
    u = (int.from_bytes(digest.digest(), "big") >> 11) / _UNIT  # in [0, 1)
    return -math.log1p(-u)


def _by_draw(weights: Mapping[str, int], draw: float) -> str:
    versions = sorted(name for name, weight in weights.items() if weight > 0)
    bounds = list(itertools.accumulate(weights[name] for name in versions))
    index = bisect.bisect_right(bounds, draw * bounds[-1])
    # draw * total can round up to total for a draw just under 1: that is the last version
    return versions[min(index, len(versions) - 1)]
