"""Write tests/unit/data/load_day.csv: one day of a chat product's load, one row a minute.

The day (Wednesday 2025-06-11, Europe/Berlin) has a night trough, a daytime hump, an
evening peak from about 17:30 to 23:00, a morning hour and a half of long-prompt,
short-answer traffic (07:00-09:30: document summaries) and a sudden threefold spike at
11:00-11:20. Noise comes from a seeded generator, so the file is reproducible:

    .venv/bin/python tools/experiments/make_load_day.py
"""

from __future__ import annotations

import csv
import math
import random
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

OUT = Path(__file__).resolve().parent.parent / "tests" / "unit" / "data" / "load_day.csv"
ZONE = ZoneInfo("Europe/Berlin")
DAY = datetime(2025, 6, 11, tzinfo=ZONE)
SEED = 7

NIGHT_RPS = 15.0
DAY_RPS = 55.0          # extra at the daytime hump (12:30)
EVENING_RPS = 235.0     # extra at the evening plateau
MIX_SHIFT = (7.0, 9.5)  # hours of long prompts and short answers
SPIKE = (11.0, 11 + 20 / 60)
SPIKE_FACTOR = 3.0


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def requests_per_s(hour: float) -> float:
    """The smooth diurnal curve, without noise or spike."""
    daytime = DAY_RPS * math.exp(-((hour - 12.5) ** 2) / (2 * 3.0**2))
    evening = EVENING_RPS * _sigmoid((hour - 18.0) / 0.35) * _sigmoid((23.0 - hour) / 0.35)
    hump = 1 + 0.15 * math.exp(-((hour - 20.5) ** 2) / 2)  # the peak within the evening
    return NIGHT_RPS + daytime + evening * hump


def token_mix(hour: float) -> tuple[float, float]:
    """Mean prompt and output tokens per request at ``hour``."""
    if MIX_SHIFT[0] <= hour < MIX_SHIFT[1]:
        return 1600.0, 100.0
    return 500.0, 300.0


def rows(rng: random.Random) -> list[dict[str, str]]:
    table = []
    for minute in range(24 * 60):
        # Wall-clock minutes of one local day (no DST change on this date).
        at = DAY + timedelta(minutes=minute)
        hour = minute / 60
        rps = requests_per_s(hour) * (1 + rng.uniform(-0.05, 0.05))
        if SPIKE[0] <= hour < SPIKE[1]:
            rps *= SPIKE_FACTOR
        prompt, output = token_mix(hour)
        table.append({
            "time": at.isoformat(),
            "requests_per_s": f"{rps:.2f}",
            "prompt_tokens": f"{prompt * (1 + rng.uniform(-0.03, 0.03)):.0f}",
            "output_tokens": f"{output * (1 + rng.uniform(-0.03, 0.03)):.0f}",
        })
    return table


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    table = rows(random.Random(SEED))
    with OUT.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    print(f"wrote {len(table)} rows to {OUT}")


if __name__ == "__main__":
    main()
