"""What fitted standby floors cost and buy: one plan, several fits, four days each.

Plans the reference scenario once (as ``pdserve plan --rate 5200`` does, with the same
sensors), then writes its config with standby floors fitted by ``fit_standby`` under
each combination of slot length, margin and shift given, and simulates each config's
day under pdserve's autoscaling policy: the forecast day, days 10% and 20% busier, and
one whose peak comes an hour early. Prints a markdown table (docs/planning.md).

    .venv/bin/python scripts/standby_fits.py                 # ~7 min on 2 cores
    .venv/bin/python scripts/standby_fits.py --fits 30:0.1:60,30:0.1:0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cluster.config import parse_config  # noqa: E402
from cluster.planner import cli as plan_cli  # noqa: E402
from cluster.planner.day import (  # noqa: E402
    DaySpec,
    autoscaling_targets,
    fit_standby,
    sense,
)
from cluster.planner.output import config_document  # noqa: E402
from cluster.planner.search import search  # noqa: E402

DEFAULT_FITS = ("30:0.1:0,30:0.1:30,30:0.1:60,15:0.1:60,60:0.1:60,30:0:60,30:0.2:60")
# name, rate over the forecast, the peak's shift in seconds
DAYS = (("forecast day", 1.0, 0), ("10% busier", 1.1, 0), ("20% busier", 1.2, 0),
        ("peak an hour early", 1.0, -3600))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="5200")
    parser.add_argument("--fits", default=DEFAULT_FITS,
                        help="slot minutes:margin:shift minutes, comma-separated")
    args = parser.parse_args()
    commands = argparse.ArgumentParser().add_subparsers(dest="command")
    plan_cli.add_parser(commands)
    plan_args = commands.choices["plan"].parse_args(["--rate", args.rate])
    plan = search(plan_cli.inputs_from(plan_args))
    sensors = sense(plan)
    base = yaml.safe_load(plan_args.base_config.read_text())
    parsed = parse_config(base)
    targets = autoscaling_targets(plan, sensors, plan_args.scaling_headroom)
    plan_cli._add_downscale_steps(plan_args, plan, parsed, targets)
    planned = {"prefill": plan.prediction.prefill_replicas,
               "decode": plan.prediction.decode_replicas}
    forecast = DaySpec(
        peak_at_s=plan_cli._peak_epoch(plan_args.peak_at, parsed.autoscaling),
        peak_to_mean=plan_args.peak_to_mean, startup_s=plan_args.startup_s,
        drain_s=next(p for p in sensors.points if p.multiple >= 1.0).e2e_p99_s)
    run = plan_cli._day_runner(plan, sensors, forecast)
    print("| slots, margin, shift | windows per pool | "
          + " | ".join(name for name, _, _ in DAYS) + " |")
    print("|---" * (len(DAYS) + 2) + "|")
    for fit in args.fits.split(","):
        slot, margin, shift = fit.split(":")
        fitted = {pool: fit_standby(n, plan_cli._peak_minute(plan_args.peak_at), forecast,
                                    int(slot), float(margin), int(shift),
                                    plan_cli._peak_zone(parsed.autoscaling).key)
                  for pool, n in planned.items()}
        config = parse_config(config_document(plan, base, targets, fitted))
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
