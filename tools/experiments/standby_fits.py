"""What fitted standby floors cost and buy: one plan, several fits, four days each.

Plans the reference scenario once (as ``pdserve plan --rate 5200`` does, with the same
sensors), then writes its config with standby floors fitted by ``fit_standby`` under
each combination of slot length, margin and shift given, and simulates each config's
day under pdserve's autoscaling policy: the forecast day, days 10% and 20% busier, and
one whose peak comes an hour early. Prints a markdown table (docs/planning.md).

    .venv/bin/python tools/experiments/standby_fits.py                 # 7-15 min on 2 cores
    .venv/bin/python tools/experiments/standby_fits.py --fits 30:0.1:60,30:0.1:0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cluster.config import parse_config  # noqa: E402
from tools.planner.output import config_document  # noqa: E402
from tools.planner.study import day_runner, plan_for_study  # noqa: E402

DEFAULT_FITS = ("30:0.1:0,30:0.1:30,30:0.1:60,15:0.1:0,60:0.1:0,30:0:0,30:0.2:0")
# name, rate over the forecast, the peak's shift in seconds
DAYS = (("forecast day", 1.0, 0), ("10% busier", 1.1, 0), ("20% busier", 1.2, 0),
        ("peak an hour early", 1.0, -3600))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="5200")
    parser.add_argument("--fits", default=DEFAULT_FITS,
                        help="slot minutes:margin:shift minutes, comma-separated")
    args = parser.parse_args()
    # one router view, as the tables in docs/planning.md were measured
    _, plan, scaling = plan_for_study(
        ["--rate", args.rate, "--router-views", "shared"])
    forecast = scaling.forecast
    run = day_runner(plan, scaling.sensors, forecast)
    print("| slots, margin, shift | windows per pool | "
          + " | ".join(name for name, _, _ in DAYS) + " |")
    print("|---" * (len(DAYS) + 2) + "|")
    for fit in args.fits.split(","):
        slot, margin, shift = fit.split(":")
        fitted = scaling.fitted_floors(plan, float(margin), int(shift), int(slot))
        config = parse_config(config_document(plan, scaling.base, scaling.targets, fitted))
        cells = []
        for _, rate_scale, shift_s in DAYS:
            day = run(config, peak_at_s=forecast.peak_at_s + shift_s, rate_scale=rate_scale)
            gpu_hours, ideal = sum(day.gpu_hours.values()), sum(day.ideal_gpu_hours.values())
            cells.append(f"{gpu_hours:,.0f} ({gpu_hours / ideal - 1:+.0%}), "
                         f"{day.hours_over_slo['ttft']:.2f} / {day.hours_over_slo['itl']:.2f} h")
        windows = "-".join(sorted({str(len(f.windows)) for f in fitted.values()}))
        print(f"| {slot} min, {float(margin):.0%}, {shift} min | {windows} | "
              + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
