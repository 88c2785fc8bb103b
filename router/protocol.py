"""OpenAI request bodies: parsing, validation and the limits a request must respect (pure).

Everything a client can get wrong is caught here and turned into an ``APIError`` with
status 400 that names the offending field, before any engine sees the request.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cluster.engine.messages import SamplingSpec
from router.errors import APIError, bad_request

# Unknown fields are ignored, as OpenAI's API does: clients send fields this server does
# not use (e.g. `metadata`, `store`). Types are strict: "5" is not a number. Fields that
# would change the answer and are not honoured yet are refused instead (NOT_HONOURED).
_MODEL_CONFIG = ConfigDict(extra="ignore", strict=True, frozen=True)

# Fields of OpenAI's and vLLM's APIs that change the answer and that pdserve does not
# honour yet, each with the values that leave the answer as pdserve gives it. Any other
# value is refused with a 400 naming the field: a field accepted and then ignored is worse
# than a refusal, because the client believes it got what it asked for.
NOT_HONOURED: dict[str, tuple[Any, ...]] = {
    # structured outputs
    "response_format": (None, {"type": "text"}),
    "structured_outputs": (None,),
    "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,),
    "guided_grammar": (None,), "guided_decoding_backend": (None,),
    # tools
    "tools": (None, []), "tool_choice": (None, "none", "auto"),
    "functions": (None, []), "function_call": (None, "none", "auto"),
    # logprobs and sampling beyond the supported set
    "top_logprobs": (None, 0), "prompt_logprobs": (None,), "logit_bias": (None, {}),
    "best_of": (None, 1), "use_beam_search": (None, False), "length_penalty": (None, 1),
    "top_k": (None, 0, -1), "min_p": (None, 0), "repetition_penalty": (None, 1),
    "min_tokens": (None, 0), "stop_token_ids": (None, []), "bad_words": (None, []),
    "allowed_token_ids": (None,), "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True), "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,), "return_tokens_as_token_ids": (None, False),
    # prompt rendering
    "chat_template": (None,), "chat_template_kwargs": (None, {}),
    "add_generation_prompt": (None, True), "continue_final_message": (None, False),
    "documents": (None,), "prompt_embeds": (None,), "mm_processor_kwargs": (None,),
    "modalities": (None, ["text"]), "audio": (None,), "prediction": (None,),
    "reasoning_effort": (None,), "echo": (None, False),
    # engine internals a client must not set
    "kv_transfer_params": (None,), "vllm_xargs": (None,), "cache_salt": (None,),
    "priority": (None, 0),
}


class StreamOptions(BaseModel):
    model_config = _MODEL_CONFIG
    include_usage: bool = False


class _CommonParams(BaseModel):
    model_config = _MODEL_CONFIG

    model: str = Field(min_length=1)
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] = 0.0
    logprobs: bool | int | None = None
    user: str | None = None
    # vLLM extensions, accepted with vLLM's meaning.
    ignore_eos: bool = False
    return_token_ids: bool = False

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        return stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling(self, max_tokens: int) -> SamplingSpec:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingSpec(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(_CommonParams):
    """``POST /v1/completions``: one prompt, as text or as token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None

    def single_prompt(self) -> str | list[int]:
        """The one prompt of this request (batched prompts are refused)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise bad_request(
                    "batched prompts are not supported: send one prompt per request",
                    "prompt", "unsupported_parameter",
                )
            prompt = prompt[0]
        if len(prompt) == 0:
            raise bad_request("prompt must not be empty", "prompt", "invalid_value")
        return prompt


class TextPart(BaseModel):
    model_config = _MODEL_CONFIG
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = _MODEL_CONFIG
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(_CommonParams):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

    def requested_max_tokens(self) -> int | None:
        # The newer field wins, as in OpenAI's API.
        return self.max_completion_tokens or self.max_tokens

    def template_messages(self) -> list[dict[str, str]]:
        return [{"role": message.role, "content": message.text()} for message in self.messages]


RequestT = TypeVar("RequestT", bound=_CommonParams)


def parse_request(body: bytes, model_class: type[RequestT]) -> RequestT:
    """Parse and validate a JSON body; raise ``APIError`` (400) naming the first problem."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        message = f"request body is not valid JSON: {error}"
        raise bad_request(message, None, "invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", None, "invalid_json")
    try:
        request = model_class.model_validate(data)
    except ValidationError as error:
        raise _validation_error(error) from None
    _refuse_not_honoured(data)
    _refuse_unsupported(request)
    return request


def _refuse_not_honoured(data: dict[str, Any]) -> None:
    """400 for a field that would change the answer and is not honoured (NOT_HONOURED)."""
    for name, neutral in NOT_HONOURED.items():
        if name in data and not any(_same(data[name], value) for value in neutral):
            raise bad_request(f"'{name}' is not supported by this server yet",
                              name, "unsupported_parameter")
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("continuous_usage_stats"):
        raise bad_request("'stream_options.continuous_usage_stats' is not supported yet",
                          "stream_options.continuous_usage_stats", "unsupported_parameter")
    for index, message in enumerate(data.get("messages") or ()):
        if isinstance(message, dict) and (message.get("tool_calls") or
                                          message.get("function_call")):
            raise bad_request("messages with tool calls are not supported yet",
                              f"messages.{index}.tool_calls", "unsupported_parameter")


def _same(value: Any, neutral: Any) -> bool:
    # JSON's true is not 1, and 1.0 is 1: compare type families, then values.
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return value == neutral


def _validation_error(error: ValidationError) -> APIError:
    problem = error.errors()[0]
    # Union types add the member type to the location (e.g. prompt.str); drop those parts.
    path = [str(p) for p in problem["loc"] if not _is_type_tag(p)]
    param = ".".join(path) or None
    if problem["type"] == "missing":
        return bad_request(f"'{param}' is a required property", param, "missing_required_parameter")
    return bad_request(f"invalid value for '{param}': {problem['msg']}", param, "invalid_value")


def _is_type_tag(part: Any) -> bool:
    # pydantic names union members in the location: "str", "list[int]", "function-after[…]".
    return isinstance(part, str) and (part in {"str", "int", "float", "bool"} or "[" in part)


def _refuse_unsupported(request: _CommonParams) -> None:
    if request.n != 1:
        raise bad_request("only n=1 is supported", "n", "unsupported_parameter")
    if request.logprobs not in (None, False, 0):
        raise bad_request("logprobs are not supported", "logprobs", "unsupported_parameter")
    if isinstance(request, CompletionRequest):
        request.single_prompt()  # refuses batched and empty prompts
        if request.echo:
            raise bad_request("echo is not supported", "echo", "unsupported_parameter")
        if request.suffix:
            raise bad_request("suffix is not supported", "suffix", "unsupported_parameter")


def resolve_max_tokens(
    prompt_tokens: int, requested: int | None, max_model_len: int, default_max_tokens: int
) -> int:
    """The number of tokens to generate, or ``APIError`` if the request cannot fit.

    Without an explicit ``max_tokens`` the request gets the configured default, capped by
    what is left of the context window.
    """
    room = max_model_len - prompt_tokens
    if room < 1:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt "
            f"has {prompt_tokens} tokens. Please shorten the prompt.",
            "messages" if requested is None else "prompt",
            "context_length_exceeded",
        )
    if requested is None:
        return min(default_max_tokens, room)
    if requested > room:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the prompt, "
            f"{requested} for the completion). Please reduce the prompt or max_tokens.",
            "max_tokens",
            "context_length_exceeded",
        )
    return requested


def check_token_ids(token_ids: list[int], vocab_size: int) -> None:
    """Token-id prompts must name tokens the model has."""
    for token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            raise bad_request(
                f"token id {token_id} is outside the vocabulary (0..{vocab_size - 1})",
                "prompt", "invalid_value",
            )
