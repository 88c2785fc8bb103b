"""``pdserve plan`` (size): the cheapest cluster for a peak rate, printed and written
(shell: the clock, files, printing).

It searches the configurations asked for (each threshold and TP), optionally each lever
alone, writes the planned cluster's config with autoscaling fitted to the plan, and runs
its day under that config's autoscalers (tools/planner/day.py).
"""

from __future__ import annotations

import json
import sys
import time

import yaml

from cluster.config import parse_config
from tools.planner.day import POOLS
from tools.planner.inputs import inputs_from
from tools.planner.output import (
    config_document,
    configuration_table,
    day_figures,
    day_table,
    figures,
    lever_table,
    table,
)
from tools.planner.search import cheapest, configurations, lever_variants, search
from tools.planner.speculation import from_accepted_share
from tools.planner.study import day_runner, scaling_inputs, without_windows


def run(args) -> int:
    """Plan, print and (with ``--out``) write the cluster of ``args``; 2 when no plan."""
    started = time.monotonic()
    try:
        plan, searched, levers, document, days = _planned(args)
    except (ValueError, RuntimeError) as error:
        print(f"pdserve plan: {error}", file=sys.stderr)
        return 2
    answer = _answer(args, plan, searched, levers, days, started)
    print(table(answer))
    if days:
        print("\n" + day_table(answer["day"]))
    if levers:
        print("\n" + lever_table(levers))
    print(f"\n{answer['candidates_simulated']} clusters simulated for the plan; "
          f"{answer['search_s']:.0f} s in all")
    if args.out is not None:
        _write(args.out, answer, document, plan, days, args.peak_to_mean)
    return 0


def _planned(args):
    """(The plan, every configuration's when several, each lever's with
    ``--lever-table``, the planned cluster's config document, its days)."""
    plan, searched = _search_configurations(args, inputs_from(args))
    levers = _levers(args, plan) if args.lever_table else {}
    document, days = _document_and_day(args, plan)
    return plan, searched, levers, document, days


def _levers(args, plan) -> dict:
    """Each lever alone's plan (or why there is none), by name: ``plan`` itself for the
    variant that is its inputs."""
    inputs = plan.inputs
    variants = lever_variants(inputs, args.table_prefix_hit, args.table_response_cache_hit,
                              [from_accepted_share(args.table_spec_tokens, share,
                                                   args.table_spec_drafting)
                               for share in args.table_spec_accepted])
    return {name: plan if variant == inputs else _plan_or_reason(variant)
            for name, variant in variants.items()}


def _answer(args, plan, searched: dict, levers: dict, days, started: float) -> dict:
    """plan.json: the plan's figures, its days', the seconds since ``started``, and
    every configuration's and lever's figures (or why it has none)."""
    answer = figures(plan, args.peak_to_mean)
    if days:
        answer["day"] = {name: day_figures(day) for name, day in days.items()}
    answer["search_s"] = time.monotonic() - started
    if searched:
        answer["configurations"] = {name: _figures_or_none(option, args.peak_to_mean)
                                    for name, option in searched.items()}
    if levers:
        answer["levers"] = {name: _figures_or_none(lever, args.peak_to_mean)
                            for name, lever in levers.items()}
    return answer


def _figures_or_none(plan, peak_to_mean: float) -> dict:
    """A plan's figures, or ``{"none": why}`` for a reason it has none."""
    return figures(plan, peak_to_mean) if not isinstance(plan, str) else {"none": plan}


def _write(out, answer: dict, document: dict, plan, days, peak_to_mean: float) -> None:
    """plan.json, pdserve.yaml, plan.png and (with days) day.png in the folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(answer, indent=2))
    (out / "pdserve.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    from tools.planner.plots import day_plot, plan_plot  # matplotlib: only to write

    plan_plot(out / "plan.png", plan, peak_to_mean)
    written = [out / name for name in ("plan.json", "pdserve.yaml", "plan.png")]
    if days:
        day_plot(out / "day.png", days)
        written.append(out / "day.png")
    print("wrote " + ", ".join(map(str, written)))


def _search_configurations(args, inputs):
    """The plan of ``inputs``, or, when several thresholds or TPs are given, the cheapest
    of each combination's plans and every combination's (else an empty dict)."""
    if len(args.threshold) * len(args.prefill_tp) * len(args.decode_tp) == 1:
        return search(inputs), {}
    searched = {name: option if isinstance(option, str) else _plan_or_reason(option)
                for name, option in configurations(inputs, args.threshold, args.prefill_tp,
                                                   args.decode_tp).items()}
    chosen = cheapest(searched)
    print(configuration_table(searched, chosen, args.peak_to_mean) + "\n")
    return searched[chosen], searched


def _plan_or_reason(inputs):
    """The plan of ``inputs`` (a configuration or a lever), or why there is none: no
    cluster met the SLOs within the search's steps (verifying drafts, say, can slow every
    decode step past the ITL SLO)."""
    try:
        return search(inputs)
    except RuntimeError as error:
        return str(error).split(";")[0]


def _document_and_day(args, plan):
    """The planned cluster's config (loadable, or this fails; its autoscaling targets,
    step limits and floors fitted to the plan) and, unless ``--no-day``, its days under
    that config's autoscalers (None when it has none).

    With fitted floors (``--standby fitted``): the forecast day as written, the same plan
    under the base's floors instead, the policy alone (no windows, floors of one), then
    the written config on a day 10% busier than forecast and on one peaking an hour
    early (what the policy must cover above the floors).
    With the base's (``--standby base``): as written, without its standby windows, and
    without its night floors either."""
    scaling = scaling_inputs(args, plan)
    if scaling.forecast is None:
        return config_document(plan, scaling.base, scaling.targets), None
    fitted = None
    if args.standby == "fitted":
        fitted = scaling.fitted_floors(plan, margin=args.standby_margin,
                                       shift_minutes=args.standby_shift_minutes)
    document = config_document(plan, scaling.base, scaling.targets, fitted)
    config = parse_config(document, source="the planned cluster")
    if not args.day or not config.autoscaling.enabled:
        return document, None
    based = (parse_config(config_document(plan, scaling.base, scaling.targets),
                          source="the base's floors") if fitted else None)
    return document, _days(day_runner(plan, scaling.sensors, scaling.forecast),
                           scaling.forecast, config, based)


def _days(day_under, forecast, config, based=None) -> dict:
    """The days ``_document_and_day`` runs, by name: with fitted floors (``based``, the
    same plan under the base's floors, given), the forecast day, a busier one, one
    peaking early, the base's floors and the policy alone; with the base's, as written,
    without its windows, and without its night floors either."""
    if based is not None:
        return {"as written": day_under(config),
                "the base's floors": day_under(based),
                "the policy alone": day_under(config, without_floors=True),
                "a day 10% busier": day_under(config, rate_scale=1.1),
                "its peak an hour early": day_under(
                    config, peak_at_s=forecast.peak_at_s - 3600)}
    days = {"as written": day_under(config)}
    if config.autoscaling.prefill.standby or config.autoscaling.decode.standby:
        days["without its standby windows"] = day_under(
            config.model_copy(update={"autoscaling": without_windows(config.autoscaling)}))
    if any(config.scaling_bounds(next(iter(config.versions)), pool).min_replicas > 1
           for pool in POOLS):
        days["nor its night floors"] = day_under(config, without_floors=True)
    return days
