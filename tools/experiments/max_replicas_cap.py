"""What the ceiling `pdserve plan` writes costs on days busier than the forecast.

Plans the reference scenario once (as ``pdserve plan --rate 5200`` does, with the same
sensors and the default fitted standby floors), then simulates days 0-50% busier than
the forecast under pdserve's autoscaling policy twice: with the ``max_replicas`` the plan
writes (1.25 x each pool's highest floor, tools/planner/output.py) and with the
ceiling lifted (100 x). Prints a markdown table (docs/planning.md): hours over the SLO
(TTFT / ITL), the most replicas serving, GPU-hours.

    .venv/bin/python tools/experiments/max_replicas_cap.py          # ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cluster.config import parse_config  # noqa: E402
from tools.planner.day import POOLS  # noqa: E402
from tools.planner.output import config_document  # noqa: E402
from tools.planner.study import day_runner, plan_for_study  # noqa: E402


def lifted(document: dict, factor: int = 100) -> dict:
    """``document`` with each pool's autoscaling ceiling ``factor`` times higher."""
    document = copy.deepcopy(document)
    for pool in POOLS:
        scaling = document["autoscaling"][pool]
        scaling["max_replicas"] *= factor
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="5200")
    parser.add_argument("--busier", default="1.0,1.2,1.3,1.4,1.5",
                        help="the days' rates over the forecast, comma-separated")
    args = parser.parse_args()
    # one router view, as the tables in docs/planning.md were measured
    plan_args, plan, scaling = plan_for_study(
        ["--rate", args.rate, "--router-views", "shared"])
    run = day_runner(plan, scaling.sensors, scaling.forecast)
    fitted = scaling.fitted_floors(plan, margin=plan_args.standby_margin,
                                   shift_minutes=plan_args.standby_shift_minutes)
    written = config_document(plan, scaling.base, scaling.targets, fitted)
    ceilings = {pool: written["autoscaling"][pool]["max_replicas"] for pool in POOLS}
    print(f"planned {plan.prediction.replicas}, highest floors "
          f"{ {pool: fitted[pool].highest for pool in POOLS} }, written ceilings {ceilings}")
    print("| day | ceiling | hours over SLO (TTFT / ITL) | most replicas (prefill, decode) "
          "| GPU-hours |")
    print("|---|---|---|---|---|")
    for rate_scale in (float(scale) for scale in args.busier.split(",")):
        for name, document in (("written", written), ("lifted", lifted(written))):
            day = run(parse_config(document), rate_scale=rate_scale)
            most = ", ".join(str(max(day.replicas[pool])) for pool in POOLS)
            print(f"| {rate_scale - 1:+.0%} | {name} | {day.hours_over_slo['ttft']:.2f} / "
                  f"{day.hours_over_slo['itl']:.2f} | {most} | "
                  f"{sum(day.gpu_hours.values()):,.0f} |", flush=True)


if __name__ == "__main__":
    main()
