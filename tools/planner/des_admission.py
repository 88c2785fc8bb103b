"""The router replicas' admission in a simulation (pure): pdserve's own
``AdmissionController`` per replica, behind Serve's power-of-two-choices proxy.

A request is admitted at once, waits for budget (refused when its wait runs out), or is
refused; a finished answer frees its budget and admits whoever now fits.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from router.admission import AdmissionController
from tools.planner.des_events import EventLoop
from tools.planner.des_requests import SimRequest
from tools.planner.des_spec import RouterTier


class AdmissionTier:
    """Each router replica's admission, and which replica holds each request; without a
    ``RouterTier``, every request goes to ``route`` at once."""

    def __init__(self, tier: RouterTier | None, requests: int, clock: EventLoop,
                 route: Callable[[int], None], refused: Callable[[int], None]) -> None:
        self.tier = tier
        self.controllers = [AdmissionController(tier.admission)
                            for _ in range(tier.replicas)] if tier else []
        self.holding = [0] * len(self.controllers)     # requests each holds (any state)
        self.router_of: dict[int, int] = {}
        self._rng = random.Random(requests)   # not the rankings' rng: their draws stay
        #                                       as without
        self._clock = clock
        self._route = route
        self._refused = refused

    def arrive(self, index: int, request: SimRequest) -> None:
        """Request ``index`` reaches the router tier."""
        if self.controllers:
            self._admit(index, request)
        else:
            self._route(index)

    def _admit(self, index: int, request: SimRequest) -> None:
        """A router replica (the less busy of two drawn) admits, queues or refuses it."""
        tier = self.tier
        first, second = (self._rng.randrange(len(self.controllers)) for _ in range(2))
        router = first if self.holding[first] <= self.holding[second] else second
        self.router_of[index] = router
        self.holding[router] += 1
        cost = request.prompt_tokens + (tier.max_tokens or request.output_tokens)
        long = (tier.long_prompt_tokens is not None
                and request.prompt_tokens >= tier.long_prompt_tokens)
        action = self.controllers[router].request(index, cost, self._clock.now,
                                                  long=long).action
        if action == "admit":
            self._route(index)
        elif action == "queue":
            deadline = self.controllers[router].next_deadline()
            self._clock.at(deadline, lambda: self._expire(router))
        else:
            self._refuse(index)

    def _expire(self, router: int) -> None:
        """``router``'s queue at its deadline: who waited too long is refused."""
        expiry = self.controllers[router].expire(self._clock.now)
        for index in expiry.refused:
            self._refuse(index)
        for index in expiry.admitted:
            self._route(index)

    def _refuse(self, index: int) -> None:
        """Turned away (its conversation ends here: the turns after it never come)."""
        self.holding[self.router_of.pop(index)] -= 1
        self._refused(index)

    def released(self, index: int) -> None:
        """Its answer is done: its router frees its budget and admits who now fits."""
        if not self.controllers:
            return
        router = self.router_of.pop(index)
        self.holding[router] -= 1
        for admitted in self.controllers[router].release(index):
            # routed as an event of its own: this runs inside an engine's step, which
            # must finish before anything reaches that engine
            self._clock.at(self._clock.now, lambda i=admitted: self._route(i))
