"""A small OpenAI-protocol client for tests: one call, streamed or not, one result shape."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx

from router.sse import sse_lines

# The test cluster requires an API key (router.auth in pdserve-test.yaml).
API_KEY = "sk-pdserve-test"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {"Authorization": "Bearer sk-pdserve-admin"}   # router.auth.admin_keys


@dataclass
class Generation:
    status: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None
    usage: dict | None = None
    events: list[dict] = field(default_factory=list)
    headers: dict = field(default_factory=dict)
    error: dict | None = None


def body_for(kind: str, model: str, prompt: str, **params) -> tuple[str, dict]:
    if kind == "chat":
        return "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": prompt}], **params}
    return "/v1/completions", {"model": model, "prompt": prompt, **params}


def generate(base_url: str, kind: str, model: str, prompt: str, *, stream: bool,
             timeout: float = 300, **params) -> Generation:
    path, body = body_for(kind, model, prompt, stream=stream, return_token_ids=True, **params)
    if stream:
        body["stream_options"] = {"include_usage": True}
    with httpx.Client(base_url=base_url, timeout=timeout, headers=AUTH) as client:
        if not stream:
            response = client.post(path, json=body)
            return _from_body(response)
        with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                response.read()
                return _from_body(response)
            return _from_events(response)


def _from_body(response: httpx.Response) -> Generation:
    data = response.json()
    result = Generation(response.status_code, headers=dict(response.headers))
    if "error" in data:
        result.error = data["error"]
        return result
    choice = data["choices"][0]
    result.text = choice["text"] if "text" in choice else choice["message"]["content"]
    result.token_ids = choice.get("token_ids") or []
    result.prompt_token_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    result.finish_reason = choice["finish_reason"]
    result.usage = data["usage"]
    return result


def _from_events(response: httpx.Response) -> Generation:
    result = Generation(response.status_code, headers=dict(response.headers))
    done = False
    for line in sse_lines(response.iter_bytes()):
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: "):]
        if payload == "[DONE]":
            done = True
            continue
        assert not done, "event after [DONE]"
        event = json.loads(payload)
        result.events.append(event)
        if "error" in event:
            result.error = event["error"]
            continue
        if result.prompt_token_ids is None:  # chat: top level; completions: in the choice
            choices = event.get("choices") or [{}]
            result.prompt_token_ids = (event.get("prompt_token_ids")
                                       or choices[0].get("prompt_token_ids"))
        if event.get("usage"):
            result.usage = event["usage"]
        for choice in event["choices"]:
            result.text += choice.get("text") or choice.get("delta", {}).get("content") or ""
            result.token_ids.extend(choice.get("token_ids") or [])
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
    assert done, "stream ended without data: [DONE]"
    return result
