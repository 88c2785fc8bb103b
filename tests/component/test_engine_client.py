"""``PDEngineClient.generate`` (router/engine_client.py) over a fake flow and admission gate.

What it promises vLLM's serving layer: a rendered prompt is checked against the vocabulary
before admission, admitted for the most KV it can come to hold, routed by what its sampling
allows, and answered with vLLM ``RequestOutput``s carrying the prompt's token ids again
(the decode pool drops them): every delta when the layer streams, else one final output
that aggregates them. However the generation ends (finished, failed, closed early by the
layer) the admission ticket goes back and the flow's stream is closed; a failure is kept
on the request's lifecycle for the router to answer.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from router.engine_client import PDEngineClient, prefix_cache_salt
from router.errors import APIError
from router.lifecycle import RequestLifecycle
from tests.fake_observer import RecordingObserver
from tests.fake_time import eventually, settled

_outputs = pytest.importorskip("vllm.outputs")
_sampling = pytest.importorskip("vllm.sampling_params")
_exceptions = pytest.importorskip("vllm.exceptions")
CompletionOutput, RequestOutput = _outputs.CompletionOutput, _outputs.RequestOutput
RequestOutputKind, SamplingParams = _sampling.RequestOutputKind, _sampling.SamplingParams

VOCAB = 259
THRESHOLD = 16
KEY = "0123abcd"
CHAT_ID = f"chatcmpl-{KEY}"
SHORT = [1, 2, 3]                   # under the threshold: decode-local
LONG = list(range(40))              # at or over it: through the prefill pool


def delta(request_id: str, step: int, steps: int, choices: int = 1) -> RequestOutput:
    """One decode-pool delta: two tokens per choice, without the prompt's token ids."""
    last = step == steps - 1
    outputs = [CompletionOutput(index=i, text=f"s{step}c{i}", token_ids=[10 + step, 20 + i],
                                cumulative_logprob=None, logprobs=None,
                                finish_reason="length" if last else None)
               for i in range(choices)]
    return RequestOutput(request_id, None, None, None, outputs, last, num_cached_tokens=2)


class FakeFlow:
    """``DisaggregatedFlow.generate`` as the client calls it: deltas, then optionally a
    failure or a wait until the consumer goes away; remembers how each stream ended."""

    def __init__(self, steps: int = 3, choices: int = 1, fail_after: int | None = None,
                 block_after: int | None = None):
        self.steps, self.choices = steps, choices
        self.fail_after, self.block_after = fail_after, block_after
        self.calls: list[tuple] = []
        self.closed = False       # the stream's own cleanup ran (aclose or cancellation)
        self.blocked = False

    async def generate(self, request, route, one_piece=False, on_prefilled=lambda: None):
        self.calls.append((request, route))
        if route == "disaggregated":
            on_prefilled()
        try:
            for step in range(self.steps):
                if step == self.fail_after:
                    raise ConnectionError("decode replica died")
                if step == self.block_after:
                    self.blocked = True
                    await asyncio.Event().wait()
                yield delta(request.request_id, step, self.steps, self.choices)
        finally:
            self.closed = True


class FakeGate:
    def __init__(self, refusal: APIError | None = None):
        self.refusal = refusal
        self.acquired: list[tuple[int, str, int]] = []
        self.released: list[int] = []

    async def acquire(self, cost: int, key: str, prompt_tokens: int = 0) -> int:
        self.acquired.append((cost, key, prompt_tokens))
        if self.refusal is not None:
            raise self.refusal
        return len(self.acquired)

    def release(self, ticket: int) -> None:
        self.released.append(ticket)


class Setup:
    """A client with one registered request, as the router leaves it for vLLM's layer."""

    def __init__(self, flow: FakeFlow | None = None, gate: FakeGate | None = None,
                 chunk_interval_s: float = 0.0, validate=lambda sampling_params: None):
        self.flow = flow or FakeFlow()
        self.gate = gate or FakeGate()
        self.observer = RecordingObserver()
        self.lifecycle = RequestLifecycle(self.gate, CHAT_ID, self.observer, "client-a")
        model_config = SimpleNamespace(get_vocab_size=lambda: VOCAB)
        self.client = PDEngineClient(SimpleNamespace(model_config=model_config), None,
                                     self.flow, disaggregation_threshold=THRESHOLD,
                                     stream_chunk_interval_s=chunk_interval_s,
                                     validate=validate)
        self.client.register(KEY, self.lifecycle)

    def generate(self, prompt: list[int], params: SamplingParams, request_id: str = CHAT_ID):
        # vLLM's layer passes more keyword arguments (lora_request, trace_headers, ...)
        return self.client.generate({"prompt_token_ids": prompt}, params, request_id,
                                    lora_request=None, trace_headers=None, priority=0)

    def collect(self, prompt: list[int], params: SamplingParams,
                request_id: str = CHAT_ID) -> list[RequestOutput]:
        async def read():
            return [output async for output in self.generate(prompt, params, request_id)]

        return asyncio.run(read())


def params(kind: RequestOutputKind = RequestOutputKind.DELTA, **kwargs) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 6, **kwargs}, output_kind=kind)


# ---- outputs -----------------------------------------------------------------------


def test_a_streamed_request_gets_every_delta_with_its_prompt_ids_attached_again():
    setup = Setup()
    outputs = setup.collect(SHORT, params())
    assert len(outputs) == 3
    assert [output.outputs[0].text for output in outputs] == ["s0c0", "s1c0", "s2c0"]
    assert all(output.prompt_token_ids == SHORT for output in outputs)
    assert [output.finished for output in outputs] == [False, False, True]


def test_a_unary_request_gets_one_final_output_aggregating_the_deltas():
    setup = Setup()
    outputs = setup.collect(SHORT, params(RequestOutputKind.FINAL_ONLY))
    assert len(outputs) == 1
    final = outputs[0]
    assert final.finished and final.prompt_token_ids == SHORT
    (choice,) = final.outputs
    assert choice.text == "s0c0s1c0s2c0"
    assert list(choice.token_ids) == [10, 20, 11, 20, 12, 20]
    assert choice.finish_reason == "length"
    assert final.num_cached_tokens == 2
    assert setup.observer.token_counts == [2, 2, 2]  # every delta was timed, not just one


def test_a_unary_request_with_several_choices_aggregates_each_choice():
    setup = Setup(FakeFlow(choices=2))
    (final,) = setup.collect(SHORT, params(RequestOutputKind.FINAL_ONLY, n=2))
    assert [choice.index for choice in final.outputs] == [0, 1]
    assert [choice.text for choice in final.outputs] == ["s0c0s1c0s2c0", "s0c1s1c1s2c1"]
    assert [list(choice.token_ids) for choice in final.outputs] == [
        [10, 20, 11, 20, 12, 20], [10, 21, 11, 21, 12, 21]]
    assert setup.observer.token_counts == [4, 4, 4]


def test_the_flow_gets_vllms_id_the_prompt_and_the_sampling_as_vllm_built_them():
    setup = Setup()
    sampling = params(seed=7)
    setup.collect(SHORT, sampling, request_id=f"cmpl-{KEY}-0")
    (request, _), = setup.flow.calls
    assert request.request_id == f"cmpl-{KEY}-0"
    assert request.prompt_token_ids == tuple(SHORT)
    assert request.sampling is sampling


@pytest.mark.parametrize(("kind", "interval"), [
    (RequestOutputKind.DELTA, 0.02), (RequestOutputKind.FINAL_ONLY, 0.0)])
def test_a_stream_asks_the_decode_pool_to_pace_its_chunks_and_a_unary_answer_does_not(
        kind, interval):
    setup = Setup(chunk_interval_s=0.02)
    setup.collect(SHORT, params(kind))
    (request, _), = setup.flow.calls
    assert request.chunk_interval_s == interval


# ---- admission and path ------------------------------------------------------------


@pytest.mark.parametrize(("prompt", "n", "max_tokens"), [
    (SHORT, 1, 6), (LONG, 1, 100), (SHORT, 3, 6),
])
def test_admission_costs_the_prompt_plus_every_token_it_may_generate(prompt, n, max_tokens):
    setup = Setup(FakeFlow(choices=n))
    setup.collect(prompt, params(n=n, max_tokens=max_tokens))
    assert setup.gate.acquired == [(len(prompt) + max_tokens * n, "client-a", len(prompt))]


@pytest.mark.parametrize(("prompt", "kwargs", "route"), [
    (SHORT, {}, "decode_local"),
    (LONG, {}, "disaggregated"),
    (LONG, {"n": 2}, "decode_local"),
    (LONG, {"prompt_logprobs": 1}, "decode_local"),
    (LONG, {"prompt_logprobs": 0}, "decode_local"),
])
def test_each_request_takes_the_path_its_sampling_allows(prompt, kwargs, route):
    setup = Setup(FakeFlow(choices=kwargs.get("n", 1)))
    setup.collect(prompt, params(**kwargs))
    assert [call_route for _, call_route in setup.flow.calls] == [route]
    assert setup.observer.routes == [(route, len(prompt))]
    # the timing marks of the stages it went through (the prefill mark is the flow's)
    assert setup.observer.marks == (
        ["rendered", "dispatched", "prefilled"] if route == "disaggregated"
        else ["rendered", "dispatched"])


@pytest.mark.parametrize("prompt", [[1, VOCAB], [-1, 2], [10**9]])
def test_token_ids_outside_the_vocabulary_are_a_400_before_admission(prompt):
    setup = Setup()
    with pytest.raises(APIError) as raised:
        setup.collect(prompt, params())
    assert (raised.value.status, raised.value.param) == (400, "prompt")
    assert setup.gate.acquired == [] and setup.flow.calls == []


def test_what_an_engines_input_processor_refuses_is_refused_before_admission():
    refusal = _exceptions.VLLMValidationError("logit_bias out of vocabulary",
                                             parameter="logit_bias")

    def validate(sampling_params):
        raise refusal

    setup = Setup(validate=validate)
    with pytest.raises(_exceptions.VLLMValidationError) as raised:
        setup.collect(SHORT, params())
    assert raised.value is refusal and setup.lifecycle.failure is refusal
    assert setup.gate.acquired == [] and setup.flow.calls == []


def test_a_refusal_is_kept_raised_and_never_reaches_the_flow():
    refusal = APIError(429, "full", "overloaded_error", code="queue_full")
    setup = Setup(gate=FakeGate(refusal=refusal))
    with pytest.raises(APIError) as raised:
        setup.collect(LONG, params())
    assert raised.value is refusal and setup.lifecycle.failure is refusal
    assert setup.flow.calls == [] and setup.gate.released == []
    assert setup.observer.outcomes == []  # the router counts it when it answers


# ---- however it ends ---------------------------------------------------------------


def test_a_finished_generation_gives_its_ticket_back_and_counts_nothing_itself():
    setup = Setup()
    setup.collect(SHORT, params())
    assert setup.gate.released == [1] and setup.flow.closed
    assert setup.observer.outcomes == [] and setup.lifecycle.failure is None


@pytest.mark.parametrize("fail_after", [0, 2])
def test_a_flow_failure_is_recorded_and_raised_and_the_ticket_goes_back(fail_after):
    setup = Setup(FakeFlow(fail_after=fail_after))
    received: list[RequestOutput] = []

    async def read():
        async for output in setup.generate(LONG, params()):
            received.append(output)

    with pytest.raises(_exceptions.GracefulHTTPError) as raised:
        asyncio.run(read())
    assert len(received) == fail_after
    # the router answers the failure itself (before a first output: by its status); vLLM's
    # layer, which writes a stream's error event from the exception's text, gets pdserve's
    # answer to it, never the exception's own text
    assert isinstance(setup.lifecycle.failure, ConnectionError)
    assert raised.value.__cause__ is setup.lifecycle.failure
    assert raised.value.http_status == 500 and "replica died" not in str(raised.value)
    assert CHAT_ID in str(raised.value)
    assert setup.gate.released == [1] and setup.flow.closed
    assert setup.observer.outcomes == []  # the router answers it, by its status


def test_a_unary_request_whose_flow_fails_yields_nothing_and_records_the_failure():
    setup = Setup(FakeFlow(fail_after=2))
    with pytest.raises(_exceptions.GracefulHTTPError):
        setup.collect(SHORT, params(RequestOutputKind.FINAL_ONLY))
    assert isinstance(setup.lifecycle.failure, ConnectionError)
    assert setup.gate.released == [1]


def test_a_stream_closed_early_closes_the_flows_stream_and_gives_the_ticket_back():
    setup = Setup(FakeFlow(steps=5))

    async def read_one_then_close():
        outputs = setup.generate(LONG, params())
        first = await anext(outputs)
        await outputs.aclose()  # vLLM's layer closes it when the client goes away
        return first

    first = asyncio.run(read_one_then_close())
    assert first.prompt_token_ids == LONG
    assert setup.flow.closed and setup.gate.released == [1]
    assert setup.observer.outcomes == ["cancelled"] and setup.lifecycle.failure is None


def test_a_cancelled_wait_for_tokens_closes_the_flows_stream_and_gives_the_ticket_back():
    setup = Setup(FakeFlow(steps=5, block_after=1))

    async def cancel_midway():
        async def read():
            return [output async for output in setup.generate(LONG, params())]

        reader = asyncio.ensure_future(read())
        await eventually(lambda: setup.flow.blocked)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settled(reader)

    asyncio.run(cancel_midway())
    assert setup.flow.closed and setup.gate.released == [1]
    assert setup.observer.outcomes == ["cancelled"]


# ---- failures the router answers itself ------------------------------------------


def test_an_out_of_vocabulary_prompt_is_kept_for_the_router_to_answer():
    """A stream would carry the 400 as a 500 event: the router must see it first."""
    setup = Setup()
    with pytest.raises(APIError) as raised:
        setup.collect([VOCAB], params())
    assert setup.lifecycle.failure is raised.value


def test_a_failed_batch_is_counted_by_its_failure_not_as_cancelled():
    """vLLM cancels the other prompts of a batch when one fails: not a client leaving."""
    from vllm.utils.async_utils import merge_async_iterators

    class BatchFlow(FakeFlow):
        async def generate(self, request, route, one_piece=False, on_prefilled=lambda: None):
            if request.request_id.endswith("-0"):  # the first prompt fails at once
                raise ConnectionError("decode replica died")
                yield  # an async generator
            async for output in super().generate(request, route):
                yield output

    # the second prompt waits for its turn and is cancelled by vLLM's merge
    setup = Setup(BatchFlow(steps=5))

    async def batch():
        merged = merge_async_iterators(
            setup.generate(SHORT, params(), f"cmpl-{KEY}-0"),
            setup.generate(SHORT, params(), f"cmpl-{KEY}-1"))
        with pytest.raises(_exceptions.GracefulHTTPError):
            async for _ in merged:
                pass
        # vLLM's stream generator reports the failure as an event, and the router counts
        # the request only after relaying it: once every task of the batch (the cancelled
        # second prompt's included) has ended, nothing here may have counted it.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        await settled(asyncio.gather(*others, return_exceptions=True))
        return list(setup.observer.outcomes)

    outcomes = asyncio.run(batch())
    assert isinstance(setup.lifecycle.failure, ConnectionError)
    assert outcomes == []  # left for the router to count by the failure's status


def test_the_prompts_of_a_batch_take_turns_through_the_pools():
    """Serve gives the calls one request makes one internal id; two streams of one id at
    once lose one, so a batch's prompts run one after another."""
    from vllm.utils.async_utils import merge_async_iterators

    order: list[str] = []

    class Recording(FakeFlow):
        async def generate(self, request, route, one_piece=False, on_prefilled=lambda: None):
            order.append(f"start {request.request_id[-1]}")
            async for output in super().generate(request, route):
                yield output
            order.append(f"end {request.request_id[-1]}")

    setup = Setup(Recording(steps=3))

    async def batch():
        merged = merge_async_iterators(
            setup.generate(SHORT, params(), f"cmpl-{KEY}-0"),
            setup.generate(SHORT, params(), f"cmpl-{KEY}-1"))
        return [index async for index, _ in merged]

    indices = asyncio.run(batch())
    assert sorted(indices) == [0, 0, 0, 1, 1, 1]
    assert order == ["start 0", "end 0", "start 1", "end 1"]
    assert len(setup.gate.released) == 2


@pytest.mark.parametrize(("tenant", "shared", "salt"), [
    ("key:0123abcd", False, "key:0123abcd"),   # each key's cached prompts are its own
    ("key:0123abcd", True, None),              # unless the config shares them
    ("user:alice", False, None),               # no key: a user field isolates nobody
    ("anonymous", False, None),
])
def test_the_prefix_cache_is_salted_with_the_requests_key(tenant, shared, salt):
    assert prefix_cache_salt(tenant, shared) == salt
