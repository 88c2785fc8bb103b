"""What each pool's engine is asked to sample: the prefill engine one discarded token, the
decode engine the request's own sampling with the KV handle added."""

from __future__ import annotations

from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind

from decode.params import decode_params
from kv_transfer.handle import prefill_request_params
from prefill.params import prefill_params

HANDLE = {"do_remote_prefill": True, "remote_engine_id": "prefill-a", "remote_block_ids": [1]}


def test_the_prefill_pass_makes_one_token_and_no_text_for_it():
    params = prefill_params()
    assert (params.max_tokens, params.n) == (1, 1)
    assert params.output_kind == RequestOutputKind.FINAL_ONLY
    assert params.detokenize is False  # its token is discarded: no detokenizer for it
    assert params.extra_args == {"kv_transfer_params": prefill_request_params()}


def test_the_decode_pass_keeps_the_requests_sampling_and_adds_the_handle():
    own = SamplingParams(max_tokens=7, temperature=0.5, logprobs=2,
                         extra_args={"client": "kept"})
    params = decode_params(own, HANDLE)
    assert (params.max_tokens, params.temperature, params.logprobs) == (7, 0.5, 2)
    assert params.detokenize is True
    assert params.extra_args == {"client": "kept", "kv_transfer_params": HANDLE}
    assert own.extra_args == {"client": "kept"}  # the router's own copy is not changed
    assert decode_params(own, None).extra_args == {"client": "kept"}  # decode-local
