"""``pdserve plan``: size a cluster for a peak rate (shell: arguments, files, printing).

    pdserve plan --rate 5200 --out plans/reference

Simulates a slice of the fleet with pdserve's own routing policies (cluster/planner/) and
prints the cheapest replica counts it finds that meet the SLOs, their cost and predicted
latencies, and writes them with a pdserve config of that cluster. docs/planning.md.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def add_parser(commands) -> None:
    plan = commands.add_parser("plan", help="size a cluster for a peak rate "
                               "(see docs/planning.md)")
    plan.add_argument("--model", default="llama-3.1-70b",
                      help="llama-3.1-70b, or a checkpoint folder or config.json path")
    plan.add_argument("--accelerator", default="h100", help="h100, h200 or a100")
    plan.add_argument("--price", type=float, default=None,
                      help="dollars per accelerator-hour (default: the catalogue's)")
    plan.add_argument("--rate", type=float, default=5200.0, help="peak requests/s")
    plan.add_argument("--workload", default="reference", choices=["reference",
                                                                  "interference"])
    plan.add_argument("--ttft-p95", type=float, default=0.5, help="SLO, seconds")
    plan.add_argument("--itl-p95", type=float, default=0.05, help="SLO, seconds")
    plan.add_argument("--prefill-tp", type=int, default=4)
    plan.add_argument("--decode-tp", type=int, default=4)
    plan.add_argument("--prefill-batched-tokens", type=int, default=2048)
    plan.add_argument("--decode-batched-tokens", type=int, default=1024)
    plan.add_argument("--decode-max-seqs", type=int, default=384)
    plan.add_argument("--threshold", type=int, default=256,
                      help="router.disaggregation_threshold_tokens")
    plan.add_argument("--fp8", action="store_true",
                      help="fp8 weights (W8A8) and KV cache on both pools")
    plan.add_argument("--mfu", type=float, default=0.5)
    plan.add_argument("--mbu", type=float, default=0.8)
    plan.add_argument("--step-overhead-ms", type=float, default=3.0)
    plan.add_argument("--peak-to-mean", type=float, default=6.0,
                      help="the day's peak rate over its mean (GPU-hours a day)")
    plan.add_argument("--slice-replicas", type=int, default=32,
                      help="replicas of the smaller pool simulated")
    plan.add_argument("--sim-seconds", type=float, default=40.0)
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--base-config", type=Path, default=REPO / "ray_configs/prod-70b.yaml")
    plan.add_argument("--out", type=Path, default=None,
                      help="folder for plan.json and pdserve.yaml (the planned cluster)")


def load_model_config(name: str) -> dict:
    from cluster.planner.model import LLAMA_3_1_70B

    if name == "llama-3.1-70b":
        return LLAMA_3_1_70B
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise SystemExit(f"pdserve plan: no model {name!r} (llama-3.1-70b, or a "
                         "checkpoint folder or config.json)")
    return json.loads(path.read_text())


def inputs_from(args):
    from cluster.bench.workload import WorkloadSpec
    from cluster.planner.cost_model import Roofline, Transfer
    from cluster.planner.des import EngineLimits
    from cluster.planner.hardware import CATALOG
    from cluster.planner.model import ModelShape
    from cluster.planner.search import PlanInputs, Slo

    if args.accelerator not in CATALOG:
        raise SystemExit(f"pdserve plan: unknown accelerator {args.accelerator!r} "
                         f"({', '.join(CATALOG)})")
    accelerator = CATALOG[args.accelerator].priced(args.price)
    model = ModelShape.from_hf_config(load_model_config(args.model))
    dtype = "fp8" if args.fp8 else "bf16"

    def cost(tp: int) -> Roofline:
        return Roofline(model, accelerator, tp=tp, compute_dtype=dtype, kv_dtype=dtype,
                        mfu=args.mfu, mbu=args.mbu,
                        step_overhead_s=args.step_overhead_ms / 1000)

    return PlanInputs(
        prefill_cost=cost(args.prefill_tp), decode_cost=cost(args.decode_tp),
        prefill=EngineLimits(args.prefill_batched_tokens, 256),
        decode=EngineLimits(args.decode_batched_tokens, args.decode_max_seqs),
        transfer=Transfer(args.prefill_tp * accelerator.link_bandwidth),
        workload=WorkloadSpec(name=args.workload, rate=args.rate, seed=args.seed,
                              max_model_len=10240),
        slo=Slo(args.ttft_p95, args.itl_p95), threshold_tokens=args.threshold,
        sim_seconds=args.sim_seconds, slice_replicas=args.slice_replicas)


def main(args) -> int:
    import yaml

    from cluster.config import parse_config
    from cluster.planner.output import config_document, figures, table
    from cluster.planner.search import search

    started = time.monotonic()
    try:
        inputs = inputs_from(args)
        plan = search(inputs)
    except (ValueError, RuntimeError) as error:
        print(f"pdserve plan: {error}", file=sys.stderr)
        return 2
    answer = figures(plan, args.peak_to_mean)
    answer["search_s"] = time.monotonic() - started
    print(table(answer))
    print(f"\n{answer['candidates_simulated']} clusters simulated in "
          f"{answer['search_s']:.0f} s")
    if args.out is not None:
        document = config_document(plan, yaml.safe_load(args.base_config.read_text()))
        parse_config(document, source="the planned cluster")   # loadable, or it fails here
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.json").write_text(json.dumps(answer, indent=2))
        (args.out / "pdserve.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
        print(f"wrote {args.out / 'plan.json'} and {args.out / 'pdserve.yaml'}")
    return 0
