"""``pdserve plan``'s arguments (shell: argparse; ``--answer-reuse`` may name a file).

The actions share one parser: its arguments are added a group at a time, each group
named for the action (or, for size, the part of the plan) its flags serve, in the order
``pdserve plan --help`` lists them. Imported on every ``pdserve`` invocation (through
tools/planner/cli.py): the standard library only at module level.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def add_parser(commands) -> None:
    """``pdserve plan`` and its arguments, on the subcommands ``commands``."""
    plan = commands.add_parser("plan", help="size a cluster for a peak rate "
                               "(see docs/planning.md)")
    _add_action(plan)
    _add_replay_arguments(plan)
    _add_calibrate_arguments(plan)
    _add_transfer_arguments(plan)
    _add_hardware_arguments(plan)
    _add_workload_arguments(plan)
    _add_pool_arguments(plan)
    _add_lever_arguments(plan)
    _add_speculation_arguments(plan)
    _add_lever_table_arguments(plan)
    _add_step_cost_arguments(plan)
    _add_router_arguments(plan)
    _add_day_arguments(plan)
    _add_simulation_arguments(plan)


def _add_action(plan) -> None:
    """The action: size (the default), calibrate or replay."""
    plan.add_argument("action", nargs="?", default="size",
                      choices=["size", "calibrate", "replay"],
                      help="size (default): plan a cluster; calibrate: time this "
                      "machine's engines of --config and fit their step cost (--out FILE); "
                      "replay: run recorded `pdserve bench run` traces (--trace; the "
                      "first --fit-runs fit the serving layer's cost) through the "
                      "simulator with --calibration, on --config's pools")


def _add_replay_arguments(plan) -> None:
    """replay's cluster (calibrate's too: ``--config``), calibration and traces."""
    plan.add_argument("--config", type=Path, default=REPO / "ray_configs/bench.yaml",
                      help="calibrate, replay: the served pdserve config")
    plan.add_argument("--calibration", type=Path, default=None,
                      help="replay: a `pdserve plan calibrate` file")
    plan.add_argument("--trace", type=Path, action="append", default=[],
                      help="replay: a `pdserve bench run` JSON file (repeatable); size: "
                      "one public request trace (Azure LLM 2023 CSV or Mooncake JSONL, "
                      "--trace-format) whose lengths and burstiness the plan is sized for "
                      "at --rate, instead of the drawn --workload")
    plan.add_argument("--fit-runs", type=_positive, default=1,
                      help="replay: how many of the first --trace runs fit the serving "
                      "layer's cost (runs at two or more loads fit its growth with load; "
                      "one load, constants)")
    plan.add_argument("--held-out-trace", type=Path, action="append", default=[],
                      help="replay: a `pdserve bench run` JSON file of a run on "
                      "--held-out-config's cluster (repeatable): predicted after the "
                      "--trace runs, with the serving layer fitted on those")
    plan.add_argument("--held-out-config", type=Path, default=None,
                      help="replay: the served pdserve config of the --held-out-trace "
                      "runs: another cluster than --config (another threshold or replica "
                      "count), with the same engines")


def _add_calibrate_arguments(plan) -> None:
    """calibrate's sweeps."""
    plan.add_argument("--prompt-lengths", default=None,
                      help="calibrate: prompt lengths swept (default 16,...,8192)")
    plan.add_argument("--decode-batches", default=None,
                      help="calibrate: decode batch sizes swept (default 1,...,64)")


def _add_transfer_arguments(plan) -> None:
    """replay's KV transfer between the pools."""
    plan.add_argument("--transfer-ms", type=float, default=0.0,
                      help="replay: a KV transfer's time between the pools, when "
                      "--transfer-from is not given")
    plan.add_argument("--transfer-from", type=Path, default=None,
                      help="replay: a `pdserve bench transfer` JSON file: each prompt's "
                      "transfer then takes its KV bytes at the latency and bandwidth "
                      "measured over --transfer-transport")
    plan.add_argument("--transfer-transport", default="shm",
                      help="replay: the transport of --transfer-from's rows (shm: pools on "
                      "one host, as the served configs run; cma: the same with "
                      "kv_transfer.shared_memory off; tcp: between hosts)")


def _add_hardware_arguments(plan) -> None:
    """size: the model, the accelerator and its price."""
    plan.add_argument("--model", default="llama-3.1-70b",
                      help="llama-3.1-70b, or a checkpoint folder or config.json path")
    plan.add_argument("--accelerator", default="h100", help="h100, h200 or a100")
    plan.add_argument("--price", type=float, default=None,
                      help="dollars per accelerator-hour (default: the catalogue's)")


def _add_workload_arguments(plan) -> None:
    """size: the traffic (replay: ``--answer-reuse`` too)."""
    plan.add_argument("--rate", type=float, default=5200.0, help="peak requests/s")
    plan.add_argument("--workload", default="reference", choices=["reference",
                                                                  "interference"])
    plan.add_argument("--trace-format", default="auto", choices=["auto", "azure", "mooncake"],
                      help="size: --trace's format (auto: told by its first line)")
    plan.add_argument("--shared-prefix-tokens", type=int, default=0,
                      help="every first prompt starts with one of --prefix-groups shared "
                      "heads (system prompts) this long, which the simulated engines' "
                      "prefix caches hold")
    plan.add_argument("--prefix-groups", type=int, default=1)
    plan.add_argument("--turns", type=int, default=1,
                      help="requests per conversation: each later turn carries the "
                      "history and arrives --think-s (mean) after the answer before it")
    plan.add_argument("--think-s", type=float, default=20.0)
    plan.add_argument("--answer-reuse", type=_answer_reuse, default=1.0,
                      help="size, replay: the share of an answer the next turn's prompt "
                      "repeats token for token (a history sent as text is tokenized again), "
                      "or the JSON file of tools/experiments/answer_reuse.py, whose measured "
                      "shares "
                      "each later turn draws one of")


def _add_pool_arguments(plan) -> None:
    """size: the SLOs, and the pools' shapes and engine limits searched."""
    plan.add_argument("--ttft-p95", type=float, default=0.5, help="SLO, seconds")
    plan.add_argument("--itl-p95", type=float, default=0.05, help="SLO, seconds")
    plan.add_argument("--prefill-tp", type=_numbers, default=(4,),
                      help="tensor parallelism of a prefill replica; several (2,4,8): "
                      "each searched, the cheapest plan kept")
    plan.add_argument("--decode-tp", type=_numbers, default=(4,),
                      help="the same for a decode replica")
    plan.add_argument("--prefill-batched-tokens", type=int, default=2048)
    plan.add_argument("--decode-batched-tokens", type=int, default=1024)
    plan.add_argument("--decode-max-seqs", type=int, default=384)
    plan.add_argument("--threshold", type=_numbers, default=(256,),
                      help="router.disaggregation_threshold_tokens; several (0,256,1024): "
                      "each searched (with each TP), the cheapest plan kept")


def _add_lever_arguments(plan) -> None:
    """size: the levers fp8, prefix caching and the response cache."""
    plan.add_argument("--fp8", action="store_true",
                      help="fp8 weights (W8A8) and KV cache on both pools")
    plan.add_argument("--prefix-hit", type=float, default=0.0,
                      help="share of prompt tokens in the engines' prefix caches")
    plan.add_argument("--response-cache-hit", type=float, default=0.0,
                      help="share of requests the router's response cache answers")


def _add_speculation_arguments(plan) -> None:
    """size: speculative decoding on the decode pool."""
    plan.add_argument("--spec-tokens", type=int, default=0,
                      help="speculative decoding on the decode pool: draft tokens verified "
                      "a step (decode.speculative.num_speculative_tokens; 0: off)")
    plan.add_argument("--spec-accepted", type=_share, default=None,
                      help="with --spec-tokens: accepted over drafted tokens, as the decode "
                      "pool measures it (/admin/stats spec_accepted_tokens / "
                      "spec_draft_tokens)")
    plan.add_argument("--spec-drafting", type=_drafting_share, default=None,
                      help="with --spec-tokens: the share of a sequence's decode steps that "
                      "draft (prompt lookup drafts only on a match): spec_draft_tokens / "
                      "(K x (generation_tokens - spec_accepted_tokens)) of /admin/stats; "
                      "default 1, every step")
    plan.add_argument("--spec-counts", type=_numbers, default=None,
                      help="with --spec-tokens, instead of --spec-accepted and "
                      "--spec-drafting: the decode pool's counters DRAFTED,ACCEPTED,"
                      "GENERATED (/admin/stats spec_draft_tokens, spec_accepted_tokens, "
                      "generation_tokens)")


def _add_lever_table_arguments(plan) -> None:
    """size: the table of what each lever alone saves."""
    plan.add_argument("--lever-table", action="store_true",
                      help="also plan with each lever alone (fp8, --table-prefix-hit, "
                      "--table-response-cache-hit, speculation at each of "
                      "--table-spec-accepted) and print what each saves")
    plan.add_argument("--table-prefix-hit", type=float, default=0.3)
    plan.add_argument("--table-response-cache-hit", type=float, default=0.15)
    plan.add_argument("--table-spec-tokens", type=_positive, default=4)
    plan.add_argument("--table-spec-accepted", type=_shares, default=(0.14, 0.5),
                      help="accepted over drafted tokens, each a row (0.14: prompt lookup "
                      "on the trained tiny model, docs/cost.md)")
    plan.add_argument("--table-spec-drafting", type=_drafting_share, default=1.0,
                      help="the share of steps that draft, in those rows")


def _add_step_cost_arguments(plan) -> None:
    """size: the roofline step cost model."""
    plan.add_argument("--mfu", type=float, default=0.5)
    plan.add_argument("--mbu", type=float, default=0.8)
    plan.add_argument("--step-overhead-ms", type=float, default=3.0)
    plan.add_argument("--allreduce-latency-us", type=float, default=8.0,
                      help="each tensor-parallel all-reduce's latency (two a layer a step)")
    plan.add_argument("--allreduce-efficiency", type=float, default=0.8,
                      help="of the peer links' bandwidth an all-reduce reaches (0: none, "
                      "as a roofline without all-reduces)")


def _add_router_arguments(plan) -> None:
    """size: the day's peak over its mean, and the router tier's admission and views."""
    plan.add_argument("--peak-to-mean", type=float, default=6.0,
                      help="the day's peak rate over its mean (GPU-hours a day)")
    plan.add_argument("--no-admission", dest="admission", action="store_false",
                      help="admit every request at once, not through the base config's "
                      "router replicas and their admission budgets")
    plan.add_argument("--router-views", choices=["shared", "each"], default="each",
                      help="each (default): every router replica routes on its own view "
                      "(the replicas' reports and only its own sends since), as pdserve's "
                      "routers do (docs/planning.md, 'Many routers'); shared: one view "
                      "for all, as if each saw the others' sends, the bound one "
                      "dispatcher would reach")
    plan.add_argument("--max-tokens", type=_positive, default=None,
                      help="the max_tokens each request asks for, which admission "
                      "reserves (default: the base config's router.default_max_tokens)")


def _add_day_arguments(plan) -> None:
    """size: the day under the written config's autoscalers, and its floors."""
    plan.add_argument("--no-day", dest="day", action="store_false",
                      help="skip the day under the written config's autoscalers")
    plan.add_argument("--peak-at", type=_time_of_day, default="20:00",
                      help="the day's peak, local time (HH:MM) in the time zone of the "
                      "base config's standby windows (UTC without)")
    plan.add_argument("--downscale-step", type=_positive, default=None,
                      help="the written config's max_downscale_step for both pools "
                      "(default: what the planned size needs to follow the day down)")
    plan.add_argument("--startup-s", type=float, default=300.0,
                      help="seconds from asking for a replica to its serving (the day)")
    plan.add_argument("--standby", choices=("fitted", "base"), default="fitted",
                      help="the written floors: fitted to the day's forecast, half-hour "
                      "windows a start-up ahead of the rate, night floor at the trough "
                      "(fitted); or the base config's windows holding the planned size "
                      "and its night floor in proportion (base)")
    plan.add_argument("--standby-margin", type=_margin, default=0.1,
                      help="fitted floors: the share above the forecast rate they hold")
    plan.add_argument("--scaling-headroom", type=_margin, default=0.1,
                      help="the written throughput targets ask for the load's replicas "
                      "times 1 + this (0: exactly the planned size at the peak)")
    plan.add_argument("--standby-shift-minutes", type=_shift_minutes, default=0,
                      help="fitted floors: how early or late the day's peak may come "
                      "(0 to 720; 0: the policy follows a peak that comes early or late)")


def _add_simulation_arguments(plan) -> None:
    """size: the simulated slice, the base config and (every action) ``--out``."""
    plan.add_argument("--slice-replicas", type=int, default=32,
                      help="replicas of the smaller pool simulated")
    plan.add_argument("--sim-seconds", type=_sim_seconds, default=40.0,
                      help="simulated seconds of traffic per configuration tried, past "
                      "a warm-up of 10 that is not read")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--base-config", type=Path, default=REPO / "ray_configs/prod-70b.yaml")
    plan.add_argument("--out", type=Path, default=None,
                      help="size: a folder for plan.json and pdserve.yaml (the planned "
                      "cluster); calibrate: the calibration file (default "
                      "bench-results/calibration.json); replay: a folder for replay.json")


def _positive(text: str) -> int:
    """An integer of 1 or more (argparse refuses anything else with this message)."""
    number = int(text)
    if number < 1:
        raise argparse.ArgumentTypeError(f"wants 1 or more, not {number}")
    return number


def _margin(text: str) -> float:
    """A share of 0 or more, finite (argparse refuses anything else with this message)."""
    share = float(text)
    if not 0 <= share < math.inf:
        raise argparse.ArgumentTypeError(f"wants a share of 0 or more, not {text}")
    return share


def _sim_seconds(text: str) -> float:
    """Seconds longer than the warm-up the simulation discards (argparse refuses others
    with this message: with none left, no request would be measured)."""
    from tools.planner.search import WARMUP_S

    seconds = float(text)
    if not WARMUP_S < seconds < math.inf:
        raise argparse.ArgumentTypeError(
            f"wants more than the {WARMUP_S:g} s warm-up that is not read, not {text}")
    return seconds


def _time_of_day(text: str):
    """``HH:MM`` as a ``datetime.time`` (argparse refuses anything else with this message)."""
    from cluster.autoscaling.config import parse_hh_mm

    try:
        return parse_hh_mm(text.strip().zfill(5))        # "8:00" is 08:00
    except ValueError:
        raise argparse.ArgumentTypeError(f"wants HH:MM (00:00..23:59), not {text!r}") from None


def _shift_minutes(text: str) -> int:
    """Minutes from 0 to 720 (half a day either way)."""
    minutes = int(text)
    if not 0 <= minutes <= 720:
        raise argparse.ArgumentTypeError(f"wants 0 to 720 minutes, not {minutes}")
    return minutes


def _share(text: str) -> float:
    """A share in [0, 1) (argparse refuses anything else with this message)."""
    share = float(text)
    if not 0 <= share < 1:
        raise argparse.ArgumentTypeError(f"wants a share in [0, 1), not {text}")
    return share


def _drafting_share(text: str) -> float:
    """A share in (0, 1] (argparse refuses anything else with this message)."""
    share = float(text)
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(f"wants a share in (0, 1], not {text}")
    return share


def _shares(text: str) -> tuple[float, ...]:
    """``"0.14,0.5"`` as shares in [0, 1)."""
    return tuple(_share(part) for part in text.split(","))


def _numbers(text: str) -> tuple[int, ...]:
    """``"0,256,1024"`` as integers."""
    return tuple(int(part) for part in text.split(","))


def _answer_reuse(text: str):
    """A share, or the measured shares of an answer_reuse.py file."""
    try:
        return float(text)
    except ValueError:
        return tuple(json.loads(Path(text).read_text())["shares"])
