"""Canary rollouts across the cluster (shell around ``router.canary``/``router.versions``).

One ``RolloutController`` replica owns the weights of the canary's served name. Router
replicas send it the outcomes of finished requests and take the weights in force back in
the same call (``RolloutClient``, twice a second), so every router splits traffic the same
way. Each ``interval_s`` the controller asks the gate: promote runs the evaluation command
first (its veto holds, or rolls back), rollback sets the candidate's share to 0. Every
decision other than a repeated hold is logged with its reason and counted in
``pdserve_canary_decisions_total``; the shares are the gauge ``pdserve_canary_percent``.

Both sides take their clock and their sleep as parameters (``time.monotonic`` and
``asyncio.sleep`` by default), so a test drives the gate and the sync loop with fake time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping

from ray import serve

from cluster import metrics as m
from cluster.config import CanaryConfig, PDServeConfig
from cluster.recorder import Recorder
from router.calls import answer_within
from router.canary import CanaryPolicy, GateDecision, OutcomeWindow, decide
from router.canary_eval import EvalContext, evaluate
from router.errors import service_unavailable
from router.timing import RequestTimer
from router.versions import Rollout

logger = logging.getLogger(__name__)

SYNC_PERIOD_S = 0.5
MAX_PENDING_SAMPLES = 10_000  # if the controller is unreachable, older samples are dropped
CONTROLLER_CALL_S = 5.0  # a call to the rollout controller that takes longer is given up
Sample = tuple[str, bool, float | None, float | None]  # version, ok, ttft, mean ITL
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


def policy_of(canary: CanaryConfig) -> CanaryPolicy:
    return CanaryPolicy.from_config(canary)


def initial_rollout(config: PDServeConfig) -> Rollout:
    canary = config.canary
    weights = config.served_models[canary.served_model]
    percent = round(100 * weights[canary.candidate] / sum(weights.values()))
    return Rollout(canary.served_model, canary.baseline, canary.candidate, percent)


@serve.deployment
class RolloutController:
    """The canary gate of one served name, run every ``interval_s``; the weights' owner.

    ``clock`` times outcomes and changes (the gate's ``now``); ``sleep`` paces the gate loop;
    ``recorder`` takes the decision counter and the share gauges.
    """

    def __init__(self, config: PDServeConfig, *, clock: Clock = time.monotonic,
                 sleep: Sleep = asyncio.sleep, recorder: Recorder | None = None):
        self._clock = clock
        self._sleep = sleep
        self._config = config
        self._canary = config.canary
        self._policy = policy_of(config.canary)
        self._rollout = initial_rollout(config)
        self._window = OutcomeWindow.for_policy(self._policy)
        self._changed_at = clock()
        self._decisions: deque[dict] = deque(maxlen=50)
        self._last_hold_reason: str | None = None
        self._recorder = Recorder() if recorder is None else recorder
        self._loop_task: asyncio.Task | None = None
        self._publish()

    async def sync(self, samples: list[Sample]) -> dict[str, dict[str, int]]:
        """Take finished requests' outcomes; return the weights of every served name."""
        self._ensure_loop()
        now = self._clock()
        for version, ok, ttft, itl in samples:
            self._window.record(now, version, ok, ttft, itl)
        return self.weights()

    def weights(self) -> dict[str, dict[str, int]]:
        served = {name: dict(w) for name, w in self._config.served_models.items()}
        served[self._rollout.served_name] = self._rollout.weights
        return served

    async def describe(self) -> dict:
        """The weights, the canary's state and the latest decisions (holds are not listed)."""
        self._ensure_loop()
        rollout = self._rollout
        return {
            "served_models": self.weights(),
            "canary": {
                "served_model": rollout.served_name, "baseline": rollout.baseline,
                "candidate": rollout.canary, "percent": rollout.canary_percent,
                "complete": rollout.canary is None,
            },
            "decisions": list(self._decisions),
        }

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._gate_loop())

    async def _gate_loop(self) -> None:
        while True:
            await self._sleep(self._canary.interval_s)
            try:
                await self._step()
            except Exception:  # the gate must keep running; the weights stay as they are
                logger.exception("canary gate step failed")

    async def _step(self) -> None:
        rollout = self._rollout
        if rollout.canary is None or rollout.canary_percent == 0:
            return  # done, or rolled back: restarting a rollout is an operator's act
        now = self._clock()
        baseline = self._window.stats(rollout.baseline, now)
        candidate = self._window.stats(rollout.canary, now)
        decision = decide(self._policy, rollout.canary_percent, baseline, candidate, None,
                          now, self._changed_at)
        if decision.action == "promote" and self._canary.evaluation_command:
            verdict = await evaluate(
                self._canary.evaluation_command,
                EvalContext(rollout.canary, rollout.baseline, rollout.canary_percent,
                            decision.to_percent),
                self._canary.evaluation_timeout_s)
            if verdict.veto:
                decision = decide(self._policy, rollout.canary_percent, baseline, candidate,
                                  True, now, self._changed_at, veto_reason=verdict.reason)
        self._apply(decision, now)

    def _apply(self, decision: GateDecision, now: float) -> None:
        self._recorder.inc(m.CANARY_DECISIONS, {"model": self._rollout.served_name,
                                                "action": decision.action})
        if decision.action == "hold":
            # Holds are not listed in _decisions; log one only when its reason changes.
            if decision.reason != self._last_hold_reason:
                logger.debug("canary %s: %s", self._rollout.served_name, decision.reason)
                self._last_hold_reason = decision.reason
            return
        self._last_hold_reason = None
        logger.warning("canary %s: %s", self._rollout.served_name, decision.reason)
        self._decisions.append({"at": time.time(), "action": decision.action,
                                "from": decision.from_percent, "to": decision.to_percent,
                                "reason": decision.reason})
        self._rollout = self._rollout.at_percent(decision.to_percent)
        self._changed_at = now
        self._publish()

    def _publish(self) -> None:
        name = self._rollout.served_name
        shares = split_percent(self._rollout.weights)
        for version in (self._canary.baseline, self._canary.candidate):
            self._recorder.set(m.CANARY_PERCENT, {"model": name, "version": version},
                               shares.get(version, 0))


def split_percent(weights: Mapping[str, int]) -> dict[str, float]:
    total = sum(weights.values())
    return {version: 100 * weight / total for version, weight in weights.items()}


class RolloutClient:
    """The router's side: weights in force, and outcomes sent to the controller.

    Without a controller (no canary configured) the weights are the config's. ``sleep``
    paces the sync loop (every ``SYNC_PERIOD_S``).
    """

    def __init__(self, controller, served_models: Mapping[str, Mapping[str, int]],
                 canary_served_model: str | None = None, *, sleep: Sleep = asyncio.sleep):
        self._controller = controller
        self._sleep = sleep
        self._weights = {name: dict(w) for name, w in served_models.items()}
        self._canary_served_model = canary_served_model
        self._pending: deque[Sample] = deque(maxlen=MAX_PENDING_SAMPLES)
        self._task: asyncio.Task | None = None

    def weights(self, served_name: str) -> dict[str, int] | None:
        self._ensure_sync()
        return self._weights.get(served_name)

    def record(self, model: str, version: str, outcome: m.Outcome,
               timer: RequestTimer, faulted: bool = False) -> None:
        """A request ended: what the canary gate judges. Errors are the server's fault:
        failures, and any request a replica crash, a hung engine or a failed transfer
        reached (``faulted``), even one a retry saved or one answered 503 in the end;
        not refusals, client errors or cancellations."""
        if self._controller is None or model != self._canary_served_model:
            return
        if outcome not in ("ok", "failed") and not faulted:
            return
        gaps = timer.inter_token_gaps
        itl = sum(gaps) / len(gaps) if gaps else None
        self._pending.append((version, outcome == "ok" and not faulted, timer.ttft, itl))

    async def describe(self) -> dict:
        """The rollout's state (``/admin/rollout``); 503 when the controller does not
        answer within ``CONTROLLER_CALL_S``."""
        if self._controller is None:
            return {"served_models": self._weights, "canary": None, "decisions": []}
        try:  # never cancelled: router/calls.py
            return await answer_within(self._controller.describe.remote(),
                                       CONTROLLER_CALL_S)
        except TimeoutError:
            raise service_unavailable(f"the rollout controller did not answer within "
                                      f"{CONTROLLER_CALL_S:g} s") from None

    def _ensure_sync(self) -> None:
        if self._controller is None:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._sync_loop())

    async def _sync_loop(self) -> None:
        while True:
            samples = list(self._pending)
            self._pending.clear()
            try:
                # Bounded: a hung controller must not freeze every router's weights and
                # outcomes; the next round asks again.
                self._weights = await answer_within(self._controller.sync.remote(samples),
                                                    CONTROLLER_CALL_S)
            except Exception as error:  # keep routing on the last weights known
                logger.warning("rollout controller unreachable: %r", error)
                self._pending.extendleft(reversed(samples))
            await self._sleep(SYNC_PERIOD_S)
