"""What many router replicas that cannot see each other's sends cost a plan.

Plans the reference scenario as ``pdserve plan --rate 5200 --router-views shared`` does
(one view shared by all router replicas: no herding), then simulates the planned
cluster's slice with that shared view and with each router replica on its own view (the
replicas' reports and only its own sends since them, as pdserve's routers route), at each
of ``--report-intervals``: ranked least loaded first, with and without the base config's
pools' ``max_ongoing_requests`` (Serve turns a request away from a full replica), and
with the first choice drawn (``router.routing.*.spread``, the routers' default). Prints a
markdown table (docs/planning.md): TTFT and ITL p50 / p95 / p99 and the busiest decode
replica's share of the slice's requests over its fair share.

    .venv/bin/python tools/experiments/router_herding.py          # ~8 min on 2 cores
    .venv/bin/python tools/experiments/router_herding.py --report-intervals 1 \
        --prefill-max-ongoing 32,16,8,4,2                # the prefill pool's Serve limit
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tools.planner.search import arrived_in, read, run_slice  # noqa: E402
from tools.planner.study import plan_for_study  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="5200")
    parser.add_argument("--report-intervals", default="1,0.25",
                        help="the replicas' load report periods to simulate, seconds")
    parser.add_argument("--prefill-max-ongoing", default="",
                        help="then, at the first report interval with each router on its "
                        "own view and drawing, the prefill pool's max_ongoing_requests at "
                        "each of these values (comma-separated)")
    args = parser.parse_args()
    _, plan, _ = plan_for_study(
        ["--rate", args.rate, "--router-views", "shared"])
    prefill, decode = plan.prediction.prefill_replicas, plan.prediction.decode_replicas
    print(f"planned: {prefill} prefill and {decode} decode replicas; "
          f"{plan.inputs.routers_per_decode:.1f} router replicas per decode replica")
    print("| report interval | router views | first choice | Serve's max_ongoing_requests "
          "| routers in the slice | TTFT p50 / p95 / p99 (ms) | ITL p50 / p95 / p99 (ms) | "
          "busiest decode replica, x its fair share |")
    print("|---|---|---|---|---|---|---|---|")
    unlimited = {pool: replace(getattr(plan.inputs, pool), max_ongoing=None)
                 for pool in ("prefill", "decode")}
    intervals = [float(value) for value in args.report_intervals.split(",")]
    for interval in intervals:
        for shared, limited, spread in ((True, True, False), (False, True, False),
                                        (False, False, False), (False, True, True),
                                        (False, False, True)):
            _row(replace(plan.inputs, report_interval_s=interval, spread=spread,
                         shared_router_view=shared, **({} if limited else unlimited)),
                 prefill, decode, limited)
    for value in filter(None, args.prefill_max_ongoing.split(",")):
        _row(replace(plan.inputs, report_interval_s=intervals[0], spread=True,
                     shared_router_view=False,
                     prefill=replace(plan.inputs.prefill, max_ongoing=int(value))),
             prefill, decode, True)


def _row(inputs, prefill: int, decode: int, limited: bool) -> None:
    """Simulate the planned cluster's slice under ``inputs`` and print its table row."""
    result, simulated, window = run_slice(inputs, prefill, decode)
    seen = read(result, inputs, prefill, decode, simulated, window)
    routers = max(1, round(inputs.routers_per_decode * simulated[1]))
    answered = Counter(o.decode_replica for _, o in arrived_in(result, window)
                       if o.decode_replica is not None)
    busiest = max(answered.values()) * simulated[1] / sum(answered.values())
    limits = (f"{inputs.prefill.max_ongoing} / {inputs.decode.max_ongoing}"
              if limited else "none")
    print(f"| {inputs.report_interval_s:g} s | "
          f"{'one, shared' if inputs.shared_router_view else 'each its own'} | "
          f"{'drawn (spread)' if inputs.spread else 'least loaded'} | {limits} | {routers} | "
          + " / ".join(f"{seen.ttft_s[q] * 1000:.0f}" for q in ("p50", "p95", "p99"))
          + " | " + " / ".join(f"{seen.itl_s[q] * 1000:.0f}" for q in ("p50", "p95", "p99"))
          + f" | {busiest:.2f} |", flush=True)


if __name__ == "__main__":
    main()
