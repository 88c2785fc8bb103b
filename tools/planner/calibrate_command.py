"""``pdserve plan calibrate``: time this machine's engines and write their fitted step
cost (shell: the engines run, a file is written, the fit is printed)."""

from __future__ import annotations

from pathlib import Path

from tools.planner.calibrate import DECODE_BATCHES, PROMPT_LENGTHS, calibrate


def run(args) -> int:
    """Calibrate ``--config``'s engines over the sweeps asked for, into ``--out``."""
    out = args.out or Path("bench-results/calibration.json")
    result = calibrate(args.config, out, _numbers(args.prompt_lengths, PROMPT_LENGTHS),
                       _numbers(args.decode_batches, DECODE_BATCHES))
    for role in ("prefill", "decode"):
        fitted = result[role]
        cost = ", ".join(f"{k} {v * 1e6:.3g} us" for k, v in fitted["cost"].items())
        print(f"{role}: {cost}; {fitted['samples']} steps, error median "
              f"{fitted['median_abs_error']:.1%}, p95 {fitted['p95_abs_error']:.1%}")
    print(f"wrote {out}")
    return 0


def _numbers(text: str | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """``"16,512"`` as integers, or ``default`` when not given."""
    return default if text is None else tuple(int(n) for n in text.split(","))
