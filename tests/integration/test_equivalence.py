"""Greedy output through pdserve (prefill → NIXL → decode) equals plain colocated vLLM.

The reference is vLLM's own OpenAI server on the same model and engine settings, so
tokenization, chat templating, sampling and detokenization are compared end to end.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.conftest import CONFIG, MODEL, engine_stats, wait_until_idle
from tests.integration.openai_http import generate

pytestmark = pytest.mark.integration

BLOCK_SIZE = 32


def prose(words: int, seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = ["the", "cat", "sat", "on", "a", "warm", "mat", "while", "rain", "fell",
                  "over", "quiet", "hills", "and", "ships", "sailed", "past", "old",
                  "lighthouses", "toward", "distant", "harbours"]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


PROMPTS = {
    "shorter-than-a-block": "Hi there",            # 8 tokens < one 32-token block
    "several-blocks": prose(60, seed=1),          # ~330 tokens
    "long": prose(220, seed=2),                   # ~1,200 tokens
}


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
def test_greedy_output_matches_colocated_vllm(pdserve, reference, prompt_name, kind, stream):
    prompt = PROMPTS[prompt_name]
    params = {"max_tokens": 40, "temperature": 0}
    ours = generate(pdserve, kind, MODEL, prompt, stream=stream, **params)
    theirs = generate(reference, kind, MODEL, prompt, stream=stream, **params)
    assert ours.status == theirs.status == 200, (ours.error, theirs.error)
    assert ours.prompt_token_ids == theirs.prompt_token_ids
    assert ours.token_ids == theirs.token_ids, "generated tokens differ"
    assert ours.text == theirs.text
    assert ours.finish_reason == theirs.finish_reason
    assert ours.usage["prompt_tokens"] == theirs.usage["prompt_tokens"]
    assert ours.usage["completion_tokens"] == theirs.usage["completion_tokens"]
    assert len(ours.token_ids) == ours.usage["completion_tokens"]
    if prompt_name == "long":
        assert len(ours.prompt_token_ids) > 1000


def test_decode_engine_receives_the_prompt_kv_instead_of_recomputing(pdserve):
    """The long prompt's KV is computed once, on prefill, and pulled by decode over NIXL."""
    prompt = prose(230, seed=99)  # distinct from every other prompt: no prefix-cache hits
    before = wait_until_idle(pdserve)
    result = generate(pdserve, "completion", MODEL, prompt, stream=False, max_tokens=8,
                      temperature=0)
    assert result.status == 200
    after = wait_until_idle(pdserve)
    prompt_tokens = len(result.prompt_token_ids)
    assert prompt_tokens > 1000

    def delta(pool: str, key: str) -> int:
        return after[pool][key] - before[pool][key]

    assert delta("prefill", "prompt_tokens_computed") == prompt_tokens
    # Every full block travels; at most the trailing partial block is recomputed on decode.
    transferred = delta("decode", "prompt_tokens_transferred")
    assert transferred >= prompt_tokens - BLOCK_SIZE
    assert delta("decode", "prompt_tokens_computed") <= prompt_tokens - transferred
    assert delta("decode", "kv_transfers") >= 1
    assert delta("decode", "kv_bytes_transferred") > 0
    assert delta("decode", "kv_transfer_failures") == 0
    assert engine_stats(pdserve)["prefill"]["kv_cache_usage"] == 0  # blocks released


def test_the_next_turn_of_a_conversation_stays_on_the_decode_engine_holding_it(
        pdserve, reference):
    """Turn 1, over the threshold, goes through the prefill pool. Turn 2 is turn 1's prompt,
    its answer and a short question: the decode engine that made the answer holds all of
    it but the question (router.routing.decode.cache_aware_path), so turn 2 goes there
    decode-local, with no prefill and no transfer, the engine computes only what its cache
    lacks, and the answer is colocated vLLM's, token for token."""
    threshold = CONFIG.router.disaggregation_threshold_tokens
    params = {"max_tokens": 40, "temperature": 0, "ignore_eos": True}
    first = generate(pdserve, "completion", MODEL, prose(80, seed=61), stream=False, **params)
    assert first.status == 200 and len(first.prompt_token_ids) >= threshold
    # A question of 10 tokens: with the partial block before it, what the decode engine
    # lacks is at most 31 + 1 + 10 tokens, under the threshold of 48.
    question = first.prompt_token_ids[1:11]
    turn2 = [*first.prompt_token_ids, *first.token_ids, *question]
    held = (len(turn2) - len(question) - 1) // BLOCK_SIZE * BLOCK_SIZE  # the answer's last
    #                                                  token was never fed back
    assert len(turn2) - held < threshold <= len(turn2)
    before = wait_until_idle(pdserve)
    ours = generate(pdserve, "completion", MODEL, turn2, stream=True, **params)
    after = wait_until_idle(pdserve)
    theirs = generate(reference, "completion", MODEL, turn2, stream=True, **params)
    assert ours.status == theirs.status == 200, (ours.error, theirs.error)
    assert ours.prompt_token_ids == theirs.prompt_token_ids == turn2
    assert ours.token_ids == theirs.token_ids, "generated tokens differ"

    def delta(pool: str, key: str) -> int:
        return after[pool][key] - before[pool][key]

    assert delta("prefill", "requests_finished") == 0
    assert delta("decode", "kv_transfers") == delta("decode", "prompt_tokens_transferred") == 0
    cached = delta("decode", "prompt_tokens_cached")
    assert cached >= held, (cached, held)
    assert delta("decode", "prompt_tokens_computed") == len(turn2) - cached < threshold


def test_a_lone_stream_gets_every_token_as_it_comes_and_busy_streams_in_chunks(pdserve):
    """A decode replica paces its streams by its load (decode/pacing.py): alone, a stream
    stays under ``router.stream_chunks_per_s`` (400) however fast the engine is, so each
    token is its own event, as from vLLM's server; twelve at once would send more, so
    each stream's tokens are grouped into chunks up to ``router.stream_chunk_interval_ms``
    (20 ms) apart. Either way the tokens are the unary answer's. With a fixed interval
    the lone stream was chunked too; with no pacing the busy ones were not."""
    prompt = prose(20, seed=5)
    params = {"max_tokens": 64, "temperature": 0, "ignore_eos": True}
    unary = generate(pdserve, "completion", MODEL, prompt, stream=False, **params)
    assert unary.status == 200 and len(unary.token_ids) == 64, unary.error

    def chunks_of(answer) -> int:
        assert answer.status == 200, answer.error
        assert answer.token_ids == unary.token_ids and answer.text == unary.text
        return len([event for event in answer.events
                    if any(choice.get("token_ids") for choice in event.get("choices", []))])

    # (an engine faster than a token per 2.5 ms would merge a few: not a 20 ms interval's ~16)
    lone = chunks_of(generate(pdserve, "completion", MODEL, prompt, stream=True, **params))
    assert lone > 64 * 0.75, f"{lone} chunks for 64 tokens"
    with ThreadPoolExecutor(12) as pool:
        busy = list(pool.map(lambda _: generate(pdserve, "completion", MODEL, prompt,
                                                stream=True, **params), range(12)))
    counts = [chunks_of(answer) for answer in busy]
    assert sum(counts) < 12 * 64 * 0.75, f"chunks per stream of 64 tokens: {counts}"


SPECULATING_PORT = 8190


@pytest.fixture
def speculating(pdserve):
    """vLLM's server running the decode pool's engine with ``decode.speculative`` on, as
    pdserve passes it (cluster.engine.args): started for one test and stopped after it, so
    that no more engines than usual share the machine with the suites that follow."""
    import signal

    from cluster.config import SpeculativeConfig
    from tests.integration.conftest import LOG_DIR, REPO
    from tools import processes

    config = CONFIG.model_copy(update={"decode": CONFIG.decode.model_copy(
        update={"speculative": SpeculativeConfig(num_speculative_tokens=4)})})
    server = processes.start_vllm_server(config, SPECULATING_PORT, LOG_DIR, REPO,
                                         name="speculating-vllm")
    try:
        processes.wait_ready(server, timeout_s=420)
        yield server.base_url
    finally:
        processes.stop(server, signal.SIGTERM, timeout_s=60)


def _drafted(base_url: str) -> float:
    import httpx

    for line in httpx.get(f"{base_url}/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:spec_decode_num_draft_tokens_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_speculating_decode_engine_gives_pdserves_greedy_answers(pdserve, speculating):
    """The decode pool's engine with decode.speculative (n-gram prompt lookup) drafts
    tokens and answers greedy requests token for token as pdserve's engines that do not
    speculate do, on both of pdserve's paths; it refuses what vLLM cannot apply while
    speculating (logit_bias, min_p) with a 400 that says so."""
    before = _drafted(speculating)
    for prompt in (prose(12, seed=7), prose(230, seed=8)):  # decode-local, disaggregated
        plain = generate(pdserve, "completion", MODEL, prompt, stream=True, max_tokens=48,
                         temperature=0, ignore_eos=True)
        theirs = generate(speculating, "completion", MODEL, prompt, stream=True,
                          max_tokens=48, temperature=0, ignore_eos=True)
        assert plain.status == theirs.status == 200, (plain.error, theirs.error)
        assert theirs.token_ids == plain.token_ids, "speculation changed a greedy answer"
    assert _drafted(speculating) > before
    for field, value in (("logit_bias", {"65": 5}), ("min_p", 0.1)):
        refused = generate(speculating, "completion", MODEL, "Hello", stream=False,
                           max_tokens=4, **{field: value})
        assert refused.status == 400 and "speculative decoding" in refused.error["message"]
