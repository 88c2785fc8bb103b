"""vLLM's own OpenAI layer, hosted by the router for one model version (shell).

The router does not write the OpenAI API itself: it runs vLLM's serving classes (request
models, chat templates with tools and content parts, conversion to ``SamplingParams``,
structured outputs, tool-call and reasoning parsers, logprobs, ``n``, response and stream formats,
``/tokenize`` and ``/detokenize``) over ``PDEngineClient``, which carries each rendered
request through pdserve's admission and its prefill → KV transfer → decode flow. The
configs are built from the same engine arguments as the version's decode engines, so
rendering, defaults and limits are theirs.

vLLM's serving classes are internal API: pinned with vLLM (pyproject.toml), and
tests/component/test_vllm_frontend.py checks the surface pdserve uses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cluster.config import PDServeConfig
from cluster.engine.args import engine_kwargs
from router.engine_client import PDEngineClient
from router.flow import DisaggregatedFlow
from router.response_cache import CacheStore, ResponseCache, version_fingerprint


@dataclass
class Frontend:
    """vLLM's serving objects answering under one served name."""

    chat: Any            # OpenAIServingChat
    completion: Any      # OpenAIServingCompletion
    tokenization: Any    # ServingTokenization


@dataclass
class VersionFrontends:
    """One model version: its engine client and a frontend per served name routed to it."""

    client: PDEngineClient
    by_name: dict[str, Frontend]


def build_version(config: PDServeConfig, version: str, flow: DisaggregatedFlow,
                  served_names: list[str], cache_store: CacheStore | None = None,
                  ) -> VersionFrontends:
    """vLLM's configs, renderer and serving classes for ``version`` (seconds: it reads the
    model's config and tokenizer); its answers are cached in ``cache_store`` if given."""
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.renderers import renderer_from_config

    args = AsyncEngineArgs(**engine_kwargs(config, "decode", None, version))
    model_config = args.create_model_config()
    vllm_config = VllmConfig(
        model_config=model_config,
        structured_outputs_config=args.create_structured_outputs_config(),
    )
    renderer = renderer_from_config(vllm_config)
    checkpoint = config.versions[version]
    cache = None if cache_store is None else ResponseCache(
        cache_store, version, version_fingerprint(version, checkpoint.path))
    client = PDEngineClient(
        vllm_config, renderer, flow, validate=_engine_validator(vllm_config, renderer),
        disaggregation_threshold=config.router.disaggregation_threshold_tokens,
        stream_chunk_interval_s=config.router.stream_chunk_interval_ms / 1000,
        stream_chunks_per_s=config.router.stream_chunks_per_s,
        cache=cache,
        decode_cache=flow.decode_cache if config.router.routing.decode.cache_aware_path
        else None,
        shared_prefix_cache=config.router.auth.shared_prefix_cache,
    )
    frontends = {
        name: _frontend(client, name, str(checkpoint.path), checkpoint.tool_parser,
                        checkpoint.reasoning_parser)
        for name in served_names
    }
    for frontend in frontends.values():
        # A chat without max_tokens gets the router's default (vLLM's own is all the
        # context the prompt leaves, which admission would have to reserve). Only the
        # fallback: vLLM's max_new_tokens override would also cap requests that ask more.
        frontend.chat.default_sampling_params.setdefault(
            "max_tokens", config.router.default_max_tokens)
    return VersionFrontends(client, frontends)


def _engine_validator(vllm_config: Any, renderer: Any) -> Callable[[Any], None]:
    """The checks an engine's input processor makes of a request's ``SamplingParams``
    (token ids in ``logit_bias`` and ``allowed_token_ids``, ``logprobs`` over the maximum,
    a grammar its backend cannot compile, ...): vLLM's own, raising vLLM's own errors, run
    in the router so that a request they refuse never reaches an engine."""
    from vllm.v1.engine.input_processor import InputProcessor

    processor = InputProcessor(vllm_config, renderer)
    return lambda params: processor._validate_params(params, ("generate",))


def _frontend(client: PDEngineClient, served_name: str, model_path: str,
              tool_parser: str | None, reasoning_parser: str | None) -> Frontend:
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm.entrypoints.serve.tokenize.serving import ServingTokenization
    from vllm.renderers.online_renderer import OnlineRenderer

    # Responses name the served name the client asked for: one registry per name.
    models = OpenAIServingModels(client, [BaseModelPath(name=served_name,
                                                        model_path=model_path)])
    template = {"chat_template": None, "chat_template_content_format": "auto"}
    tools = {"enable_auto_tools": tool_parser is not None, "tool_parser": tool_parser}
    renderer = OnlineRenderer(client.model_config, client.renderer, request_logger=None,
                              reasoning_parser=reasoning_parser, **template, **tools)
    return Frontend(
        chat=OpenAIServingChat(client, models, "assistant", online_renderer=renderer,
                               request_logger=None, enable_prompt_tokens_details=True,
                               reasoning_parser=reasoning_parser or "", **template, **tools),
        completion=OpenAIServingCompletion(client, models, online_renderer=renderer,
                                           request_logger=None,
                                           enable_prompt_tokens_details=True),
        tokenization=ServingTokenization(models, renderer, request_logger=None, **template),
    )


# The request model vLLM's server validates each endpoint's body with.
_REQUEST_MODELS = {
    "chat": "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
    "completion": "vllm.entrypoints.openai.completion.protocol:CompletionRequest",
    "tokenize": "vllm.entrypoints.serve.tokenize.protocol:TokenizeRequest",
    "detokenize": "vllm.entrypoints.serve.tokenize.protocol:DetokenizeRequest",
}


def parse_json_body(body: bytes) -> Any:
    """The request body as JSON; malformed JSON is refused as FastAPI refuses it for vLLM's
    server (a ``RequestValidationError`` of type ``json_invalid``), so the answer is vLLM's."""
    import json

    from fastapi.exceptions import RequestValidationError

    try:
        return json.loads(body)
    except json.JSONDecodeError as error:
        problem, position = error.msg, error.pos
    except (UnicodeDecodeError, RecursionError) as error:  # RecursionError: deep nesting
        problem, position = str(error) or type(error).__name__, 0
    raise RequestValidationError([{"type": "json_invalid", "loc": ("body", position),
                                   "msg": "JSON decode error", "input": {},
                                   "ctx": {"error": problem}}])


@functools.cache
def _adapter(kind: str) -> Any:
    """vLLM's request model of ``kind`` as a validator, built once (it is a large schema)."""
    import importlib

    from pydantic import TypeAdapter

    module, name = _REQUEST_MODELS[kind].split(":")
    return TypeAdapter(getattr(importlib.import_module(module), name))


def parse_openai_request(kind: str, data: Any) -> Any:
    """``data`` as vLLM's request model of ``kind``; FastAPI's ``RequestValidationError``
    (answered as vLLM's server answers it) when the model refuses it. vLLM's own checks
    inside the model (e.g. ``tool_choice`` without ``tools``) raise vLLM's errors, which
    ``router.failures.vllm_error_response`` answers."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError

    try:
        return _adapter(kind).validate_python(data)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None
