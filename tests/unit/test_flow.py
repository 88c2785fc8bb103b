"""The prefill → decode flow (router/flow.py) with fake Serve handles.

What the flow promises: the disaggregated path hands the prefill's KV handle to decode; the
decode-local path skips prefill; a stream that stops before its ``finished`` output (client
gone, consumer error, decode failure) is cancelled, which aborts the request in the decode
engine, and a request cancelled during its prefill cancels the prefill call.

The decode pool streams vLLM ``RequestOutput`` deltas; the flow reads only ``finished`` of
them, so small stand-ins with vLLM's attribute names keep this test free of vLLM.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from cluster.config import Deadlines
from cluster.engine.messages import EngineCrashed, EngineRequest, PrefillResult, Progress
from kv_transfer.handle import KVHandle
from router import flow as flow_module
from router.errors import APIError
from router.flow import DisaggregatedFlow, prepend
from router.retry import RetryPolicy
from tests.fake_time import eventually, settled

# The flow passes the sampling parameters through untouched: any object stands in for them.
REQUEST = EngineRequest("req-1", (1, 2, 3, 4), SimpleNamespace(max_tokens=3, n=1,
                                                               min_tokens=0))
KV = KVHandle(do_remote_prefill=True, remote_engine_id="prefill-0", remote_block_ids=[[7, 8]],
              remote_host="10.0.0.1", remote_port=15600)


@dataclass
class Completion:
    """What the flow's callers read of vLLM's ``CompletionOutput``."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    index: int = 0


@dataclass
class Output:
    """A stand-in for one vLLM ``RequestOutput`` delta: ``finished`` on the last one."""

    request_id: str
    outputs: list[Completion] = field(default_factory=list)
    finished: bool = False


def output(i: int, last: bool = False) -> Output:
    return Output("req-1", [Completion(f"t{i}", [i], "length" if last else None)], last)


def outputs(n: int) -> list[Output]:
    return [output(i, last=i == n - 1) for i in range(n)]


class Method:
    """One method of a fake handle: ``remote`` records the call and returns an awaitable
    (or, for a streaming handle, an async iterator), as Serve's handles do."""

    def __init__(self, answer):
        self._answer = answer
        self.calls: list[tuple] = []

    def remote(self, *args):
        self.calls.append(args)
        return self._answer(*args)


class Response:
    """A unary call's answer as Serve's ``DeploymentResponse`` is one: awaitable, with a
    ``cancel`` that cancels the call in the replica."""

    def __init__(self, coroutine, owner: FakePrefill):
        self._coroutine, self._owner = coroutine, owner

    def __await__(self):
        return self._coroutine.__await__()

    def cancel(self) -> None:
        self._owner.cancel_sent = True


class FakePrefill:
    def __init__(self, result: PrefillResult, block: bool = False):
        self.started = asyncio.Event()
        self.cancelled = False     # the call's coroutine saw the cancellation
        self.cancel_sent = False   # the flow cancelled the call in the replica
        self._result, self._block = result, block
        self.prefill = Method(lambda request: Response(self._prefill(request), self))
        self.stats = Method(self._stats)

    async def _prefill(self, request: EngineRequest) -> PrefillResult:
        self.started.set()
        try:
            if self._block:
                await asyncio.Event().wait()   # runs until the caller cancels it
            return self._result
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def _stats(self) -> dict:
        return {"pool": "prefill"}


class FakeStream:
    """A decode replica's token stream; ``cancel`` is what aborts the request there."""

    def __init__(self, items: list[Output], then: str = "end"):
        self.items = list(items)
        self.then = then   # after the items: "end", "block" (until cancelled) or "fail"
        self.cancelled = False
        self.blocked = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> Output:
        if self.items:
            return self.items.pop(0)
        if self.then == "block":
            self.blocked = True
            await asyncio.Event().wait()
        if self.then == "fail":
            raise ConnectionError("decode replica died")
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class FakeDecode:
    """The decode deployment's handle; ``options(stream=True)`` gives its streaming twin."""

    def __init__(self, stream: FakeStream):
        self.stream = stream
        self.streaming = False
        self.generate = Method(lambda request, handle: stream)
        self.stats = Method(self._stats)
        self.release_handle = Method(self._release)

    async def _release(self, request_id, handle) -> None:
        pass

    def options(self, stream: bool = False) -> FakeDecode:
        twin = FakeDecode(self.stream)
        twin.streaming = stream
        twin.generate = self.generate
        twin.stats = Method(self._refuse_stats)
        return twin

    async def _stats(self) -> dict:
        return {"pool": "decode"}

    async def _refuse_stats(self) -> dict:
        raise AssertionError("a unary call went through the streaming handle")


def flow_with(stream: FakeStream, prefill: FakePrefill | None = None):
    prefill = prefill or FakePrefill(PrefillResult(KV, prompt_tokens=4))
    decode = FakeDecode(stream)
    # Without a retry policy every failure gives up; the classifier is never consulted
    # for what to do, only for the log (and must not import Ray here).
    return DisaggregatedFlow(prefill, decode, classify=lambda error: "unavailable"), \
        prefill, decode


async def collect(flow: DisaggregatedFlow, path: str) -> list[Output]:
    return [item async for item in flow.generate(REQUEST, path)]


def test_the_disaggregated_path_hands_the_prefills_kv_handle_to_decode():
    stream = FakeStream(outputs(3))
    flow, prefill, decode = flow_with(stream)
    assert asyncio.run(collect(flow, "disaggregated")) == outputs(3)
    assert prefill.prefill.calls == [(REQUEST,)]
    assert decode.generate.calls == [(REQUEST, KV)]
    assert not stream.cancelled        # finished: nothing to abort


def test_the_prefill_stage_is_marked_between_the_prefill_and_the_decode_call():
    stream = FakeStream(outputs(1))
    flow, prefill, decode = flow_with(stream)
    seen = []

    async def run(path: str) -> None:
        def mark() -> None:  # what the pools were asked by then
            seen.append((path, len(prefill.prefill.calls), len(decode.generate.calls)))
        async for _ in flow.generate(REQUEST, path, on_prefilled=mark):
            pass

    asyncio.run(run("disaggregated"))
    asyncio.run(run("decode_local"))
    assert seen == [("disaggregated", 1, 0)]  # after the prefill, before decode; once


def test_the_decode_local_path_skips_prefill():
    stream = FakeStream(outputs(2))
    flow, prefill, decode = flow_with(stream)
    assert asyncio.run(collect(flow, "decode_local")) == outputs(2)
    assert prefill.prefill.calls == []
    assert decode.generate.calls == [(REQUEST, None)]
    assert not stream.cancelled


def test_the_outputs_reach_the_caller_as_the_decode_pool_sent_them():
    sent = outputs(3)
    flow, _, _ = flow_with(FakeStream(list(sent)))
    received = asyncio.run(collect(flow, "disaggregated"))
    assert all(got is want for got, want in zip(received, sent, strict=True))


def test_a_stream_that_ends_without_a_finished_output_is_aborted():
    # One choice of n=2 is done ("stop"), the request is not: only ``finished`` ends it.
    unfinished = Output("req-1", [Completion("a", [1], "stop", index=0)], finished=False)
    stream = FakeStream([unfinished])
    flow, _, _ = flow_with(stream)
    assert asyncio.run(collect(flow, "decode_local")) == [unfinished]
    assert stream.cancelled


def test_a_prefill_that_kept_no_kv_still_decodes_without_a_handle():
    stream = FakeStream(outputs(1))
    flow, _, decode = flow_with(stream, FakePrefill(PrefillResult(None, prompt_tokens=4)))
    asyncio.run(collect(flow, "disaggregated"))
    assert decode.generate.calls == [(REQUEST, None)]


@pytest.mark.parametrize("path", ["disaggregated", "decode_local"])
def test_a_client_that_stops_reading_aborts_the_decode_request(path):
    stream = FakeStream(outputs(3))
    flow, prefill, _ = flow_with(stream)

    async def read_one_then_leave():
        tokens = flow.generate(REQUEST, path)
        first = await anext(tokens)
        await tokens.aclose()          # what the server does when the client disconnects
        return first

    assert asyncio.run(read_one_then_leave()) == outputs(3)[0]
    assert stream.cancelled
    # the prefill side is called once at most: its blocks are freed by the decode engine's
    # connector (or their lease), not by a second call from the router
    assert len(prefill.prefill.calls) == (1 if path == "disaggregated" else 0)


@pytest.mark.parametrize("path", ["disaggregated", "decode_local"])
def test_a_client_cancelled_while_waiting_for_tokens_aborts_the_decode_request(path):
    stream = FakeStream([output(0)], then="block")  # unfinished, then quiet
    flow, _, _ = flow_with(stream)

    async def cancel_midway():
        reader = asyncio.ensure_future(collect(flow, path))
        await eventually(lambda: stream.blocked)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settled(reader)

    asyncio.run(cancel_midway())
    assert stream.cancelled


def test_an_error_in_the_consumer_aborts_the_decode_request():
    stream = FakeStream(outputs(3))
    flow, _, _ = flow_with(stream)

    async def fail_while_reading():
        async for _ in flow.generate(REQUEST, "disaggregated"):
            raise ValueError("the client's connection broke")

    with pytest.raises(ValueError):
        asyncio.run(fail_while_reading())
    assert stream.cancelled


def test_a_decode_failure_midstream_reaches_the_caller_and_aborts_the_request():
    stream = FakeStream(outputs(3)[:1], then="fail")
    flow, _, _ = flow_with(stream)
    with pytest.raises(ConnectionError):
        asyncio.run(collect(flow, "disaggregated"))
    assert stream.cancelled   # no truncated answer that looks complete, no engine left working


def test_cancelling_during_prefill_cancels_the_prefill_call_and_never_decodes():
    stream = FakeStream(outputs(1))
    flow, prefill, decode = flow_with(stream, FakePrefill(PrefillResult(KV, 4), block=True))

    async def cancel_in_prefill():
        reader = asyncio.ensure_future(collect(flow, "disaggregated"))
        await eventually(prefill.started.is_set)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settled(reader)

    asyncio.run(cancel_in_prefill())
    assert prefill.cancelled and prefill.cancel_sent
    assert decode.generate.calls == []


def test_pool_stats_asks_one_replica_of_each_pool_through_unary_calls():
    flow, prefill, decode = flow_with(FakeStream([]))
    stats = asyncio.run(flow.pool_stats())
    assert stats == {"prefill": {"pool": "prefill"}, "decode": {"pool": "decode"}}
    assert prefill.stats.calls == [()] and decode.stats.calls == [()]


def test_pool_stats_answers_503_naming_a_pool_that_does_not_answer(monkeypatch):
    """A replica that takes the call and never answers must not hold /admin/stats for
    good (it did, after an engine's death)."""
    monkeypatch.setattr(flow_module, "POOL_STATS_S", 0.05)
    flow, _, decode = flow_with(FakeStream([]))
    silent = FakePrefill(PrefillResult(KV, 4), block=True)
    decode.stats = Method(lambda: Response(silent._prefill(REQUEST), silent))
    async def ask():
        with pytest.raises(APIError) as caught:
            await flow.pool_stats()
        # answered, and the call left to finish: a Serve call cancelled while it waits
        # for a replica held up the deployment's next calls (router/calls.py)
        assert not silent.cancel_sent
        return caught.value

    refusal = asyncio.run(ask())
    assert refusal.status == 503 and "decode pool" in refusal.message


def test_prepend_puts_a_taken_head_back_in_front_of_the_stream():
    async def rest():
        for item in outputs(3)[1:]:
            yield item

    async def read():
        return [item async for item in prepend(outputs(3)[0], rest())]

    assert asyncio.run(read()) == outputs(3)


# ---- retries, fallback and migration (decisions: router/retry.py) ----------------------


class FlakyPrefill(FakePrefill):
    """Fails its first ``failures`` calls as a dead replica would, then answers."""

    def __init__(self, failures: int, block: bool = False):
        super().__init__(PrefillResult(KV, prompt_tokens=4), block=block)
        self.failures = failures

    async def _prefill(self, request: EngineRequest) -> PrefillResult:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("prefill replica died")
        return await super()._prefill(request)


class Replicas(FakeDecode):
    """A decode pool whose successive calls get successive streams (one per replica)."""

    def __init__(self, *streams: FakeStream):
        super().__init__(streams[0])
        queue = list(streams)
        self.generate = Method(lambda request, handle: queue.pop(0))


def retrying(prefill, decode, prefill_replicas=lambda: None, routed_to=None, **deadlines):
    noted = []
    flow = DisaggregatedFlow(
        prefill, decode, retry=RetryPolicy(), prefill_replicas=prefill_replicas,
        routed_to=routed_to or (lambda stage, request_id: None),
        classify=lambda error: (
            "deadline" if isinstance(error, TimeoutError) else "unavailable"),
        deadlines=Deadlines(**{"prefill_s": None, "first_token_s": None,
                               "token_gap_s": None, **deadlines}),
        on_retry=lambda stage, failure, action, request_id: noted.append(
            (stage, failure, action)))
    return flow, noted


def test_a_failed_prefill_is_retried_and_its_handle_used():
    prefill, decode = FlakyPrefill(failures=1), FakeDecode(FakeStream(outputs(2)))
    flow, noted = retrying(prefill, decode)
    assert asyncio.run(collect(flow, "disaggregated")) == outputs(2)
    assert len(prefill.prefill.calls) == 2 and decode.generate.calls == [(REQUEST, KV)]
    assert noted == [("prefill", "unavailable", "retry_prefill")]


def test_a_prefill_that_keeps_failing_is_left_to_the_decode_engine():
    prefill, decode = FlakyPrefill(failures=5), FakeDecode(FakeStream(outputs(2)))
    flow, noted = retrying(prefill, decode)
    assert asyncio.run(collect(flow, "disaggregated")) == outputs(2)
    assert decode.generate.calls == [(REQUEST, None)]  # decode-local: no handle
    assert [action for *_, action in noted] == ["retry_prefill", "decode_local"]


def test_a_hung_prefill_passes_its_deadline_and_is_cancelled():
    prefill, decode = FakePrefill(PrefillResult(KV, 4), block=True), FakeDecode(
        FakeStream(outputs(1)))
    flow, noted = retrying(prefill, decode, prefill_s=0.05)
    assert asyncio.run(collect(flow, "disaggregated")) == outputs(1)
    assert prefill.cancelled and prefill.cancel_sent
    assert decode.generate.calls == [(REQUEST, None)]
    assert noted == [("prefill", "deadline", "retry_prefill"),
                     ("prefill", "deadline", "decode_local")]


def test_with_no_prefill_replica_the_decode_engine_prefills_at_once():
    prefill, decode = FakePrefill(PrefillResult(KV, 4)), FakeDecode(FakeStream(outputs(1)))
    flow, noted = retrying(prefill, decode, prefill_replicas=lambda: 0)
    assert asyncio.run(collect(flow, "disaggregated")) == outputs(1)
    assert prefill.prefill.calls == [] and decode.generate.calls == [(REQUEST, None)]
    assert noted == [("prefill", "unavailable", "decode_local")]


def test_a_prompt_waiting_for_a_prefill_pool_that_empties_goes_to_the_decode_engine():
    """Its replica died and Serve would hold the call until a replacement starts."""
    replicas = [2]
    prefill = FakePrefill(PrefillResult(KV, 4), block=True)
    decode = FakeDecode(FakeStream(outputs(1)))
    flow, noted = retrying(prefill, decode, prefill_replicas=lambda: replicas[0])

    async def run():
        reader = asyncio.ensure_future(collect(flow, "disaggregated"))
        await eventually(prefill.started.is_set)
        replicas[0] = 0
        return await settled(reader)

    assert asyncio.run(run()) == outputs(1)
    assert len(prefill.prefill.calls) == 1 and prefill.cancel_sent
    assert decode.generate.calls == [(REQUEST, None)]
    assert noted == [("prefill", "unavailable", "decode_local")]


def test_a_decode_that_fails_before_its_first_token_runs_again_decode_local():
    dead, alive = FakeStream([], then="fail"), FakeStream(outputs(3))
    decode = Replicas(dead, alive)
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode)
    assert asyncio.run(collect(flow, "disaggregated")) == outputs(3)
    (first, handle), (again, no_handle) = decode.generate.calls
    assert (first, handle) == (REQUEST, KV) and no_handle is None
    assert again.prompt_token_ids == REQUEST.prompt_token_ids
    assert again.request_id != REQUEST.request_id  # the dead engine may still hold the id
    assert dead.cancelled and noted == [("decode", "unavailable", "decode_local")]
    # The handle nobody will pull now is given up, so the prefill engine frees its blocks.
    assert [handle for _, handle in decode.release_handle.calls] == [KV]


def test_a_decode_past_its_first_token_deadline_leaves_the_handle_to_its_lease():
    """The replica may be slow, not gone: freed at once, the blocks could be reused by the
    prefill engine for another prompt while it still pulls them."""
    slow = FakeStream([], then="block")
    decode = Replicas(slow, FakeStream(outputs(3)))
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode, first_token_s=0.05)
    assert asyncio.run(collect(flow, "disaggregated")) == outputs(3)
    assert slow.cancelled and noted == [("decode", "deadline", "decode_local")]
    assert decode.release_handle.calls == []


def test_a_decode_that_fails_midstream_is_continued_with_the_tokens_already_sent():
    sent = outputs(3)
    dead = FakeStream(sent[:1], then="fail")          # token 0 reached the client
    alive = FakeStream([output(1), output(2, last=True)])
    decode = Replicas(dead, alive)
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode)
    received = asyncio.run(collect(flow, "disaggregated"))
    assert [o.outputs[0].token_ids for o in received] == [[0], [1], [2]]  # none lost or doubled
    continued, handle = decode.generate.calls[1]
    assert continued.prompt_token_ids == (*REQUEST.prompt_token_ids, 0) and handle is None
    assert continued.sampling.max_tokens == REQUEST.sampling.max_tokens - 1
    assert REQUEST.sampling.max_tokens == 3  # the client's request is left as it was
    assert noted == [("decode", "unavailable", "migrate")]
    assert decode.release_handle.calls == []  # pulled already: tokens came from it


def test_a_hung_decode_passes_its_gap_deadline_and_is_continued():
    hung = FakeStream(outputs(3)[:1], then="block")
    decode = Replicas(hung, FakeStream([output(1), output(2, last=True)]))
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode, token_gap_s=0.05)
    assert len(asyncio.run(collect(flow, "decode_local"))) == 3
    assert hung.cancelled and noted == [("decode", "deadline", "migrate")]


def where_routed(calls: list[tuple[str, str]]):
    """A ``routed_to`` that names each call's replica after its stage and request id."""
    def routed_to(stage: str, request_id: str) -> str:
        calls.append((stage, request_id))
        return f"{stage}:{request_id}"
    return routed_to


def test_a_continuation_keeps_off_the_replica_whose_engine_hung_and_every_one_before():
    """The hung replica still reports the load it had when it stopped: the router could
    send the continuation straight back, so the request names it (and a second hung one
    after it)."""
    first, second = (FakeStream(outputs(3)[:1], then="block"),
                     FakeStream([output(1)], then="block"))
    decode = Replicas(first, second, FakeStream([output(2, last=True)]))
    asked: list[tuple[str, str]] = []
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode, token_gap_s=0.05,
                           routed_to=where_routed(asked))
    assert len(asyncio.run(collect(flow, "decode_local"))) == 3
    (one, _), (two, _), (three, _) = decode.generate.calls
    assert one.avoid_replicas == ()
    assert two.avoid_replicas == (f"decode:{one.request_id}",)
    assert three.avoid_replicas == (f"decode:{one.request_id}", f"decode:{two.request_id}")
    assert noted == [("decode", "deadline", "migrate")] * 2


def test_a_retry_after_a_replica_died_avoids_nothing_serve_drops_it_anyway():
    decode = Replicas(FakeStream([], then="fail"), FakeStream(outputs(1)))
    asked: list[tuple[str, str]] = []
    flow = DisaggregatedFlow(
        FakePrefill(PrefillResult(KV, 4)), decode, retry=RetryPolicy(),
        classify=lambda error: "died", routed_to=where_routed(asked))
    assert len(asyncio.run(collect(flow, "decode_local"))) == 1
    assert decode.generate.calls[1][0].avoid_replicas == () and asked == []


def test_a_prefill_retried_after_its_deadline_keeps_off_the_hung_replica():
    prefill, decode = FakePrefill(PrefillResult(KV, 4), block=True), FakeDecode(
        FakeStream(outputs(1)))
    flow, _ = retrying(prefill, decode, prefill_s=0.05, routed_to=where_routed([]))
    asyncio.run(collect(flow, "disaggregated"))
    (first,), (second,) = prefill.prefill.calls
    assert (first.avoid_replicas, second.avoid_replicas) == ((), ("prefill:req-1",))
    assert decode.generate.calls[0][0].avoid_replicas == ()   # prefill replicas only


def test_a_one_piece_answer_is_held_to_the_gap_deadline_by_its_replicas_progress():
    """vLLM returns a unary answer whole: its decode replica sends a Progress while its
    engine works (decode/progress.py), three per gap deadline, and the router passes
    none of them on."""
    answer = output(2, last=True)
    decode = FakeDecode(FakeStream([Progress(), Progress(), answer]))
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode,
                           first_token_s=2, token_gap_s=0.6)
    received = asyncio.run(_collect_one_piece(flow))
    assert received == [answer] and noted == []
    (sent, _), = decode.generate.calls
    assert sent.progress_interval_s == pytest.approx(0.2)
    assert flow._first_output_deadline(sent, one_piece=True) == 2


def test_a_one_piece_answer_whose_progress_stops_passes_its_gap_deadline_and_runs_again():
    hung = FakeStream([Progress()], then="block")     # its engine stopped stepping
    answer = output(2, last=True)
    decode = Replicas(hung, FakeStream([answer]))
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode,
                           first_token_s=30, token_gap_s=0.05)
    assert asyncio.run(_collect_one_piece(flow)) == [answer]
    assert hung.cancelled and noted == [("decode", "deadline", "decode_local")]


def test_without_a_gap_deadline_a_one_piece_answer_has_no_progress_and_its_first_deadline():
    flow, _ = retrying(FakePrefill(PrefillResult(KV, 4)), FakeDecode(FakeStream([])),
                       first_token_s=2)
    assert flow._first_output_deadline(REQUEST, one_piece=True) is None
    assert flow._first_output_deadline(REQUEST, one_piece=False) == 2


async def _collect_one_piece(flow: DisaggregatedFlow) -> list[Output]:
    return [item async for item in flow.generate(REQUEST, "decode_local", one_piece=True)]


def test_when_every_attempt_failed_the_failure_reaches_the_caller():
    decode = Replicas(FakeStream([], then="fail"), FakeStream([], then="fail"))
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode)
    with pytest.raises(ConnectionError):
        asyncio.run(collect(flow, "decode_local"))
    assert [action for *_, action in noted] == ["decode_local", "give_up"]


def test_a_pools_health_is_one_answer_from_one_of_its_replicas():
    flow, prefill, decode = flow_with(FakeStream([]))
    asyncio.run(flow.pool_answers("prefill"))
    asyncio.run(flow.pool_answers("decode"))
    assert len(prefill.stats.calls) == 1 and len(decode.stats.calls) == 1


def with_breaker(prefill_failures: int):
    """A flow with a 10 s prefill cooldown on a clock the test moves."""
    clock = SimpleNamespace(now=0.0)
    prefill, decode = FlakyPrefill(prefill_failures), FakeDecode(FakeStream([]))
    decode.generate = Method(lambda request, handle: FakeStream(outputs(1)))
    flow = DisaggregatedFlow(prefill, decode, retry=RetryPolicy(prefill_cooldown_s=10),
                             classify=lambda error: "unavailable", clock=lambda: clock.now)
    return flow, prefill, decode, clock


def test_after_the_prefill_pool_failed_as_a_whole_prompts_skip_it_for_a_while():
    flow, prefill, decode, clock = with_breaker(prefill_failures=2)
    asyncio.run(collect(flow, "disaggregated"))      # both attempts fail: decode-local
    assert len(prefill.prefill.calls) == 2
    clock.now = 9.0
    asyncio.run(collect(flow, "disaggregated"))      # the pool is skipped: no wait for it
    assert len(prefill.prefill.calls) == 2 and decode.generate.calls[-1][1] is None
    clock.now = 10.0
    asyncio.run(collect(flow, "disaggregated"))      # tried again, and it answers now
    assert len(prefill.prefill.calls) == 3 and decode.generate.calls[-1][1] == KV


def test_one_failed_prefill_attempt_saved_by_its_retry_does_not_close_the_pool():
    flow, prefill, _, _ = with_breaker(prefill_failures=1)
    asyncio.run(collect(flow, "disaggregated"))
    asyncio.run(collect(flow, "disaggregated"))
    assert len(prefill.prefill.calls) == 3  # the second request went to the pool


def test_every_pool_call_names_the_router_replica_that_reads_it():
    prefill = FakePrefill(PrefillResult(KV, prompt_tokens=4))
    decode = FakeDecode(FakeStream(outputs(2)))
    caller = ("serve", "SERVE_REPLICA::pdserve#router#abc")
    flow = DisaggregatedFlow(prefill, decode, classify=lambda error: "unavailable",
                             caller=caller)
    asyncio.run(collect(flow, "disaggregated"))
    ((prefilled,),), ((decoded, _),) = prefill.prefill.calls, decode.generate.calls
    assert prefilled.caller == decoded.caller == caller
    assert decoded.request_id == REQUEST.request_id


def ended_by_engine(reason: str) -> Output:
    return Output("req-1", [Completion("", [], reason)], True)


@pytest.mark.parametrize("reason", ["error", "abort"])
def test_a_request_the_engine_ended_on_its_own_is_run_again_not_answered(reason):
    """Before its first token: again decode-local; after tokens: continued."""
    early = Replicas(FakeStream([ended_by_engine(reason)]), FakeStream(outputs(2)))
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), early)
    assert asyncio.run(collect(flow, "disaggregated")) == outputs(2)
    assert noted == [("decode", "unavailable", "decode_local")]

    late = Replicas(FakeStream([output(0), ended_by_engine(reason)]),
                    FakeStream([output(1), output(2, last=True)]))
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), late)
    assert asyncio.run(collect(flow, "decode_local")) == outputs(3)
    assert noted == [("decode", "unavailable", "migrate")]


def test_an_engine_ending_every_attempt_is_a_503_never_a_finished_answer():
    endings = [FakeStream([ended_by_engine("error")]) for _ in range(3)]
    flow, _ = retrying(FakePrefill(PrefillResult(KV, 4)), Replicas(*endings))
    with pytest.raises(APIError) as caught:
        asyncio.run(collect(flow, "decode_local"))
    assert caught.value.status == 503 and "Retry-After" in caught.value.headers


def released_after_a_failed_decode(release, failure: str) -> Replicas:
    """A disaggregated request whose first decode fails with ``failure`` before its first
    token and whose retry answers; its handle is given up through ``release``. The
    decode pool, once the background release has ended."""
    decode = Replicas(FakeStream([], then="fail"), FakeStream(outputs(1)))
    decode.release_handle = Method(release)
    flow = DisaggregatedFlow(
        FakePrefill(PrefillResult(KV, 4)), decode, retry=RetryPolicy(),
        classify=lambda error: failure)

    async def run():
        received = await collect(flow, "disaggregated")
        await eventually(lambda: not flow._releases)  # the release runs in the background
        return received

    assert asyncio.run(run()) == outputs(1)
    return decode


def test_giving_a_handle_up_is_asked_again_past_replicas_that_died():
    class Died(Exception):
        pass

    refusals = [Died(), Died()]

    async def release(request_id, handle) -> None:
        if refusals:
            raise refusals.pop(0)

    decode = released_after_a_failed_decode(release, "died")
    assert len(decode.release_handle.calls) == 3  # two met dead replicas, the third freed it


def test_a_release_a_replica_never_answers_is_given_up_at_its_deadline(monkeypatch):
    """The flow stops waiting (its release task ends); the call itself is left to finish,
    never cancelled (router/calls.py)."""
    monkeypatch.setattr(flow_module, "RELEASE_S", 0.05)

    async def release(request_id, handle) -> None:
        await asyncio.Event().wait()   # took the call, answers nothing

    decode = released_after_a_failed_decode(release, "unavailable")
    assert len(decode.release_handle.calls) == 1


def test_when_the_whole_requests_deadline_passes_nothing_is_retried():
    hung = FakeStream([output(0)], then="block")
    decode = Replicas(hung, FakeStream(outputs(3)))
    noted = []
    flow = DisaggregatedFlow(
        FakePrefill(PrefillResult(KV, 4)), decode, retry=RetryPolicy(request_s=0.05),
        classify=lambda error: "deadline" if isinstance(error, TimeoutError) else "internal",
        on_retry=lambda stage, failure, action, request_id: noted.append((failure, action)))

    async def run():
        received = []
        with pytest.raises(TimeoutError):
            async for item in flow.generate(REQUEST, "decode_local"):
                received.append(item)
        return received

    assert asyncio.run(run()) == [output(0)]  # no gap deadline: the request's own ended it
    assert hung.cancelled and noted == [("deadline", "give_up")]
    assert len(decode.generate.calls) == 1


class CrashingStream(FakeStream):
    """A stream whose engine dies of its own error after ``items``, with
    ``requests_in_engine`` requests in it."""

    def __init__(self, items: list[Output], requests_in_engine: int):
        super().__init__(items)
        self.requests_in_engine = requests_in_engine

    async def __anext__(self) -> Output:
        if self.items:
            return self.items.pop(0)
        raise EngineCrashed("attempt", self.requests_in_engine)


def crash_aware(prefill, decode):
    """A retrying flow whose classifier tells crashes apart as router.failures does."""
    flow, noted = retrying(prefill, decode)
    flow._classify = lambda error: (
        ("crashed" if error.requests_in_engine <= 1 else "crashed_shared")
        if isinstance(error, EngineCrashed) else "unavailable")
    return flow, noted


def test_a_request_alone_in_a_crashed_engine_is_answered_500_and_sent_nowhere_else():
    crashed = CrashingStream(outputs(3)[:1], requests_in_engine=1)
    decode = Replicas(crashed, FakeStream(outputs(3)))
    flow, noted = crash_aware(FakePrefill(PrefillResult(KV, 4)), decode)
    with pytest.raises(APIError) as refused:
        asyncio.run(collect(flow, "decode_local"))
    assert refused.value.status == 500 and refused.value.type == "internal_error"
    assert REQUEST.request_id in refused.value.message
    assert len(decode.generate.calls) == 1 and crashed.cancelled
    assert noted == [("decode", "crashed", "quarantine")]


def test_a_resend_of_a_quarantined_request_is_refused_before_any_engine_sees_it():
    """OpenAI's SDKs resend a 500 twice by default: each resend would meet a fresh engine.
    The same request (prompt and sampling) is answered at once; another one runs."""
    crashed = CrashingStream(outputs(3)[:1], requests_in_engine=1)
    decode = Replicas(crashed, FakeStream(outputs(3)), FakeStream(outputs(3)))
    flow, noted = crash_aware(FakePrefill(PrefillResult(KV, 4)), decode)
    with pytest.raises(APIError):
        asyncio.run(collect(flow, "decode_local"))
    resend = EngineRequest("req-again", REQUEST.prompt_token_ids, REQUEST.sampling)
    with pytest.raises(APIError) as refused:
        asyncio.run(_collect_request(flow, resend))
    assert refused.value.status == 500 and "req-again" in refused.value.message
    assert len(decode.generate.calls) == 1
    assert noted[-1] == ("decode", "crashed", "refuse_resend")
    other = EngineRequest("req-other", (*REQUEST.prompt_token_ids, 9), REQUEST.sampling)
    assert asyncio.run(_collect_request(flow, other)) == outputs(3)


async def _collect_request(flow: DisaggregatedFlow, request: EngineRequest) -> list[Output]:
    return [item async for item in flow.generate(request, "decode_local")]


def test_a_crash_among_others_is_retried_and_a_second_one_quarantines():
    first = CrashingStream(outputs(3)[:1], requests_in_engine=3)
    second = CrashingStream([], requests_in_engine=2)
    decode = Replicas(first, second, FakeStream(outputs(3)))
    flow, noted = crash_aware(FakePrefill(PrefillResult(KV, 4)), decode)
    with pytest.raises(APIError) as refused:
        asyncio.run(collect(flow, "decode_local"))
    assert refused.value.status == 500 and len(decode.generate.calls) == 2
    assert noted == [("decode", "crashed_shared", "migrate"),
                     ("decode", "crashed_shared", "quarantine")]


def test_a_prompt_that_crashed_its_prefill_engine_alone_is_not_given_to_a_decode_engine():
    class CrashingPrefill(FakePrefill):
        async def _prefill(self, request):
            raise EngineCrashed(request.request_id, 1)

    decode = FakeDecode(FakeStream(outputs(1)))
    flow, noted = crash_aware(CrashingPrefill(PrefillResult(KV, 4)), decode)
    with pytest.raises(APIError):
        asyncio.run(collect(flow, "disaggregated"))
    assert decode.generate.calls == [] and noted == [("prefill", "crashed", "quarantine")]


def test_a_stream_whose_continuation_would_differ_ends_saying_so_instead():
    """Its stop strings held text back: continued, the answer would miss that text."""
    request = EngineRequest("req-stop", (1, 2, 3, 4), SimpleNamespace(
        max_tokens=3, n=1, min_tokens=0, stop=["END"]))
    dead = FakeStream(outputs(3)[:1], then="fail")
    decode = Replicas(dead, FakeStream(outputs(3)))
    flow, noted = retrying(FakePrefill(PrefillResult(KV, 4)), decode)

    async def collect_stop() -> list[Output]:
        return [item async for item in flow.generate(request, "decode_local")]

    with pytest.raises(APIError) as refused:
        asyncio.run(collect_stop())
    assert refused.value.status == 503 and "held back" in refused.value.message
    assert len(decode.generate.calls) == 1 and noted == [("decode", "unavailable", "give_up")]
