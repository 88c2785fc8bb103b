"""The canary rollout shell (router/canary_rollout.py) under fake time, with fake handles.

Component tier: the module is a Serve deployment (it imports Ray) and runs the evaluation
command; here no Ray is started, the evaluation is a fake, and no real time passes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from cluster import metrics as m
from cluster.config import PDServeConfig
from router import canary_rollout
from router.canary_eval import EvalContext, EvalResult
from router.canary_rollout import SYNC_PERIOD_S, RolloutClient, RolloutController
from router.errors import APIError
from router.timing import RequestTimer
from tests.fake_time import FakeClock, eventually

INTERVAL_S, WINDOW_S = 10, 60
SERVED = {"chat": {"v1": 95, "v2": 5}, "other": {"v1": 1}}
GOOD = [("v1", True, 0.1, 0.01)] * 3 + [("v2", True, 0.1, 0.01)] * 3
BAD = [("v1", True, 0.1, 0.01)] * 3 + [("v2", False, None, None)] * 3


def config(**canary) -> PDServeConfig:
    return PDServeConfig.model_validate({
        "versions": {"v1": {"path": "/models/v1"}, "v2": {"path": "/models/v2"}},
        "served_models": SERVED,
        "canary": {"served_model": "chat", "baseline": "v1", "candidate": "v2",
                   "window_s": WINDOW_S, "min_requests": 3, "interval_s": INTERVAL_S,
                   **canary},
    })


class FakeRecorder:
    """Counts what the controller would export."""

    def __init__(self):
        self.decisions: Counter[str] = Counter()
        self.percent: dict[str, float] = {}

    def inc(self, spec: m.MetricSpec, tags: dict[str, str], value: float = 1.0) -> None:
        assert spec is m.CANARY_DECISIONS and tags["model"] == "chat"
        self.decisions[tags["action"]] += value

    def set(self, spec: m.MetricSpec, tags: dict[str, str], value: float) -> None:
        assert spec is m.CANARY_PERCENT and tags["model"] == "chat"
        self.percent[tags["version"]] = value


def controller_at(clock: FakeClock, recorder: FakeRecorder | None = None,
                  **canary) -> RolloutController:
    """The deployment's class itself (no Serve), on fake time."""
    return RolloutController.func_or_class(config(**canary), clock=clock, sleep=clock.sleep,
                                           recorder=recorder or FakeRecorder())


async def gate_step(clock: FakeClock) -> None:
    """Move to the gate's next turn and wait until it has decided and sleeps again."""
    turn = clock.wake_times[0]
    clock.advance_to(turn)
    await eventually(lambda: clock.wake_times == [turn + INTERVAL_S])


async def started(controller: RolloutController, clock: FakeClock) -> None:
    await controller.sync([])      # the first call starts the gate loop
    await eventually(lambda: clock.wake_times == [clock.now + INTERVAL_S])


async def weights(controller: RolloutController) -> dict[str, int]:
    return (await controller.sync([]))["chat"]


def test_the_gate_holds_then_promotes_after_a_full_window_and_logs_it_once(caplog):
    caplog.set_level(logging.DEBUG, logger="router.canary_rollout")

    async def scenario():
        clock, recorder = FakeClock(), FakeRecorder()
        controller = controller_at(clock, recorder)
        assert recorder.percent == {"v1": 95, "v2": 5}
        await started(controller, clock)
        for _ in range(3):                 # no outcomes: the same hold, three times
            await gate_step(clock)
        assert recorder.decisions == {"hold": 3}
        await controller.sync(GOOD)        # at 30: inside every window up to 90
        await gate_step(clock)             # 40: enough requests, not yet a full window
        await gate_step(clock)             # 50
        assert await weights(controller) == {"v1": 95, "v2": 5}
        await gate_step(clock)             # 60: a full window since the start
        assert await weights(controller) == {"v1": 75, "v2": 25}
        assert recorder.percent == {"v1": 75, "v2": 25}
        assert recorder.decisions == {"hold": 5, "promote": 1}
        described = await controller.describe()
        assert [(d["action"], d["from"], d["to"]) for d in described["decisions"]] == [
            ("promote", 5, 25)]
        assert described["canary"] == {"served_model": "chat", "baseline": "v1",
                                       "candidate": "v2", "percent": 25, "complete": False}
        assert described["served_models"]["other"] == {"v1": 1}
        await gate_step(clock)             # 70: a new window begins at the change
        assert await weights(controller) == {"v1": 75, "v2": 25}

    asyncio.run(scenario())
    holds = [r for r in caplog.records if "hold at" in r.getMessage()]
    # one log line per distinct hold reason: 3 identical "too few", then two waits (40, 50),
    # then one more wait after the promotion (70)
    assert len(holds) == 4 and all(r.levelno == logging.DEBUG for r in holds)
    promotions = [r for r in caplog.records if "promote 5% -> 25%" in r.getMessage()]
    assert len(promotions) == 1 and promotions[0].levelno == logging.WARNING


def test_a_worse_canary_is_rolled_back_at_once_and_stays_back():
    async def scenario():
        clock, recorder = FakeClock(), FakeRecorder()
        controller = controller_at(clock, recorder)
        await started(controller, clock)
        await controller.sync(BAD)
        await gate_step(clock)             # 10: no full window needed to roll back
        assert await weights(controller) == {"v1": 100, "v2": 0}
        assert recorder.percent == {"v1": 100, "v2": 0}
        await controller.sync(GOOD)
        for _ in range(8):                 # at 0% the gate decides nothing any more
            await gate_step(clock)
        assert await weights(controller) == {"v1": 100, "v2": 0}
        assert recorder.decisions == {"rollback": 1}
        described = await controller.describe()
        assert [d["action"] for d in described["decisions"]] == ["rollback"]
        assert "canary worse than baseline" in described["decisions"][0]["reason"]

    asyncio.run(scenario())


def test_promotions_walk_the_steps_until_the_canary_is_the_baseline():
    async def scenario():
        clock = FakeClock()
        controller = controller_at(clock)
        await started(controller, clock)
        seen = []
        for turn in range(1, 25):
            await controller.sync(GOOD)    # fresh outcomes every turn
            await gate_step(clock)
            assert clock.now == turn * INTERVAL_S
            current = await weights(controller)
            if not seen or seen[-1] != current:
                seen.append(current)
        assert seen == [{"v1": 95, "v2": 5}, {"v1": 75, "v2": 25}, {"v1": 50, "v2": 50},
                        {"v2": 1}]
        described = await controller.describe()
        assert described["canary"]["complete"] and described["canary"]["baseline"] == "v2"
        assert [d["to"] for d in described["decisions"]] == [25, 50, 100]

    asyncio.run(scenario())


def fake_evaluation(verdicts: list[EvalResult | Exception], asked: list[EvalContext]):
    async def evaluate(command, context, timeout_s):
        asked.append(context)
        verdict = verdicts.pop(0)
        if isinstance(verdict, Exception):
            raise verdict
        return verdict

    return evaluate


@pytest.mark.parametrize(("rollback_on_veto", "after"), [
    (False, {"v1": 95, "v2": 5}), (True, {"v1": 100, "v2": 0})])
def test_a_vetoed_promotion_holds_or_rolls_back(monkeypatch, rollback_on_veto, after):
    asked: list[EvalContext] = []
    monkeypatch.setattr(canary_rollout, "evaluate", fake_evaluation(
        [EvalResult(False, "accuracy 0.71 < 0.80", 1)], asked))

    async def scenario():
        clock, recorder = FakeClock(), FakeRecorder()
        controller = controller_at(clock, recorder, evaluation_command=["eval"],
                                   rollback_on_veto=rollback_on_veto)
        await started(controller, clock)
        while clock.now < WINDOW_S:
            await controller.sync(GOOD)
            await gate_step(clock)
        assert asked == [EvalContext("v2", "v1", 5, 25)]   # only when it would promote
        assert await weights(controller) == after
        return recorder, await controller.describe()

    recorder, described = asyncio.run(scenario())
    if rollback_on_veto:
        assert recorder.decisions["rollback"] == 1
        assert "accuracy 0.71" in described["decisions"][0]["reason"]
    else:
        assert recorder.decisions["promote"] == 0 and described["decisions"] == []


def test_a_failing_gate_step_is_logged_and_the_gate_keeps_running(monkeypatch, caplog):
    asked: list[EvalContext] = []
    monkeypatch.setattr(canary_rollout, "evaluate", fake_evaluation(
        [RuntimeError("evaluator crashed"), EvalResult(True, "evaluation passed", 0)], asked))

    async def scenario():
        clock = FakeClock()
        controller = controller_at(clock, evaluation_command=["eval"])
        await started(controller, clock)
        while clock.now < WINDOW_S:
            await controller.sync(GOOD)
            await gate_step(clock)
        assert await weights(controller) == {"v1": 95, "v2": 5}   # the failed step: no change
        await gate_step(clock)                                     # the next one promotes
        assert await weights(controller) == {"v1": 75, "v2": 25}

    asyncio.run(scenario())
    assert len(asked) == 2
    assert any("canary gate step failed" in r.getMessage() for r in caplog.records)


# ---- the router's side ------------------------------------------------------------------


class Method:
    def __init__(self, answer):
        self._answer = answer
        self.calls: list[tuple] = []

    def remote(self, *args):
        """Like a Serve handle's: the call is made now, its answer is awaited."""
        self.calls.append(args)
        return self._answer(*args)


class ControllerHandle:
    """A Serve handle to a RolloutController; the first ``failures`` syncs fail."""

    def __init__(self, controller: RolloutController, failures: int = 0,
                 hangs: bool = False):
        """``hangs``: every call is taken and never answered."""
        self._controller = controller
        self.failures = failures
        self.hangs = hangs
        self.sync = Method(self._sync)
        self.describe = Method(self._describe)

    async def _sync(self, samples):
        if self.hangs:
            await asyncio.Event().wait()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("rollout controller unreachable")
        return await self._controller.sync(samples)

    async def _describe(self):
        if self.hangs:
            await asyncio.Event().wait()
        return await self._controller.describe()


def finished_timer() -> RequestTimer:
    timer = RequestTimer(arrival=0.0)
    timer.chunk(0.25, 1)
    timer.chunk(0.75, 2)
    return timer


TIMER = finished_timer()
MEAN_ITL = sum(TIMER.inter_token_gaps) / len(TIMER.inter_token_gaps)


def test_without_a_controller_the_client_serves_the_configs_weights():
    client = RolloutClient(None, SERVED)
    assert client.weights("chat") == {"v1": 95, "v2": 5} and client.weights("nope") is None
    client.record("chat", "v2", "ok", TIMER)   # nobody to tell: ignored
    assert asyncio.run(client.describe()) == {"served_models": SERVED, "canary": None,
                                              "decisions": []}


def test_the_client_sends_outcomes_every_sync_period_and_takes_the_weights_back():
    async def scenario():
        gate_time, client_time = FakeClock(), FakeClock()
        handle = ControllerHandle(controller_at(gate_time))
        client = RolloutClient(handle, SERVED, "chat", sleep=client_time.sleep)
        assert client.weights("chat") == {"v1": 95, "v2": 5}   # starts the sync loop
        await eventually(lambda: client_time.wake_times == [SYNC_PERIOD_S])
        assert handle.sync.calls == [([],)]
        client.record("chat", "v2", "ok", TIMER)
        client.record("chat", "v1", "failed", TIMER)
        client.record("chat", "v1", "rejected", TIMER)      # refusals are not the canary's
        client.record("chat", "v1", "client_error", TIMER)
        client.record("other", "v1", "failed", TIMER)       # not the canary's served name
        client_time.advance(SYNC_PERIOD_S)
        await eventually(lambda: client_time.wake_times == [2 * SYNC_PERIOD_S])
        assert handle.sync.calls[1] == ([("v2", True, TIMER.ttft, MEAN_ITL),
                                         ("v1", False, TIMER.ttft, MEAN_ITL)],)
        # the controller promotes; the client routes by the new weights after its next sync
        while gate_time.now < WINDOW_S:
            await handle.sync.remote(GOOD)   # other routers' outcomes
            await gate_step(gate_time)
        assert client.weights("chat") == {"v1": 95, "v2": 5}
        client_time.advance(SYNC_PERIOD_S)
        await eventually(lambda: client.weights("chat") == {"v1": 75, "v2": 25})
        assert client.weights("other") == {"v1": 1}
        assert (await client.describe())["canary"]["percent"] == 25

    asyncio.run(scenario())


def test_a_request_a_fault_reached_counts_against_its_version_even_when_saved():
    async def scenario():
        gate_time, client_time = FakeClock(), FakeClock()
        handle = ControllerHandle(controller_at(gate_time))
        client = RolloutClient(handle, SERVED, "chat", sleep=client_time.sleep)
        client.weights("chat")  # starts the sync loop
        await eventually(lambda: client_time.wake_times == [SYNC_PERIOD_S])
        client.record("chat", "v2", "ok", TIMER, faulted=True)        # migrated: whole
        client.record("chat", "v2", "rejected", TIMER, faulted=True)  # every attempt failed
        client.record("chat", "v2", "client_error", TIMER)
        client_time.advance(SYNC_PERIOD_S)
        await eventually(lambda: client_time.wake_times == [2 * SYNC_PERIOD_S])
        assert handle.sync.calls[1] == ([("v2", False, TIMER.ttft, MEAN_ITL)] * 2,)

    asyncio.run(scenario())


def test_while_the_controller_is_unreachable_the_client_keeps_its_weights_and_outcomes():
    async def scenario():
        gate_time, client_time = FakeClock(), FakeClock()
        handle = ControllerHandle(controller_at(gate_time), failures=2)
        client = RolloutClient(handle, SERVED, "chat", sleep=client_time.sleep)
        client.weights("chat")
        client.record("chat", "v2", "ok", TIMER)
        await eventually(lambda: client_time.wake_times == [SYNC_PERIOD_S])  # 1st: failed
        client.record("chat", "v1", "ok", TIMER)
        client_time.advance(SYNC_PERIOD_S)
        await eventually(lambda: client_time.wake_times == [2 * SYNC_PERIOD_S])  # 2nd: failed
        assert client.weights("chat") == {"v1": 95, "v2": 5}
        client_time.advance(SYNC_PERIOD_S)
        await eventually(lambda: len(handle.sync.calls) == 3)
        kept = [("v2", True, TIMER.ttft, MEAN_ITL), ("v1", True, TIMER.ttft, MEAN_ITL)]
        assert handle.sync.calls[2] == (kept,)   # nothing lost, nothing sent twice, in order

    asyncio.run(scenario())


def test_a_controller_that_never_answers_holds_no_router(monkeypatch):
    """Its calls are given up after CONTROLLER_CALL_S: the router keeps its weights and
    outcomes and asks again next round; /admin/rollout answers 503."""
    monkeypatch.setattr(canary_rollout, "CONTROLLER_CALL_S", 0.05)

    async def scenario():
        gate_time, client_time = FakeClock(), FakeClock()
        handle = ControllerHandle(controller_at(gate_time), hangs=True)
        client = RolloutClient(handle, SERVED, "chat", sleep=client_time.sleep)
        client.weights("chat")
        client.record("chat", "v2", "ok", TIMER)
        await eventually(lambda: client_time.wake_times == [SYNC_PERIOD_S])  # given up
        assert client.weights("chat") == {"v1": 95, "v2": 5}
        client_time.advance(SYNC_PERIOD_S)
        await eventually(lambda: len(handle.sync.calls) == 2)  # asked again, same outcome
        assert handle.sync.calls[1] == ([("v2", True, TIMER.ttft, MEAN_ITL)],)
        with pytest.raises(APIError) as refused:
            await client.describe()
        assert refused.value.status == 503

    asyncio.run(scenario())
