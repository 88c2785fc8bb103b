"""Sends a planned workload to an OpenAI-compatible server and records what came back."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from router.sse import sse_lines_async
from tools.bench.stats import RequestRecord
from tools.bench.workload import PlannedRequest


async def run_workload(
    base_url: str, model: str, requests: list[PlannedRequest], *,
    timeout_s: float = 600, progress: bool = True, label: str = "", api_key: str | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send every request at its planned time (open loop), and each later turn of a
    conversation a think time after the answer before it, with the history before its
    message (closed loop within a conversation); return records and duration."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    records = [RequestRecord(r.index, r.kind, r.prompt_tokens, sent_at=0.0, turn=r.turn,
                             follows=r.follows, prefix_group=r.prefix_group)
               for r in requests]
    bar = _progress_bar(len(requests), label) if progress else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    answered = {r.index: asyncio.Event() for r in requests}
    histories: dict[int, str] = {}  # each answered request's prompt and answer
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits,
                                 headers=headers) as client:
        start = time.perf_counter()

        async def one(planned: PlannedRequest, record: RequestRecord) -> None:
            try:
                prompt = await _due(planned, start, answered, histories)
                if prompt is None:
                    record.error = "earlier_turn_failed"
                    return
                answer = await _send(client, model, planned, record, start, prompt)
                if record.ok:
                    histories[planned.index] = prompt + answer
            finally:
                answered[planned.index].set()
                if bar:
                    bar.update(1)

        await asyncio.gather(*(one(p, r) for p, r in zip(requests, records, strict=True)))
        duration = time.perf_counter() - start
    if bar:
        bar.close()
    return records, duration


async def _due(planned: PlannedRequest, start: float, answered: dict[int, asyncio.Event],
               histories: dict[int, str]) -> str | None:
    """Wait until ``planned`` is due; its whole prompt (None: the turn it follows failed)."""
    if planned.follows is None:
        await asyncio.sleep(max(0.0, planned.send_at - (time.perf_counter() - start)))
        return planned.prompt
    await answered[planned.follows].wait()
    history = histories.get(planned.follows)
    if history is None:
        return None
    await asyncio.sleep(planned.think_s)  # the user reads the answer, then types
    return history + planned.prompt


def _progress_bar(total: int, label: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=label or "requests", unit="req", leave=False)


async def _send(client: httpx.AsyncClient, model: str, planned: PlannedRequest,
                record: RequestRecord, start: float, prompt: str) -> str:
    """Stream one request into ``record``; the answer's text."""
    # a trace's prompt is token ids (OpenAI's completions take a list of them)
    sent = prompt if planned.prompt_token_ids is None else list(planned.prompt_token_ids)
    body = {
        "model": model, "prompt": sent, "max_tokens": planned.max_tokens,
        "temperature": 0, "stream": True, "ignore_eos": True, "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    record.sent_at = time.perf_counter() - start
    text: list[str] = []
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            record.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                record.error = f"http_{response.status_code}"
                return ""
            async for line in sse_lines_async(response.aiter_bytes()):
                _consume(line, record, time.perf_counter() - start, text)
    except httpx.TimeoutException:
        record.error = "timeout"
    except httpx.HTTPError as error:
        record.error = type(error).__name__
    return "".join(text)


def _consume(line: str, record: RequestRecord, now: float, text: list[str]) -> None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    event = json.loads(line[len("data: "):])
    if "error" in event:
        record.error = f"stream_{event['error'].get('code') or 'error'}"
        return
    for choice in event.get("choices", []):
        # Servers that do not return token ids: one token per non-empty chunk.
        tokens = len(choice.get("token_ids") or []) or (1 if choice.get("text") else 0)
        if tokens and record.first_token_at is None:
            record.first_token_at = now
        record.token_times.extend([now] * tokens)
        text.append(choice.get("text") or "")
    usage = event.get("usage")
    if usage:
        record.output_tokens = usage["completion_tokens"]
        # a later turn's length was an estimate: the server counted the real one
        record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
    elif record.token_times:
        record.output_tokens = len(record.token_times)
