"""Real clients against pdserve: the official ``openai`` SDK and LangChain's ``ChatOpenAI``.

What they rely on beyond plain text: structured outputs parsed into pydantic models, the
SDK's stream reassembly, logprobs, OpenAI-shaped errors mapped to the SDK's exceptions, and
forced tool calls. The tiny model has random weights; structured outputs still give valid
JSON because the grammar forces it. vLLM's JSON grammar lets the model pad between tokens
with whitespace, and this model pads generously (55 to 145 tokens for these small objects),
so structured requests get ``max_tokens`` 256 and are greedy, hence reproducible.

A forced tool call (a named ``tool_choice``) is answered by vLLM's chat serving only when it
runs a tool-call parser (vLLM 0.32 refuses it with 400 otherwise); LangChain's ``bind_tools``
test needs pdserve to run one (``hermes`` works with the tiny model's tokenizer).
"""

from __future__ import annotations

from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.integration.conftest import MODEL
from tests.integration.openai_http import API_KEY

pytestmark = pytest.mark.integration

STRUCTURED_MAX_TOKENS = 256


class Answer(BaseModel):
    """A short word and a digit."""

    word: str = Field(max_length=8)
    count: int = Field(ge=0, le=9)


class Pick(BaseModel):
    """A colour out of three and a digit."""

    colour: Literal["red", "green", "blue"]
    count: int = Field(ge=0, le=9)


class GetWeather(BaseModel):
    """The weather forecast for a city."""

    city: Literal["Paris", "Oslo"]
    days: int = Field(ge=1, le=3)


@pytest.fixture(scope="module")
def client(pdserve) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{pdserve}/v1", api_key=API_KEY, max_retries=0,
                         timeout=120)


def messages(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


# --- the openai SDK ----------------------------------------------------------------------------

@pytest.mark.parametrize("schema", [Answer, Pick], ids=["max-length-and-range", "enum"])
def test_sdk_parse_returns_the_pydantic_model(client, schema):
    completion = client.chat.completions.parse(
        model=MODEL, messages=messages("Hello"), response_format=schema,
        max_tokens=STRUCTURED_MAX_TOKENS, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, schema)
    assert choice.message.parsed == schema.model_validate_json(choice.message.content)
    assert choice.message.refusal is None
    assert completion.model == MODEL


def test_sdk_streamed_parse_reassembles_the_json(client):
    with client.chat.completions.stream(
            model=MODEL, messages=messages("Pick a colour."), response_format=Pick,
            max_tokens=STRUCTURED_MAX_TOKENS, temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert isinstance(message.parsed, Pick)
    assert "".join(deltas) == message.content
    assert len(deltas) > 1, "not streamed"


def test_sdk_streams_chat_like_the_unary_answer(client):
    request = {"model": MODEL, "messages": messages("Write a haiku about tea."),
               "max_tokens": 16, "temperature": 0}
    unary = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks
              if c.choices and c.choices[0].finish_reason]
    assert content == unary.choices[0].message.content
    assert finish == [unary.choices[0].finish_reason]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1]
    assert chunks[-1].usage.completion_tokens == unary.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == unary.usage.prompt_tokens


def test_sdk_logprobs(client):
    completion = client.chat.completions.create(
        model=MODEL, messages=messages("Hello"), max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=3)
    entries = completion.choices[0].logprobs.content
    assert len(entries) == completion.usage.completion_tokens == 8
    for entry in entries:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the likeliest
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)
        assert entry.logprob <= 0
    assert "".join(entry.token for entry in entries) == completion.choices[0].message.content

    legacy = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6,
                                       temperature=0, logprobs=2)
    logprobs = legacy.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    assert "".join(logprobs.tokens) == legacy.choices[0].text
    assert all(2 <= len(alternatives) <= 3 for alternatives in logprobs.top_logprobs)


def test_sdk_several_seeded_choices(client):
    completion = client.chat.completions.create(
        model=MODEL, messages=messages("Hello"), max_tokens=8, temperature=1.0, seed=5, n=2)
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert completion.usage.completion_tokens == 16
    again = client.chat.completions.create(
        model=MODEL, messages=messages("Hello"), max_tokens=8, temperature=1.0, seed=5, n=2)
    assert ([c.message.content for c in again.choices]
            == [c.message.content for c in completion.choices])


def test_sdk_raises_its_exceptions_for_errors(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=messages("x"), max_tokens=0)
    assert refused.value.status_code == 400 and refused.value.message
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=messages("x"))


# --- LangChain ---------------------------------------------------------------------------------

def chat_model(pdserve: str, **options):
    from langchain_openai import ChatOpenAI  # a dev dependency; imported here so that its
    # absence fails these tests rather than the collection of every test
    settings = {"max_tokens": STRUCTURED_MAX_TOKENS, "max_retries": 0, "timeout": 120,
                **options}
    return ChatOpenAI(base_url=f"{pdserve}/v1", api_key=API_KEY, model=MODEL, temperature=0,
                      **settings)


def test_langchain_structured_output_is_the_pydantic_model(pdserve):
    structured = chat_model(pdserve).with_structured_output(Answer, method="json_schema")
    answer = structured.invoke("Hello")
    assert isinstance(answer, Answer)
    assert len(answer.word) <= 8 and 0 <= answer.count <= 9


def test_langchain_forced_tool_call_matches_the_tool_schema(pdserve):
    with_tool = chat_model(pdserve).bind_tools([GetWeather], tool_choice="GetWeather",
                                               strict=True)
    message = with_tool.invoke("What is the weather in Paris?")
    assert not message.invalid_tool_calls, message.invalid_tool_calls
    assert [call["name"] for call in message.tool_calls] == ["GetWeather"], message
    arguments = GetWeather.model_validate(message.tool_calls[0]["args"])
    assert arguments.city in ("Paris", "Oslo") and 1 <= arguments.days <= 3


def test_langchain_streams_what_it_invokes(pdserve):
    llm = chat_model(pdserve, max_tokens=16)
    whole = llm.invoke("Hello")
    chunks = list(llm.stream("Hello"))
    assert "".join(chunk.content for chunk in chunks) == whole.content
    assert whole.usage_metadata["output_tokens"] == 16 or \
        whole.response_metadata["finish_reason"] == "stop"
