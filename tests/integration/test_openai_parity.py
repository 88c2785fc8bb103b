"""pdserve answers every OpenAI request exactly as vLLM's own OpenAI server does.

A black-box differential test: each request of the catalogue below goes to pdserve (port
8100, prefill → NIXL → decode, or decode-local for short prompts) and to vLLM's own
``api_server`` on the same model and engine settings (the ``reference`` fixture, port
8200), unary and, where it matters, streamed. Both must answer with the same status; a
success must carry the same choices (text, finish and stop reasons, tool calls, logprob
tokens, token ids), the same usage counts and the same prompt logprobs; an error must be
OpenAI-shaped on both sides (``{"error": {"message", "type", "param", "code"}}``, the shape
compared, not the wording).

Every generating case is greedy (temperature 0) or seeded, so that its answer is a function
of the request alone. Before trusting a comparison, ``test_the_catalogue_exercises_...``
shows on the reference that the catalogue's fields really take effect (a logit bias changes
the output, a JSON response format yields JSON, ``n`` yields n different choices, ...): a
field the server ignored would make its parity case pass without testing anything.

What vLLM 0.32's server (CPU build, no ``--tool-call-parser``) answers, as checked when the
catalogue was written: every sampling field below is honoured; structured outputs (JSON
object, JSON schema, regex, choice, EBNF grammar) work through xgrammar; ``n`` > 1 needs
sampling (n=2 at temperature 0 is a 400); ``tool_choice`` "auto" (also the default when
``tools`` are sent), "required" and a named function are refused with 400 unless the server
runs a tool-call parser, only "none" is served (with ``--tool-call-parser hermes`` the
forced choices give tool calls: the catalogue follows ``baseline_flags``, see TOOL_PARSER);
``prompt_logprobs`` cannot be streamed (400); ``stop`` takes at most 4 strings; a prompt that
fits the context window with ``max_tokens`` beyond it is answered, the completion capped at
the window (200), while a prompt alone over the window is a 400. Left out: a malformed EBNF
grammar, which fails inside vLLM's engine and answers 500 "Internal server error".
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from cluster.engine.args import baseline_flags
from router.protocol import NOT_HONOURED
from router.sse import sse_lines
from tests.integration.conftest import CONFIG, MODEL, REPO
from tests.integration.openai_http import AUTH
from tools import processes

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
TOKENIZE = "/tokenize"      # vLLM serves these two at the root, not under /v1
DETOKENIZE = "/detokenize"
TIMEOUT_S = 120

MAX_MODEL_LEN = CONFIG.engine.max_model_len
MAX_LOGPROBS = int(CONFIG.engine.extra.get("max_logprobs", 20))  # vLLM's default is 20
THRESHOLD = CONFIG.router.disaggregation_threshold_tokens
EOS_ID = 257                                     # cluster/tiny_model.py: 256 bytes, BOS, EOS
PRINTABLE_IDS = list(range(32, 127))             # byte-level tokenizer: token id == byte

# vLLM 0.32 answers tool_choice "required" / a named function only with a tool-call parser,
# and "auto" only with --enable-auto-tool-choice as well; otherwise 400. The catalogue
# expects what the served model's config (a version's `tool_parser`, which turns on both in
# pdserve) or the reference's command line sets up; the reference must mirror pdserve's.
_FLAGS = [*baseline_flags(CONFIG), *processes.frontend_flags(CONFIG)]
_CONFIGURED_PARSER = CONFIG.versions[CONFIG.model.version].tool_parser
TOOL_PARSER = _CONFIGURED_PARSER is not None or "--tool-call-parser" in _FLAGS
AUTO_TOOLS = _CONFIGURED_PARSER is not None or (
    "--tool-call-parser" in _FLAGS and "--enable-auto-tool-choice" in _FLAGS)
FORCED_TOOL_STATUS = 200 if TOOL_PARSER else 400
AUTO_TOOL_STATUS = 200 if AUTO_TOOLS else 400


def _prose(words: int, seed: int) -> str:
    rng = random.Random(seed)
    vocabulary = ["the", "river", "bent", "past", "an", "old", "mill", "where", "swallows",
                  "nested", "under", "slate", "roofs", "and", "barges", "waited", "for",
                  "spring", "floods", "to", "carry", "timber", "downstream"]
    return " ".join(rng.choice(vocabulary) for _ in range(words))


SHORT = "Hello"                      # chat: ~30 prompt tokens, under the threshold
LONG = _prose(260, seed=7)           # ~1,400 bytes = tokens: prefill pool, then NIXL
MEDIUM = _prose(40, seed=8)          # ~250 tokens: over the threshold, a few KV blocks

SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
        "size": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["colour", "size"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "strict": True,       # with a tool parser, vLLM pins the arguments only for strict tools
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                           "days": {"type": "integer", "minimum": 1, "maximum": 3}},
            "required": ["city", "days"],
        },
    },
}
SECOND_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "strict": True, "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"]}},
}
# vLLM takes at most 4 stop strings; these occur in the greedy answers (checked below)
STOP_STRINGS = ["t", "e", "a", "o"]
COMPLETION_STOP_STRINGS = ["1", "w", "r", "N"]
STOP_IDS = [ord(c) for c in "aeiouAEIOU0123456789 "]  # stop_token_ids: no such limit
BAD_WORDS = list("abcdefghijklmnopqrstuvwxyz")
ALLOWED_IDS = [ord("B"), ord("C"), ord("D")]
FORCED_ID = ord("A")
REGEX = "[a-c]{3}x[0-9]{2}"
CHOICES = ["yes", "no", "maybe"]
GRAMMAR = 'root ::= "ab" | "cd" | "ef" digit\ndigit ::= [0-9]'
GREEDY = {"temperature": 0}
# Room for a forced tool call: the grammar lets the random model pad the JSON with
# whitespace (~130 tokens here); only spent where a tool parser makes vLLM answer at all.
TOOL_MAX_TOKENS = 256


def seeded(seed: int = 1234) -> dict:
    return {"temperature": 1.0, "seed": seed}


def user(content: Any) -> list[dict]:
    return [{"role": "user", "content": content}]


@dataclass(frozen=True)
class Case:
    """One request. ``body`` is sent as JSON (a str: sent as the raw body); ``modes`` are
    the ways it is sent; ``status`` is what vLLM's own server answers (checked too)."""

    id: str
    path: str
    body: dict | str
    modes: tuple[str, ...] = ("unary",)
    status: int = 200
    note: str = ""

    def request(self, stream: bool) -> dict | str:
        if isinstance(self.body, str):
            return self.body
        body = dict(self.body)
        if stream:
            body["stream"] = True
            # Streams report usage unless the case says otherwise, so usage is compared.
            body.setdefault("stream_options", {"include_usage": True})
        return body


def chat(case_id: str, messages: list[dict] | None = None, modes=("unary",), status=200,
         note: str = "", **params) -> Case:
    body = {"model": MODEL, "messages": user(SHORT) if messages is None else messages,
            "max_tokens": 12, **params}
    body = {k: v for k, v in body.items() if v is not DROP}
    return Case(case_id, CHAT, body, tuple(modes), status, note)


def completion(case_id: str, prompt: Any = SHORT, modes=("unary",), status=200,
               note: str = "", **params) -> Case:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, **params}
    body = {k: v for k, v in body.items() if v is not DROP}
    return Case(case_id, COMPLETIONS, body, tuple(modes), status, note)


DROP = object()  # a parameter value meaning "leave the field out"
BOTH = ("unary", "stream")
STREAM = ("stream",)

CATALOGUE: list[Case] = [
    # --- greedy and seeded generation, short (decode-local) and long (prefill + NIXL)
    chat("chat-greedy", modes=BOTH, **GREEDY),
    chat("chat-greedy-long", user(LONG), BOTH, **GREEDY),
    chat("chat-greedy-medium", user(MEDIUM), BOTH, max_tokens=16, **GREEDY),
    chat("chat-seeded", modes=BOTH, **seeded()),
    chat("chat-seeded-long", user(LONG), BOTH, **seeded(7)),
    chat("chat-top-p", modes=BOTH, top_p=0.5, **seeded(3)),
    chat("chat-top-k", modes=BOTH, top_k=5, **seeded(4)),
    chat("chat-min-p", min_p=0.3, **seeded(5)),
    chat("chat-repetition-penalty", max_tokens=16, repetition_penalty=1.8, **GREEDY),
    chat("chat-frequency-presence-penalty", max_tokens=16, frequency_penalty=1.0,
         presence_penalty=0.5, **GREEDY),
    chat("chat-return-token-ids", modes=BOTH, return_token_ids=True, **GREEDY),
    chat("chat-model-omitted", model=DROP, note="vLLM serves its (only) model", **GREEDY),
    # --- logprobs
    chat("chat-logprobs", modes=BOTH, logprobs=True, top_logprobs=3, **GREEDY),
    chat("chat-logprobs-long", user(LONG), BOTH, logprobs=True, top_logprobs=2, **GREEDY),
    chat("chat-logprobs-seeded", modes=BOTH, logprobs=True, top_logprobs=MAX_LOGPROBS,
         **seeded(11)),
    chat("chat-prompt-logprobs", prompt_logprobs=2, max_tokens=4, **GREEDY),
    chat("chat-prompt-logprobs-long", user(LONG), prompt_logprobs=1, max_tokens=4, **GREEDY),
    # --- several choices (n > 1 needs sampling: a seed makes it reproducible)
    chat("chat-n2-seeded", modes=BOTH, n=2, **seeded(21)),
    chat("chat-n3-seeded-logprobs", user(MEDIUM), BOTH, n=3, logprobs=True, top_logprobs=1,
         **seeded(22)),
    # --- logits processors and stopping
    chat("chat-logit-bias-forces-a-token", modes=BOTH, logit_bias={str(FORCED_ID): 100},
         **GREEDY),
    chat("chat-allowed-token-ids", modes=BOTH, allowed_token_ids=ALLOWED_IDS, **seeded(31)),
    chat("chat-bad-words", bad_words=BAD_WORDS, **GREEDY),
    chat("chat-min-tokens", modes=BOTH, stop_token_ids=PRINTABLE_IDS, min_tokens=4,
         return_token_ids=True, **GREEDY),
    chat("chat-stop", modes=BOTH, max_tokens=16, stop=STOP_STRINGS, **GREEDY),
    chat("chat-stop-included", modes=BOTH, max_tokens=16, stop=STOP_STRINGS,
         include_stop_str_in_output=True, **GREEDY),
    chat("chat-stop-token-ids", modes=BOTH, max_tokens=16,
         stop_token_ids=STOP_IDS, **GREEDY),
    chat("chat-max-completion-tokens", modes=BOTH, max_tokens=DROP, max_completion_tokens=5,
         **GREEDY),
    chat("chat-eos-forced", logit_bias={str(EOS_ID): 100}, **GREEDY),
    chat("chat-ignore-eos", modes=BOTH, max_tokens=6, logit_bias={str(EOS_ID): 100},
         ignore_eos=True, return_token_ids=True, **GREEDY),
    # --- structured outputs
    chat("chat-json-object", modes=BOTH, max_tokens=48, response_format={"type": "json_object"},
         **GREEDY),
    chat("chat-json-schema", modes=BOTH, max_tokens=64, response_format={
        "type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA,
                                               "strict": True}}, **GREEDY),
    chat("chat-json-schema-seeded", max_tokens=64, response_format={
        "type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}},
         **seeded(41)),
    chat("chat-structured-regex", modes=BOTH, structured_outputs={"regex": REGEX}, **GREEDY),
    chat("chat-structured-choice", modes=BOTH, structured_outputs={"choice": CHOICES},
         **seeded(42)),
    chat("chat-structured-grammar", structured_outputs={"grammar": GRAMMAR}, **GREEDY),
    chat("chat-structured-json", max_tokens=64, structured_outputs={"json": SCHEMA}, **GREEDY),
    # --- tools
    chat("chat-tools-none", modes=BOTH, tools=[TOOL], tool_choice="none", **GREEDY),
    chat("chat-tools-none-no-parallel", tools=[TOOL, SECOND_TOOL], tool_choice="none",
         parallel_tool_calls=False, **GREEDY),
    chat("chat-tools-auto", modes=BOTH, status=AUTO_TOOL_STATUS, max_tokens=16, tools=[TOOL],
         tool_choice="auto", note="without a tool parser vLLM refuses it", **GREEDY),
    chat("chat-tools-default-choice", status=AUTO_TOOL_STATUS, tools=[TOOL],
         note="tools without tool_choice mean auto", **GREEDY),
    chat("chat-tools-required", modes=BOTH, status=FORCED_TOOL_STATUS,
         max_tokens=TOOL_MAX_TOKENS,
         tools=[TOOL, SECOND_TOOL], tool_choice="required", **GREEDY),
    chat("chat-tools-required-no-parallel", status=FORCED_TOOL_STATUS,
         max_tokens=TOOL_MAX_TOKENS,
         tools=[TOOL, SECOND_TOOL], tool_choice="required", parallel_tool_calls=False,
         **GREEDY),
    chat("chat-tools-named", modes=BOTH, status=FORCED_TOOL_STATUS,
         max_tokens=TOOL_MAX_TOKENS,
         tools=[TOOL, SECOND_TOOL],
         tool_choice={"type": "function", "function": {"name": "get_weather"}}, **GREEDY),
    # --- stream options
    chat("chat-stream-usage", modes=STREAM, stream_options={"include_usage": True}, **GREEDY),
    chat("chat-stream-continuous-usage", modes=STREAM, n=2, stream_options={
        "include_usage": True, "continuous_usage_stats": True}, **seeded(51)),
    chat("chat-stream-no-usage", modes=STREAM, stream_options={"include_usage": False},
         **GREEDY),
    # --- conversation shapes
    chat("chat-content-parts", [{"role": "user", "content": [
        {"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}], BOTH,
         **GREEDY),
    chat("chat-system-and-turns", [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a colour."}], BOTH, **GREEDY),
    # --- completions
    completion("completion-greedy", modes=BOTH, **GREEDY),
    completion("completion-greedy-long", LONG, BOTH, **GREEDY),
    completion("completion-seeded", modes=BOTH, **seeded(61)),
    completion("completion-seeded-long", LONG, **seeded(62)),
    completion("completion-logprobs", modes=BOTH, logprobs=3, **GREEDY),
    completion("completion-logprobs-long", LONG, BOTH, logprobs=2, **GREEDY),
    completion("completion-echo", modes=BOTH, max_tokens=4, echo=True, logprobs=2, **GREEDY),
    completion("completion-prompt-logprobs", max_tokens=4, prompt_logprobs=3, **GREEDY),
    completion("completion-prompt-logprobs-long", LONG, max_tokens=2, prompt_logprobs=1,
               **GREEDY),
    completion("completion-n2-seeded", modes=BOTH, n=2, logprobs=1, **seeded(63)),
    completion("completion-token-id-prompt", [72, 101, 108, 108, 111], BOTH, **GREEDY),
    completion("completion-batched-prompts", ["Hi", "Yo"], BOTH, max_tokens=6, **GREEDY),
    completion("completion-json-object", max_tokens=48, response_format={"type": "json_object"},
               **GREEDY),
    completion("completion-structured-choice", structured_outputs={"choice": CHOICES},
               **seeded(64)),
    completion("completion-stop-included", modes=BOTH, max_tokens=16,
               stop=COMPLETION_STOP_STRINGS,
               include_stop_str_in_output=True, **GREEDY),
    completion("completion-ignore-eos", max_tokens=6, logit_bias={str(EOS_ID): 100},
               ignore_eos=True, return_token_ids=True, **GREEDY),
    completion("completion-stream-continuous-usage", modes=STREAM, stream_options={
        "include_usage": True, "continuous_usage_stats": True}, **GREEDY),
    completion("completion-max-tokens-capped-at-context", "ab" * ((MAX_MODEL_LEN - 12) // 2),
               max_tokens=64, note="prompt fits, max_tokens does not: capped, not refused",
               **GREEDY),
    # --- tokenizer endpoints
    Case("tokenize-prompt", TOKENIZE, {"model": MODEL, "prompt": "Hello, world"}),
    Case("tokenize-prompt-token-strs", TOKENIZE,
         {"model": MODEL, "prompt": "Hi!", "return_token_strs": True}),
    Case("tokenize-prompt-long", TOKENIZE, {"model": MODEL, "prompt": LONG}),
    Case("tokenize-messages", TOKENIZE,
         {"model": MODEL, "messages": user(SHORT), "add_generation_prompt": True}),
    Case("detokenize", DETOKENIZE, {"model": MODEL, "tokens": [72, 101, 108, 108, 111]}),
    Case("tokenize-unknown-model", TOKENIZE, {"model": "no-such-model", "prompt": "x"},
         status=404),
    Case("tokenize-neither-prompt-nor-messages", TOKENIZE, {"model": MODEL}, status=400),
    # --- malformed requests: only the status must match, both errors OpenAI-shaped
    Case("error-invalid-json-chat", CHAT, '{"model": "tiny-llama", "messages": ', status=400),
    Case("error-invalid-json-completion", COMPLETIONS, "not json at all", status=400),
    chat("error-max-tokens-not-an-integer", modes=BOTH, status=400, max_tokens="ten"),
    chat("error-messages-not-a-list", "hello", status=400),
    Case("error-messages-missing", CHAT, {"model": MODEL, "max_tokens": 4}, status=400),
    chat("error-messages-empty", [], status=400, **GREEDY),
    completion("error-prompt-missing", DROP, status=400),
    chat("error-max-tokens-zero", status=400, max_tokens=0),
    completion("error-completion-max-tokens-zero", status=400, max_tokens=0),
    chat("error-n-zero", modes=BOTH, status=400, n=0),
    chat("error-n2-greedy", status=400, n=2, **GREEDY),
    chat("error-temperature-negative", modes=BOTH, status=400, temperature=-1),
    chat("error-top-p-zero", status=400, top_p=0, seed=1),
    chat("error-unknown-model", modes=BOTH, status=404, model="no-such-model"),
    completion("error-completion-unknown-model", status=404, model="no-such-model"),
    chat("error-context-overflow", user("a" * MAX_MODEL_LEN), status=400, **GREEDY),
    completion("error-completion-context-overflow", "a" * (MAX_MODEL_LEN + 8), status=400),
    chat("error-top-logprobs-above-max", status=400, logprobs=True,
         top_logprobs=MAX_LOGPROBS + 1),
    completion("error-logprobs-above-max", status=400, logprobs=MAX_LOGPROBS + 1),
    completion("error-prompt-logprobs-above-max", status=400, prompt_logprobs=MAX_LOGPROBS + 1),
    chat("error-prompt-logprobs-streamed", modes=STREAM, status=400, prompt_logprobs=1),
    chat("error-top-logprobs-without-logprobs", status=400, top_logprobs=2),
    chat("error-tool-choice-without-tools", status=400, tool_choice="required"),
    chat("error-empty-tools", status=400, tools=[]),
    chat("error-stream-options-without-stream", status=400,
         stream_options={"include_usage": True}),
    chat("error-five-stop-strings", status=400, stop=["a", "b", "c", "d", "e"]),
    chat("error-min-tokens-above-max-tokens", status=400, max_tokens=4, min_tokens=10),
    chat("error-two-structured-constraints", status=400,
         structured_outputs={"regex": "a+", "choice": ["a"]}),
    chat("error-invalid-regex", status=400, structured_outputs={"regex": "("}),
    chat("error-json-schema-missing", status=400, response_format={"type": "json_schema"}),
    chat("error-logit-bias-out-of-vocabulary", status=400, logit_bias={"999999": 5}),
    chat("error-allowed-token-ids-out-of-vocabulary", status=400, allowed_token_ids=[999999]),
    completion("error-suffix", status=400, suffix="!"),
]
CASES = {case.id: case for case in CATALOGUE}
assert len(CASES) == len(CATALOGUE), "duplicate case ids"


# --- sending -------------------------------------------------------------------------------

@dataclass
class Answer:
    status: int
    body: Any = None                   # the JSON body (unary, or a refused stream)
    events: list[dict] | None = None   # a stream's events, [DONE] excluded
    done: bool = False                 # the stream ended with data: [DONE]
    error_events: list[dict] = field(default_factory=list)


def send(base_url: str, case: Case, stream: bool, headers: dict | None = None) -> Answer:
    body = case.request(stream)
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S, headers=headers or {}) as client:
        if isinstance(body, str):
            response = client.post(case.path, content=body.encode(),
                                   headers={"Content-Type": "application/json"})
            return Answer(response.status_code, _json_or_text(response))
        if not stream:
            response = client.post(case.path, json=body)
            return Answer(response.status_code, _json_or_text(response))
        with client.stream("POST", case.path, json=body) as response:
            if (response.status_code != 200 or not response.headers.get(
                    "content-type", "").startswith("text/event-stream")):
                response.read()
                return Answer(response.status_code, _json_or_text(response))
            answer = Answer(response.status_code, events=[])
            for line in sse_lines(response.iter_bytes()):
                if not line or line.startswith(":"):  # blank separators, keep-alive comments
                    continue
                assert line.startswith("data: "), f"not an SSE data line: {line!r}"
                payload = line[len("data: "):]
                assert not answer.done, "event after data: [DONE]"
                if payload == "[DONE]":
                    answer.done = True
                    continue
                event = json.loads(payload)
                if "error" in event:
                    answer.error_events.append(event)
                else:
                    answer.events.append(event)
            return answer


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def ask_reference(reference: str, case: Case, stream: bool = False, **changes) -> Answer:
    """``case`` (with ``changes``: a value DROP leaves the field out) on vLLM's server."""
    body = {k: v for k, v in {**case.body, **changes}.items() if v is not DROP}
    return send(reference, Case(case.id, case.path, body), stream)


# --- normalising answers into what must be equal -------------------------------------------
# Left out on purpose (server-local or random by design, never the model's answer):
#   id, created, system_fingerprint, service_tier: per response / per build;
#   tool_calls[].id: a fresh random id per call;
#   usage.prompt_tokens_details (cached tokens: prefix-cache state of one engine) and
#   usage.completion_tokens_details; kv_transfer_params (the disaggregation handshake),
#   metrics, routed_experts, prompt_text: a server's internals or debug echoes;
#   response headers, and in streams the chunk boundaries: an engine coalesces tokens into
#   fewer chunks when its reader lags (vLLM's own server too), so deltas are compared
#   reassembled, and with continuous_usage_stats every chunk must carry usage instead of
#   both sides having the same number of chunks.


class TopK(dict):
    """Alternatives at one position: key -> logprob (or (logprob, rank, decoded))."""


def _usage(usage: dict | None) -> dict | None:
    if usage is None:
        return None
    return {k: usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}


def _chat_logprob_entries(logprobs: dict | None) -> list[dict] | None:
    if not logprobs or logprobs.get("content") is None:
        return None
    return [{"token": entry["token"], "bytes": entry.get("bytes"), "logprob": entry["logprob"],
             # token strings collide for partial UTF-8 bytes ("\ufffd"): key by bytes too
             "top": TopK({f"{alt['token']}|{alt.get('bytes')}": alt["logprob"]
                          for alt in entry.get("top_logprobs") or []})}
            for entry in logprobs["content"]]


def _prompt_logprobs(positions: list | None) -> list | None:
    if positions is None:
        return None
    return [None if position is None else TopK({
        int(token_id): (alt["logprob"], alt.get("rank"), alt.get("decoded_token"))
        for token_id, alt in position.items()}) for position in positions]


def _completion_logprobs(logprobs: dict | None) -> dict | None:
    if logprobs is None:
        return None
    return {"tokens": logprobs.get("tokens"), "token_logprobs": logprobs.get("token_logprobs"),
            "text_offset": logprobs.get("text_offset"),
            "top_logprobs": [None if alts is None else TopK(alts)
                             for alts in logprobs.get("top_logprobs") or []]}


def _tool_call(call: dict) -> dict:
    function = call.get("function") or {}
    return {"type": call.get("type"), "name": function.get("name"),
            "arguments": function.get("arguments")}


def normalise(path: str, body: Any) -> Any:
    """A unary success, reduced to what both servers must agree on."""
    if path in (TOKENIZE, DETOKENIZE):
        return body  # count, max_model_len, tokens, token_strs / prompt: all deterministic
    top = {"object": body.get("object"), "model": body.get("model"),
           "usage": _usage(body.get("usage")),
           "prompt_token_ids": body.get("prompt_token_ids"),
           "prompt_logprobs": _prompt_logprobs(body.get("prompt_logprobs"))}
    choices = []
    for choice in sorted(body["choices"], key=lambda c: c["index"]):
        common = {"index": choice["index"], "finish_reason": choice.get("finish_reason"),
                  "stop_reason": choice.get("stop_reason"),
                  "token_ids": choice.get("token_ids")}
        if path == CHAT:
            message = choice["message"]
            choices.append({**common, "role": message.get("role"),
                            "content": message.get("content"),
                            "reasoning": message.get("reasoning"),
                            "tool_calls": [_tool_call(c) for c in message.get("tool_calls")
                                           or []],
                            "logprobs": _chat_logprob_entries(choice.get("logprobs"))})
        else:
            choices.append({**common, "text": choice["text"],
                            "logprobs": _completion_logprobs(choice.get("logprobs")),
                            "prompt_token_ids": choice.get("prompt_token_ids"),
                            "prompt_logprobs": _prompt_logprobs(choice.get("prompt_logprobs"))})
    return {**top, "choices": choices}


def reassemble(path: str, events: list[dict], continuous_usage: bool) -> dict:
    """A stream's deltas put together per choice, plus what its usage chunks said."""
    objects, models, choices = set(), set(), {}
    usage, usage_chunks, chunks_without_usage = None, 0, 0
    prompt_token_ids = None
    for event in events:
        objects.add(event.get("object"))
        models.add(event.get("model"))
        if event.get("usage"):
            usage_chunks += 1
            usage = event["usage"]
        elif event.get("choices"):
            chunks_without_usage += 1
        if prompt_token_ids is None:
            prompt_token_ids = event.get("prompt_token_ids")
        for delta_choice in event.get("choices") or []:
            index = delta_choice["index"]
            choice = choices.setdefault(index, _empty_stream_choice(path, index))
            _add_delta(path, choice, delta_choice)
    for choice in choices.values():
        if path == CHAT:
            choice["tool_calls"] = [choice["tool_calls"][i] for i in sorted(choice["tool_calls"])]
    summary = {"object": objects, "model": models, "usage": _usage(usage),
               "prompt_token_ids": prompt_token_ids,
               "choices": [choices[i] for i in sorted(choices)]}
    if continuous_usage:
        summary["chunks_without_usage"] = chunks_without_usage
    else:
        summary["usage_chunks"] = usage_chunks
    return summary


def _empty_stream_choice(path: str, index: int) -> dict:
    common = {"index": index, "finish_reason": None, "stop_reason": None, "token_ids": None}
    if path == CHAT:
        return {**common, "role": None, "content": "", "reasoning": "", "tool_calls": {},
                "logprobs": None}
    return {**common, "text": "", "logprobs": None, "prompt_token_ids": None}


def _extend(choice: dict, key: str, items: list | None) -> None:
    if items is not None:
        choice[key] = (choice[key] or []) + list(items)


def _add_delta(path: str, choice: dict, delta_choice: dict) -> None:
    if delta_choice.get("finish_reason") is not None:
        choice["finish_reason"] = delta_choice["finish_reason"]
    if delta_choice.get("stop_reason") is not None:
        choice["stop_reason"] = delta_choice["stop_reason"]
    _extend(choice, "token_ids", delta_choice.get("token_ids"))
    if path == COMPLETIONS:
        choice["prompt_token_ids"] = (choice["prompt_token_ids"]
                                      or delta_choice.get("prompt_token_ids"))
        choice["text"] += delta_choice.get("text") or ""
        logprobs = _completion_logprobs(delta_choice.get("logprobs"))
        if logprobs is not None:
            if choice["logprobs"] is None:
                choice["logprobs"] = {key: [] for key in logprobs}
            for key, values in logprobs.items():
                choice["logprobs"][key] += values or []
        return
    delta = delta_choice.get("delta") or {}
    choice["role"] = delta.get("role") or choice["role"]
    choice["content"] += delta.get("content") or ""
    choice["reasoning"] += delta.get("reasoning") or ""
    for call in delta.get("tool_calls") or []:
        slot = choice["tool_calls"].setdefault(call.get("index", 0),
                                               {"type": None, "name": "", "arguments": ""})
        slot["type"] = call.get("type") or slot["type"]
        function = call.get("function") or {}
        slot["name"] += function.get("name") or ""
        slot["arguments"] += function.get("arguments") or ""
    _extend(choice, "logprobs", _chat_logprob_entries(delta_choice.get("logprobs")))


# --- comparing -------------------------------------------------------------------------------

def isclose(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-3)


def assert_same(ours: Any, theirs: Any, where: str = "$") -> None:
    """Equal, except floats (within 1e-3) and top-k sets (a tie at the cut may differ)."""
    if isinstance(theirs, TopK) or isinstance(ours, TopK):
        _assert_same_top_k(ours, theirs, where)
    elif isinstance(theirs, float) and not isinstance(ours, bool):
        assert isinstance(ours, int | float) and isclose(ours, theirs), \
            f"{where}: pdserve {ours!r} != vLLM {theirs!r}"
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{where}: pdserve {ours!r} != vLLM {theirs!r}"
        assert ours.keys() == theirs.keys(), \
            f"{where}: keys differ: pdserve {sorted(ours)} vs vLLM {sorted(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list | tuple):
        assert isinstance(ours, list | tuple) and len(ours) == len(theirs), \
            f"{where}: pdserve {_short(ours)} != vLLM {_short(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, f"{where}: pdserve {ours!r} != vLLM {theirs!r}"


def _logprob_of(value: Any) -> float:
    return value[0] if isinstance(value, tuple) else value


def _assert_same_top_k(ours: Any, theirs: Any, where: str) -> None:
    assert isinstance(ours, dict) and isinstance(theirs, dict), \
        f"{where}: pdserve {ours!r} != vLLM {theirs!r}"
    assert len(ours) == len(theirs), f"{where}: pdserve {dict(ours)} != vLLM {dict(theirs)}"
    for key in ours.keys() & theirs.keys():
        assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    # An alternative only one side lists must tie, within tolerance, with the other side's
    # last alternative: two near-equal logits at the cut, ordered differently.
    for side, other in ((ours, theirs), (theirs, ours)):
        for key in side.keys() - other.keys():
            floor = min(_logprob_of(v) for v in other.values())
            assert isclose(_logprob_of(side[key]), floor), \
                f"{where}: top alternatives differ: pdserve {dict(ours)} vs vLLM {dict(theirs)}"


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


ERROR_FIELDS = {"message", "type", "param", "code"}


def assert_openai_error(body: Any, who: str) -> dict:
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), \
        f"{who}: not an OpenAI error object: {_short(body)}"
    error = body["error"]
    assert error.keys() >= ERROR_FIELDS, f"{who}: error lacks {ERROR_FIELDS - error.keys()}"
    assert isinstance(error["message"], str) and error["message"], f"{who}: {error}"
    assert isinstance(error["type"], str) and error["type"], f"{who}: {error}"
    assert error["param"] is None or isinstance(error["param"], str), f"{who}: {error}"
    return error


def _variants() -> list:
    return [pytest.param(case, mode, id=f"{case.id}-{mode}")
            for case in CATALOGUE for mode in case.modes]


# --- the catalogue itself --------------------------------------------------------------------

REQUIRED_FIELDS = {
    "temperature", "seed", "logprobs", "top_logprobs", "prompt_logprobs", "echo", "n",
    "logit_bias", "allowed_token_ids", "bad_words", "min_tokens", "top_k", "min_p",
    "repetition_penalty", "stop", "stop_token_ids", "include_stop_str_in_output",
    "max_completion_tokens", "ignore_eos", "response_format", "structured_outputs", "tools",
    "tool_choice", "parallel_tool_calls", "stream_options",
}


def test_the_catalogue_covers_the_fields_and_is_reproducible():
    """At least 40 cases; every field the brief names is sent; every generating case is
    greedy or seeded, so both servers must give the same tokens."""
    assert len(CATALOGUE) >= 40
    sent = {key for case in CATALOGUE if isinstance(case.body, dict) for key in case.body}
    assert sent >= REQUIRED_FIELDS, f"never sent: {REQUIRED_FIELDS - sent}"
    tool_choices = {json.dumps(case.body.get("tool_choice")) for case in CATALOGUE
                    if isinstance(case.body, dict)}
    assert {'"none"', '"auto"', '"required"'} <= tool_choices
    assert any('"function"' in choice for choice in tool_choices)
    for case in CATALOGUE:
        if case.status == 200 and case.path in (CHAT, COMPLETIONS):
            body = case.body
            assert body.get("temperature") == 0 or body.get("seed") is not None, case.id
            limit = TOOL_MAX_TOKENS if body.get("tools") else 64
            assert (body.get("max_tokens") or body.get("max_completion_tokens")) <= limit, \
                case.id
    assert {case.path for case in CATALOGUE} >= {CHAT, COMPLETIONS, TOKENIZE, DETOKENIZE}


def readme_api_section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme[readme.index("## The API"):readme.index("## Router policies")]


def test_the_readme_lists_what_the_catalogue_proves_and_what_pdserve_refuses():
    """The README's API section is checked against the code: every field the catalogue
    proves answered like vLLM's is listed, and every field pdserve refuses is named."""
    section = readme_api_section()
    named = set(re.findall(r"`([a-z_]+)`", section))
    assert named >= REQUIRED_FIELDS, f"not in the README: {REQUIRED_FIELDS - named}"
    refused = set(NOT_HONOURED)
    assert named >= refused, f"refused but not named: {refused - named}"
    sent = {key for case in CATALOGUE if isinstance(case.body, dict) for key in case.body}
    assert not refused & sent - {"priority"}, "the catalogue sends a field pdserve refuses"
    for endpoint in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
        assert endpoint in section


def test_the_comparison_tells_answers_apart():
    """The comparison itself, on made-up answers: float noise and a tie at the top-k cut
    pass; a different token, finish reason, count or alternative does not."""
    def answer(text="ab", finish="length", completion_tokens=2, top=None, logprob=-0.5):
        top = top or [{"token": "a", "logprob": -0.5, "bytes": [97]},
                      {"token": "c", "logprob": -2.0, "bytes": [99]}]
        return normalise(CHAT, {
            "object": "chat.completion", "model": MODEL,
            "usage": {"prompt_tokens": 5, "completion_tokens": completion_tokens,
                      "total_tokens": 5 + completion_tokens},
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": text},
                         "logprobs": {"content": [{"token": "a", "logprob": logprob,
                                                   "bytes": [97], "top_logprobs": top}]}}]})

    assert_same(answer(), answer(logprob=-0.5000004))
    tie = [{"token": "a", "logprob": -0.5, "bytes": [97]},
           {"token": "d", "logprob": -2.0000001, "bytes": [100]}]
    assert_same(answer(), answer(top=tie))
    other = [{"token": "a", "logprob": -0.5, "bytes": [97]},
             {"token": "d", "logprob": -1.0, "bytes": [100]}]
    for different in (answer(text="ac"), answer(finish="stop"), answer(completion_tokens=3),
                      answer(top=other), answer(logprob=-0.6)):
        with pytest.raises(AssertionError):
            assert_same(different, answer())


# --- the comparison --------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "mode"), _variants())
def test_pdserve_answers_like_vllm(pdserve, reference, case, mode):
    stream = mode == "stream"
    theirs = send(reference, case, stream)
    assert theirs.status == case.status, (
        f"vLLM's server answered {theirs.status}, the catalogue says {case.status} "
        f"({case.note or 'update the catalogue'}): {_short(theirs.body)}")
    ours = send(pdserve, case, stream, AUTH)
    assert ours.status == theirs.status, (
        f"pdserve answered {ours.status}, vLLM {theirs.status}: {_short(ours.body)}")

    if theirs.status != 200:
        their_error = assert_openai_error(theirs.body, "vLLM")
        our_error = assert_openai_error(ours.body, "pdserve")
        assert set(our_error) == set(their_error)
        assert our_error["code"] == their_error["code"], (our_error, their_error)
        return

    if not stream:
        assert_same(normalise(case.path, ours.body), normalise(case.path, theirs.body))
        return
    assert ours.events is not None, f"pdserve did not stream: {_short(ours.body)}"
    assert theirs.done and ours.done, "a stream ended without data: [DONE]"
    assert [e["error"].get("code") for e in ours.error_events] == \
           [e["error"].get("code") for e in theirs.error_events]
    continuous = bool((case.request(True).get("stream_options") or {})
                      .get("continuous_usage_stats"))
    assert_same(reassemble(case.path, ours.events, continuous),
                reassemble(case.path, theirs.events, continuous))


# --- the fields take effect on vLLM's server (so that no parity case is vacuous) ------------

def _ok(answer: Answer) -> dict:
    assert answer.status == 200, _short(answer.body)
    return answer.body


def _text(body: dict, index: int = 0) -> str:
    choice = body["choices"][index]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def _matches_schema(value: Any) -> bool:
    return (isinstance(value, dict) and set(value) == {"colour", "size"}
            and value["colour"] in ("red", "green", "blue")
            and isinstance(value["size"], int) and 0 <= value["size"] <= 9)


def check_logit_bias(reference):
    case = CASES["chat-logit-bias-forces-a-token"]
    biased = _text(_ok(ask_reference(reference, case)))
    plain = _text(_ok(ask_reference(reference, case, logit_bias=DROP)))
    assert biased == chr(FORCED_ID) * case.body["max_tokens"] != plain


def check_allowed_token_ids(reference):
    case = CASES["chat-allowed-token-ids"]
    allowed = {chr(i) for i in ALLOWED_IDS}
    assert set(_text(_ok(ask_reference(reference, case)))) <= allowed
    assert not set(_text(_ok(ask_reference(reference, case, allowed_token_ids=DROP)))) <= allowed


def check_bad_words(reference):
    case = CASES["chat-bad-words"]
    banned = set(BAD_WORDS)
    assert not banned & set(_text(_ok(ask_reference(reference, case))))
    assert banned & set(_text(_ok(ask_reference(reference, case, bad_words=DROP)))), \
        "the unbanned output has none of the bad words: the case would not test them"


def check_min_tokens(reference):
    case = CASES["chat-min-tokens"]
    with_min = _ok(ask_reference(reference, case))
    without = _ok(ask_reference(reference, case, min_tokens=DROP))
    assert without["usage"]["completion_tokens"] == 1  # any printable byte stops it
    assert with_min["usage"]["completion_tokens"] >= case.body["min_tokens"]
    assert with_min["choices"][0]["finish_reason"] == "stop"


def check_stop_strings(reference):
    body = _ok(ask_reference(reference, CASES["chat-stop"]))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] in STOP_STRINGS
    assert not set(_text(body)) & set(STOP_STRINGS)
    included = _ok(ask_reference(reference, CASES["chat-stop-included"]))
    assert _text(included) == _text(body) + choice["stop_reason"]
    completion_case = CASES["completion-stop-included"]
    done = _ok(ask_reference(reference, completion_case))["choices"][0]
    assert done["finish_reason"] == "stop" and done["text"].endswith(done["stop_reason"])


def check_stop_token_ids(reference):
    choice = _ok(ask_reference(reference, CASES["chat-stop-token-ids"]))["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] in CASES["chat-stop-token-ids"].body["stop_token_ids"]


def check_max_completion_tokens(reference):
    body = _ok(ask_reference(reference, CASES["chat-max-completion-tokens"]))
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


def check_ignore_eos(reference):
    forced = _ok(ask_reference(reference, CASES["chat-eos-forced"]))
    assert forced["choices"][0]["finish_reason"] == "stop"
    assert forced["usage"]["completion_tokens"] == 1
    case = CASES["chat-ignore-eos"]
    ignored = _ok(ask_reference(reference, case))
    assert ignored["choices"][0]["finish_reason"] == "length"
    assert ignored["choices"][0]["token_ids"] == [EOS_ID] * case.body["max_tokens"]


def check_json_outputs(reference):
    for case_id in ("chat-json-object", "completion-json-object"):
        body = _ok(ask_reference(reference, CASES[case_id]))
        assert body["choices"][0]["finish_reason"] == "stop", case_id
        assert isinstance(json.loads(_text(body)), dict), case_id
    for case_id in ("chat-json-schema", "chat-structured-json"):
        body = _ok(ask_reference(reference, CASES[case_id]))
        assert body["choices"][0]["finish_reason"] == "stop", case_id
        assert _matches_schema(json.loads(_text(body))), (case_id, _text(body))
    # Sampled, the grammar's free whitespace may run to max_tokens: the JSON starts, at least.
    sampled = _text(_ok(ask_reference(reference, CASES["chat-json-schema-seeded"])))
    assert re.match(r'\{\s*"colour"\s*:\s*"(red|green|blue)"', sampled), sampled
    plain = _text(_ok(ask_reference(reference, CASES["chat-json-object"],
                                    response_format=DROP)))
    with pytest.raises(ValueError):
        json.loads(plain)


def check_structured_outputs(reference):
    regex = _text(_ok(ask_reference(reference, CASES["chat-structured-regex"])))
    assert re.fullmatch(REGEX, regex), regex
    for case_id in ("chat-structured-choice", "completion-structured-choice"):
        assert _text(_ok(ask_reference(reference, CASES[case_id]))) in CHOICES
    grammar = _text(_ok(ask_reference(reference, CASES["chat-structured-grammar"])))
    assert re.fullmatch(r"ab|cd|ef[0-9]", grammar), grammar


def check_n_and_seed(reference):
    for case_id, n in (("chat-n2-seeded", 2), ("chat-n3-seeded-logprobs", 3),
                       ("completion-n2-seeded", 2)):
        body = _ok(ask_reference(reference, CASES[case_id]))
        texts = [_text(body, i) for i in range(len(body["choices"]))]
        assert len(texts) == n and len(set(texts)) == n, (case_id, texts)
    case = CASES["chat-seeded"]
    first, again = (_text(_ok(ask_reference(reference, case))) for _ in range(2))
    other_seed = _text(_ok(ask_reference(reference, case, seed=case.body["seed"] + 1)))
    assert first == again != other_seed


def check_sampling_filters(reference):
    greedy = _text(_ok(ask_reference(reference, CASES["chat-greedy"])))
    top_k = CASES["chat-top-k"]
    assert _text(_ok(ask_reference(reference, top_k, top_k=1))) == greedy
    assert _text(_ok(ask_reference(reference, top_k, top_k=DROP))) != greedy
    assert _text(_ok(ask_reference(reference, CASES["chat-min-p"], min_p=1.0))) == greedy
    penalised = CASES["chat-repetition-penalty"]
    assert _text(_ok(ask_reference(reference, penalised))) != _text(
        _ok(ask_reference(reference, penalised, repetition_penalty=DROP)))


def check_logprobs(reference):
    body = _ok(ask_reference(reference, CASES["chat-logprobs"]))
    entries = body["choices"][0]["logprobs"]["content"]
    assert len(entries) == 12 and all(len(e["top_logprobs"]) == 3 for e in entries)
    seeded_entries = _ok(ask_reference(reference, CASES["chat-logprobs-seeded"]))
    assert all(len(e["top_logprobs"]) == MAX_LOGPROBS
               for e in seeded_entries["choices"][0]["logprobs"]["content"])
    completion = _ok(ask_reference(reference, CASES["completion-logprobs"]))["choices"][0]
    assert all(3 <= len(alts) <= 4 for alts in completion["logprobs"]["top_logprobs"])


def check_prompt_logprobs_and_echo(reference):
    for case_id in ("chat-prompt-logprobs", "chat-prompt-logprobs-long"):
        body = _ok(ask_reference(reference, CASES[case_id]))
        assert len(body["prompt_logprobs"]) == body["usage"]["prompt_tokens"], case_id
        assert body["prompt_logprobs"][0] is None and body["prompt_logprobs"][1], case_id
    choice = _ok(ask_reference(reference, CASES["completion-prompt-logprobs"]))["choices"][0]
    assert len(choice["prompt_logprobs"]) == len(SHORT)
    echo = _ok(ask_reference(reference, CASES["completion-echo"]))["choices"][0]
    assert echo["text"].startswith(SHORT) and len(echo["text"]) > len(SHORT)
    assert echo["logprobs"]["tokens"][:len(SHORT)] == list(SHORT)


def check_prompt_lengths_take_both_paths(reference):
    for case_id in ("chat-greedy-long", "completion-greedy-long", "chat-seeded-long"):
        assert _ok(ask_reference(reference, CASES[case_id]))["usage"]["prompt_tokens"] > 1000
    assert _ok(ask_reference(reference, CASES["chat-greedy-medium"]))["usage"][
        "prompt_tokens"] > THRESHOLD
    for case_id in ("chat-greedy", "completion-greedy", "completion-token-id-prompt"):
        assert _ok(ask_reference(reference, CASES[case_id]))["usage"]["prompt_tokens"] \
            < THRESHOLD, f"{case_id} would not take the decode-local path"
    capped = _ok(ask_reference(reference, CASES["completion-max-tokens-capped-at-context"]))
    assert capped["usage"]["total_tokens"] == MAX_MODEL_LEN
    assert capped["choices"][0]["finish_reason"] == "length"


def check_stream_usage(reference):
    def usage_chunks(case_id: str) -> tuple[int, int]:
        answer = send(reference, CASES[case_id], stream=True)
        assert answer.status == 200 and answer.done
        carrying = [e for e in answer.events if e.get("usage")]
        return len(carrying), len(answer.events)

    carrying, _ = usage_chunks("chat-stream-usage")
    assert carrying == 1
    assert usage_chunks("chat-stream-no-usage")[0] == 0
    for case_id in ("chat-stream-continuous-usage", "completion-stream-continuous-usage"):
        carrying, total = usage_chunks(case_id)
        assert carrying == total > 2, case_id


def check_tools(reference):
    none = _ok(ask_reference(reference, CASES["chat-tools-none"]))
    assert not none["choices"][0]["message"].get("tool_calls")
    named = ask_reference(reference, CASES["chat-tools-named"])
    required = ask_reference(reference, CASES["chat-tools-required"])
    if not TOOL_PARSER:
        for answer in (named, required):
            assert answer.status == 400 and "tool-call-parser" in answer.body["error"]["message"]
        return
    calls = _ok(named)["choices"][0]["message"]["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"])["city"] in ("Paris", "Oslo")
    calls = _ok(required)["choices"][0]["message"]["tool_calls"]
    assert calls and {c["function"]["name"] for c in calls} <= {"get_weather", "get_time"}


def check_tokenizer_endpoints(reference):
    tokens = _ok(ask_reference(reference, CASES["tokenize-prompt"]))
    assert tokens["tokens"] == list(b"Hello, world") and tokens["count"] == 12
    chat_prompt = _ok(ask_reference(reference, CASES["chat-return-token-ids"]))
    messages = _ok(ask_reference(reference, CASES["tokenize-messages"]))
    assert messages["tokens"] == chat_prompt["prompt_token_ids"]
    assert _ok(ask_reference(reference, CASES["detokenize"]))["prompt"] == "Hello"


def check_conversation_shapes(reference):
    parts = _ok(ask_reference(reference, CASES["chat-content-parts"]))
    single = _ok(ask_reference(reference, CASES["chat-greedy"]))
    assert parts["usage"]["prompt_tokens"] > single["usage"]["prompt_tokens"]
    turns = _ok(ask_reference(reference, CASES["chat-system-and-turns"]))
    assert turns["usage"]["prompt_tokens"] > 60
    assert _ok(ask_reference(reference, CASES["chat-model-omitted"]))["model"] == MODEL


FIELD_CHECKS = [check_logit_bias, check_allowed_token_ids, check_bad_words, check_min_tokens,
                check_stop_strings, check_stop_token_ids, check_max_completion_tokens,
                check_ignore_eos, check_json_outputs, check_structured_outputs,
                check_n_and_seed, check_sampling_filters, check_logprobs,
                check_prompt_logprobs_and_echo, check_prompt_lengths_take_both_paths,
                check_stream_usage, check_tools, check_tokenizer_endpoints,
                check_conversation_shapes]


@pytest.mark.parametrize("check", FIELD_CHECKS,
                         ids=[c.__name__.removeprefix("check_") for c in FIELD_CHECKS])
def test_the_catalogue_exercises_the_fields_on_the_reference(reference, check):
    check(reference)
