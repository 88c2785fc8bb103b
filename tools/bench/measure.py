"""Running a workload and reading what the servers measured of it (shell: HTTP, clocks).

``measure_workload`` sends one seeded workload and summarises what came back; given a
pdserve cluster's Prometheus endpoint it also scrapes, before and after, where the time to
the first event went (tools/bench/breakdown.py) and what the engines did
(tools/bench/engine_work.py). ``vllm_phases`` reads the same of a lone vLLM server.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict

from cluster.config import PDServeConfig
from tools.bench import breakdown, engine_work, quality
from tools.bench.runner import run_workload
from tools.bench.stats import SLO, RequestRecord, summarise
from tools.bench.workload import PlannedRequest, WorkloadSpec, plan

# One scrape of a pdserve cluster's metrics: its stage histograms and its engines' work.
Scrape = tuple[breakdown.StageSamples, engine_work.EngineWork]


def token_counter(tokenizer_path: str | None):
    """A prompt-length counter: the HF tokenizer at ``tokenizer_path``, else ~4 chars/token."""
    if tokenizer_path is None:
        return lambda text: max(1, len(text) // 4)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def measure_workload(base_url: str, model: str, spec: WorkloadSpec, count_tokens, slo: SLO,
                     progress: bool, label: str, api_key: str | None = None,
                     metrics_url: str | None = None) -> tuple[list[RequestRecord], dict]:
    """Run one synthetic workload (``measure_requests`` of its plan)."""
    records, summary = measure_requests(base_url, model, plan(spec, count_tokens), slo,
                                        progress, label, api_key, metrics_url)
    return records, summary | {"workload": asdict(spec)}


def measure_requests(base_url: str, model: str, requests: list[PlannedRequest], slo: SLO,
                     progress: bool, label: str, api_key: str | None = None,
                     metrics_url: str | None = None) -> tuple[list[RequestRecord], dict]:
    """Send planned requests and summarise them (all, short, long, later turns); with
    ``metrics_url`` (a pdserve cluster's Prometheus endpoint), also where their time to
    the first event went, stage by stage."""
    before = settled_scrape(metrics_url)
    records, duration = asyncio.run(
        run_workload(base_url, model, requests, progress=progress, label=label,
                     api_key=api_key)
    )
    summary = {
        "all": summarise(records, duration, slo),
        "short": summarise(records, duration, slo, kind="short"),
        "long": summarise(records, duration, slo, kind="long"),
        "later_turns": summarise(records, duration, slo, later_turns=True),
        "duration_s": duration,
    }
    if before is not None:
        summary |= work_since(metrics_url, before, sum(record.ok for record in records))
    return records, summary


def metrics_url_of(config: PDServeConfig) -> str | None:
    """The Prometheus endpoint of the local cluster ``config`` starts, if it exports one."""
    port = config.ray.metrics_export_port
    if config.ray.address is not None or port is None:
        return None
    return f"http://{config.ray.node_ip_address or config.router.host}:{port}/metrics"


def scrape(metrics_url: str) -> Scrape:
    """One read of a pdserve cluster's stage histograms and engine counters."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(httpx.get(metrics_url, timeout=30).text))
    return breakdown.stage_samples(families), engine_work.engine_work(families)


def settled_scrape(metrics_url: str | None) -> Scrape | None:
    """The metrics once every earlier request's report is in: unchanged for longer than an
    engine's count takes to reach a scrape (its replica's flush, then Ray's export; a
    minute at most), so that requests answered before the run are not counted in it."""
    if metrics_url is None:
        return None
    import ray

    from cluster.metrics import settle_s

    settle = settle_s(ray._config.metrics_report_interval_ms() / 1000)
    deadline = time.monotonic() + 60
    last, since = scrape(metrics_url), time.monotonic()
    while time.monotonic() - since < settle and time.monotonic() < deadline:
        time.sleep(1)
        latest = scrape(metrics_url)
        if latest != last:
            last, since = latest, time.monotonic()
    return last


def work_since(metrics_url: str, before: Scrape, answered: int) -> dict[str, dict]:
    """The stage breakdown of the ``answered`` requests since ``before`` and the engines'
    work for them: Ray exports the router's and the engines' metrics every few seconds, so
    wait (30 s at most) until every request's stages are in, then until the scrape
    settles: an engine's replica flushes its counts a few seconds after the step that
    made them, so they can arrive one export after the phases they belong to."""
    deadline = time.monotonic() + 30
    stages_before, work_before = before
    stages_after, _ = scrape(metrics_url)
    while (min(breakdown.answered(stages_before, stages_after),
               breakdown.decoded(stages_before, stages_after)) < answered
           and time.monotonic() < deadline):
        time.sleep(1)
        stages_after, _ = scrape(metrics_url)
    stages_after, work_after = settled_scrape(metrics_url)
    stages = breakdown.breakdown(stages_before, stages_after)
    print(breakdown.table(stages))
    return {"stages": stages, "engine_work": engine_work.since(work_before, work_after)}


def vllm_phases(base_url: str) -> breakdown.VllmPhaseTotals:
    """A vLLM server's engine-phase totals so far, from its own ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return breakdown.vllm_phase_totals(text_string_to_metric_families(text))


def vllm_phases_since(base_url: str, before: breakdown.VllmPhaseTotals,
                      answered: int) -> dict[str, dict[str, float]]:
    """A vLLM server's engine phases (means) of the ``answered`` requests since ``before``:
    its API server records a request's when its last output arrives, which can be just
    after the client has read the stream's end (10 s at most)."""
    deadline = time.monotonic() + 10
    phases = breakdown.vllm_phase_means(before, vllm_phases(base_url))
    while (phases.get("engine prefill", {}).get("requests", 0) < answered
           and time.monotonic() < deadline):
        time.sleep(0.2)
        phases = breakdown.vllm_phase_means(before, vllm_phases(base_url))
    print("vllm: its engine's phases (means; vLLM's own buckets are too coarse for a p50)")
    for phase, row in phases.items():
        print(f"  {phase:<24}{row['requests']:>9.0f}{row['mean_s'] * 1000:>9.1f}")
    return phases


def quality_positions(base_url: str, model: str, passages: int, chars: int,
                      top: int) -> list[list[quality.Position]]:
    """Each held-out passage's prompt logprobs, read through the service (an echoed
    completion: the engine computes the prompt itself, pdserve's decode-local path)."""
    import httpx

    from cluster.tiny_training import held_out_prompts

    positions = []
    with httpx.Client(base_url=base_url, timeout=300) as client:
        for text in held_out_prompts(passages, chars):
            response = client.post("/v1/completions", json={
                "model": model, "prompt": text, "max_tokens": 1, "temperature": 0,
                "echo": True, "logprobs": top, "return_tokens_as_token_ids": True})
            response.raise_for_status()
            body = response.json()
            positions.append(quality.positions_from_echo(body["choices"][0]["logprobs"],
                                                         body["usage"]["prompt_tokens"]))
    return positions
