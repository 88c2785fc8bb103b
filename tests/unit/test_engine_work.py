"""The engines' work during a benchmark run, read from pdserve's counters."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tools.bench import engine_work


def scrape(prompt_tokens: dict[tuple[str, str, str], float], kv_bytes: dict[str, float],
           generated: dict[str, float]) -> engine_work.EngineWork:
    """Prometheus text as Ray exports it: one series per (pool, replica[, source]), with
    Ray's own labels beside pdserve's (the names spelled out, as a scrape shows them)."""
    lines = ["# TYPE ray_pdserve_engine_prompt_tokens_total counter"]
    for (pool, replica, source), value in prompt_tokens.items():
        lines.append(f'ray_pdserve_engine_prompt_tokens_total{{pool="{pool}",'
                     f'replica="{replica}",source="{source}",version="v1",'
                     f'WorkerId="w{replica}"}} {value}')
    for replica, value in kv_bytes.items():
        lines.append(f'ray_pdserve_kv_transfer_bytes_total{{pool="decode",'
                     f'replica="{replica}",version="v1"}} {value}')
    for pool, value in generated.items():
        lines.append(f'ray_pdserve_engine_generation_tokens_total{{pool="{pool}",'
                     f'replica="r0",version="v1"}} {value}')
    lines.append('ray_pdserve_requests_total{outcome="ok"} 9')  # not engine work
    return engine_work.engine_work(text_string_to_metric_families("\n".join(lines) + "\n"))


def test_replicas_add_up_and_only_the_run_between_the_scrapes_counts():
    before = scrape({("decode", "d0", "cached"): 64, ("decode", "d1", "cached"): 32,
                     ("prefill", "p0", "computed"): 500}, {"d0": 1000}, {"decode": 10})
    after = scrape({("decode", "d0", "cached"): 96, ("decode", "d1", "cached"): 32,
                    ("decode", "d1", "transferred"): 200, ("decode", "d0", "computed"): 4,
                    ("prefill", "p0", "computed"): 700}, {"d0": 1000, "d1": 4096},
                   {"decode": 30})
    assert before == {"decode prompt tokens cached": 96, "prefill prompt tokens computed": 500,
                      "kv bytes pulled": 1000, "decode generated tokens": 10}
    run = engine_work.since(before, after)
    assert run == {"decode prompt tokens cached": 32, "decode prompt tokens transferred": 200,
                   "decode prompt tokens computed": 4, "prefill prompt tokens computed": 200,
                   "kv bytes pulled": 4096, "decode generated tokens": 20}
    # every prompt the decode pool took in, wherever its KV came from
    assert engine_work.decode_prompt_tokens(run) == 236
