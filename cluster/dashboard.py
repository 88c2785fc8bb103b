"""The Grafana dashboard, built from the metric catalogue (pure).

``pdserve dashboard --config X`` prints it, with the SLO lines at X's ``slo`` section (the
objectives the autoscaler scales for); the committed copy is
``ray_configs/grafana/pdserve-dashboard.json``, made from ``ray_configs/local.yaml``, and a
unit test keeps the two identical, so a renamed metric cannot leave a dashboard panel
silently empty.
"""

from __future__ import annotations

import json
from typing import Any

from cluster import metrics as m
from cluster.slo import SLOConfig

_RATE = "$__rate_interval"


def _quantiles(spec: m.MetricSpec, by: str = "") -> list[dict[str, str]]:
    group = f"le{', ' + by if by else ''}"
    return [
        {"expr": f"histogram_quantile({q}, sum by ({group}) "
                 f"(rate({spec.exported_name}_bucket[{_RATE}])))",
         "legendFormat": f"p{int(q * 100)}" + (f" {{{{{by}}}}}" if by else "")}
        for q in (0.5, 0.95, 0.99)
    ]


def _panel(panel_id: int, title: str, targets: list[dict[str, str]], unit: str,
           x: int, y: int, description: str = "") -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [{**target, "refId": chr(ord("A") + i)} for i, target in enumerate(targets)],
    }


def _slo_line(value: float) -> dict[str, str]:
    return {"expr": f"vector({value})", "legendFormat": "SLO"}


def build_dashboard(slo: SLOConfig) -> dict[str, Any]:
    """The dashboard's JSON model, its SLO lines at ``slo``'s objectives."""
    ok = '{outcome="ok"}'
    panels_spec = [
        ("Time to first token vs SLO", [*_quantiles(m.TTFT), _slo_line(slo.ttft_p95_s)], "s",
         f"Arrival at the router to first token; the SLO is p95 < "
         f"{slo.ttft_p95_s * 1000:g} ms at peak."),
        ("Inter-token latency vs SLO", [*_quantiles(m.ITL), _slo_line(slo.itl_p95_s)], "s",
         f"Gaps between streamed tokens; the SLO is p95 < {slo.itl_p95_s * 1000:g} ms."),
        ("Where the time to the first event goes (mean per request, by stage)", [{
            "expr": f"sum by (stage) (rate({m.STAGE_TOTAL.exported_name}[{_RATE}])) / "
                    f"sum by (stage) (rate({m.STAGE.exported_name}_count[{_RATE}]))",
            "legendFormat": "{{stage}}"}], "s",
         "render (vLLM's layer: template, tokenize), admission (waiting for the budget), "
         "prefill (the prefill pool), first_token (the decode pool: KV pull or local "
         "prefill, first step), first_event (the first bytes out); they add up to TTFT"),
        ("Stage p95 (by stage)", [{
            "expr": f"histogram_quantile(0.95, sum by (le, stage) "
                    f"(rate({m.STAGE.exported_name}_bucket[{_RATE}])))",
            "legendFormat": "p95 {{stage}}"}], "s", ""),
        ("The engines' part of the pool stages, and the hops to them (mean per request)", [{
            "expr": f"sum by (pool, phase) (rate({m.ENGINE_PHASE_TOTAL.exported_name}[{_RATE}])) "
                    f"/ sum by (pool, phase) "
                    f"(rate({m.ENGINE_PHASE.exported_name}_count[{_RATE}]))",
            "legendFormat": "{{pool}} {{phase}}"}], "s",
         "queued: arrival to first scheduled; prefill: scheduled to first token (on the "
         "decode pool the KV pull included). to_engine and from_engine: the replica's hop "
         "to its engine core (with the wait for a step in flight) and the first output's way "
         "back (vLLM's AsyncLLM). The rest of the prefill and first_token stages is Serve's "
         "calls, the routers and the replicas' own code"),
        ("End-to-end latency", _quantiles(m.E2E), "s", ""),
        ("Requests by outcome", [{
            "expr": f"sum by (outcome) (rate({m.REQUESTS.exported_name}[{_RATE}]))",
            "legendFormat": "{{outcome}}"}], "reqps",
         "rejected = 429/503 (overload), client_error = 4xx, failed = 5xx"),
        ("Pool sizes", [{
            "expr": f"sum by (pool) ({m.REPLICAS.exported_name})",
            "legendFormat": "{{pool}}"}], "none", "Live engine replicas per pool"),
        ("KV-cache utilisation", [{
            "expr": f"max by (pool) ({m.KV_USAGE.exported_name})",
            "legendFormat": "max {{pool}}"}, {
            "expr": f"avg by (pool) ({m.KV_USAGE.exported_name})",
            "legendFormat": "avg {{pool}}"}], "percentunit", ""),
        ("Running and waiting requests", [{
            "expr": f"sum by (pool) ({m.RUNNING.exported_name})",
            "legendFormat": "running {{pool}}"}, {
            "expr": f"sum by (pool) ({m.WAITING.exported_name})",
            "legendFormat": "waiting {{pool}}"}], "none", ""),
        ("Tokens per second", [{
            "expr": f"sum (rate({m.GENERATION_TOKENS.exported_name}[{_RATE}]))",
            "legendFormat": "generated for clients"}, {
            "expr": f"sum (rate({m.OUTPUT_CHUNKS.exported_name}[{_RATE}]))",
            "legendFormat": "chunks streamed to clients"}, {
            "expr": f"sum by (source) (rate({m.ENGINE_PROMPT_TOKENS.exported_name}"
                    f"{{pool=\"prefill\"}}[{_RATE}]))",
            "legendFormat": "prefill prompt {{source}}"}, {
            "expr": f"sum by (source) (rate({m.ENGINE_PROMPT_TOKENS.exported_name}"
                    f"{{pool=\"decode\"}}[{_RATE}]))",
            "legendFormat": "decode prompt {{source}}"}], "short",
         "decode prompt 'transferred' = KV received over NIXL instead of recomputed; "
         "tokens per chunk = generated / chunks (router.stream_chunk_interval_ms)"),
        ("KV transfer latency", _quantiles(m.KV_TRANSFER_SECONDS), "s", ""),
        ("KV transfer throughput and failures", [{
            "expr": f"sum (rate({m.KV_TRANSFER_BYTES.exported_name}[{_RATE}]))",
            "legendFormat": "bytes/s"}, {
            "expr": f"sum (rate({m.KV_TRANSFER_FAILURES.exported_name}[{_RATE}]))",
            "legendFormat": "failures/s"}], "Bps", ""),
        ("Overload rejections", [{
            "expr": f"sum (rate({m.REQUESTS.exported_name}{{outcome=\"rejected\"}}[{_RATE}]))",
            "legendFormat": "rejected/s"}, {
            "expr": f"sum (rate({m.REQUESTS.exported_name}{ok}[{_RATE}]))",
            "legendFormat": "ok/s"}], "reqps", ""),
        ("Queue time before dispatch", _quantiles(m.QUEUE), "s", ""),
        ("Canary share of traffic", [{
            "expr": f"max by (model, version) ({m.CANARY_PERCENT.exported_name})",
            "legendFormat": "{{model}} {{version}}"}], "percent",
         "The canary gate steps the candidate up, or rolls it back to 0"),
        ("Autoscaling: decided vs live replicas", [{
            "expr": f"max by (deployment) ({m.DESIRED_REPLICAS.exported_name})",
            "legendFormat": "decided {{deployment}}"}, {
            "expr": f"max by (deployment) ({m.STANDBY_FLOOR.exported_name})",
            "legendFormat": "standby floor {{deployment}}"}, {
            "expr": f"sum by (pool, version) ({m.REPLICAS.exported_name})",
            "legendFormat": "live {{pool}} {{version}}"}], "none",
         "Each pool's own policy; the floor comes from the standby schedule"),
    ]
    panels = [
        _panel(i + 1, title, targets, unit, x=12 * (i % 2), y=8 * (i // 2),
               description=description)
        for i, (title, targets, unit, description) in enumerate(panels_spec)
    ]
    return {
        "title": "pdserve",
        "uid": "pdserve-overview",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "tags": ["pdserve", "llm-serving"],
        "templating": {"list": [{
            "name": "datasource", "type": "datasource", "query": "prometheus",
            "label": "Prometheus",
        }]},
        "panels": panels,
    }


def dashboard_json(slo: SLOConfig) -> str:
    """What ``pdserve dashboard`` prints: Grafana's import format."""
    return json.dumps(build_dashboard(slo), indent=2) + "\n"
