"""The router runs an engine's own input checks (router/vllm_frontend.py,
``_engine_validator``): vLLM's ``InputProcessor`` over the served model's config, so that
a request an engine would refuse (and, refused there, once left a healthy engine's stall
clock running) is refused before any engine sees it, with vLLM's own error."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams, StructuredOutputsParams

from cluster.config import TinyModelSpec


@pytest.fixture(scope="module")
def validate(tmp_path_factory):
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.renderers import renderer_from_config

    from cluster.tiny_model import ensure_model
    from router.vllm_frontend import _engine_validator

    model = ensure_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(
        num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=64,
        max_position_embeddings=512))
    args = AsyncEngineArgs(model=str(model), dtype="float32", max_model_len=512)
    vllm_config = VllmConfig(model_config=args.create_model_config(),
                             structured_outputs_config=args.create_structured_outputs_config())
    return _engine_validator(vllm_config, renderer_from_config(vllm_config))


@pytest.mark.parametrize(("params", "parameter"), [
    ({"logit_bias": {999_999: 5.0}}, "logit_bias"),
    ({"allowed_token_ids": [999_999]}, "allowed_token_ids"),
    ({"logprobs": 10_000}, "logprobs"),
], ids=["logit_bias", "allowed_token_ids", "logprobs"])
def test_what_an_engine_refuses_the_router_refuses_with_vllms_error(validate, params, parameter):
    with pytest.raises(VLLMValidationError) as refused:
        validate(SamplingParams(max_tokens=4, **params))
    assert refused.value.parameter == parameter


def test_a_grammar_the_backend_cannot_compile_is_refused(validate):
    with pytest.raises((VLLMValidationError, ValueError)):
        validate(SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
            regex="(unclosed")))


def test_what_an_engine_takes_passes(validate):
    validate(SamplingParams(max_tokens=4, temperature=0.7, seed=3, logprobs=2,
                            logit_bias={5: 1.0}, allowed_token_ids=[5, 6, 7]))
    validate(SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(
        regex="[ab]+")))
