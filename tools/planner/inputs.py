"""``pdserve plan``'s arguments as the planner's inputs (shell: reads ``--base-config``,
the model's ``config.json`` and ``--trace``)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cluster.config import parse_config
from router.admission import AdmissionPolicy
from tools.bench.trace import read_trace
from tools.bench.workload import WorkloadSpec
from tools.planner.cost_model import Roofline, Transfer
from tools.planner.des import EngineLimits, RouterTier
from tools.planner.hardware import CATALOG
from tools.planner.model import LLAMA_3_1_70B, ModelShape
from tools.planner.search import PlanInputs, Slo
from tools.planner.speculation import from_accepted_share, from_counts
from tools.planner.trace_workload import with_trace

MAX_MODEL_LEN = 10240   # the planned engines' context (prod-70b.yaml's engine.max_model_len)


def load_model_config(name: str) -> dict:
    """The Hugging Face config of ``--model``: llama-3.1-70b's, or a checkpoint's."""
    if name == "llama-3.1-70b":
        return LLAMA_3_1_70B
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise SystemExit(f"pdserve plan: no model {name!r} (llama-3.1-70b, or a "
                         "checkpoint folder or config.json)")
    return json.loads(path.read_text())


def inputs_from(args) -> PlanInputs:
    """The ``PlanInputs`` of ``pdserve plan``'s parsed ``args`` (the first of several
    thresholds and TPs), with ``--base-config``'s router tier and pool limits."""
    if args.accelerator not in CATALOG:
        raise SystemExit(f"pdserve plan: unknown accelerator {args.accelerator!r} "
                         f"({', '.join(CATALOG)})")
    accelerator = CATALOG[args.accelerator].priced(args.price)
    model = ModelShape.from_hf_config(load_model_config(args.model))
    dtype = "fp8" if args.fp8 else "bf16"

    def cost(tp: int) -> Roofline:
        return Roofline(model, accelerator, tp=tp, compute_dtype=dtype, kv_dtype=dtype,
                        mfu=args.mfu, mbu=args.mbu,
                        step_overhead_s=args.step_overhead_ms / 1000,
                        allreduce_latency_s=args.allreduce_latency_us / 1e6,
                        allreduce_efficiency=args.allreduce_efficiency)

    base = base_config(args)       # its router tier and pools' max_ongoing_requests
    routers, routers_per_decode = _router_tier(args, base)
    return PlanInputs(
        prefill_cost=cost(args.prefill_tp[0]), decode_cost=cost(args.decode_tp[0]),
        prefill=EngineLimits(args.prefill_batched_tokens, 256,
                             max_ongoing=base.prefill.max_ongoing_requests),
        decode=EngineLimits(args.decode_batched_tokens, args.decode_max_seqs,
                            max_ongoing=base.decode.max_ongoing_requests),
        transfer=Transfer(args.prefill_tp[0] * accelerator.link_bandwidth),
        workload=workload_from(args),
        slo=Slo(args.ttft_p95, args.itl_p95), threshold_tokens=args.threshold[0],
        sim_seconds=args.sim_seconds, slice_replicas=args.slice_replicas,
        prefix_hit=args.prefix_hit, response_cache_hit=args.response_cache_hit,
        answer_reuse=args.answer_reuse, routers=routers,
        routers_per_decode=routers_per_decode,
        shared_router_view=args.router_views == "shared", speculation=_speculation(args))


def workload_from(args) -> WorkloadSpec:
    """The traffic of ``args``: the drawn ``--workload``, or with ``--trace`` (size: one
    file) that trace's lengths and burstiness (tools/planner/trace_workload.py), at
    ``--rate`` either way."""
    spec = WorkloadSpec(name=args.workload, rate=args.rate, seed=args.seed,
                        max_model_len=MAX_MODEL_LEN,
                        shared_prefix_tokens=args.shared_prefix_tokens,
                        prefix_groups=args.prefix_groups, turns=args.turns,
                        think_s=args.think_s)
    if not args.trace:
        return spec
    if len(args.trace) > 1:
        raise ValueError(f"size plans for one --trace, not {len(args.trace)}")
    path = args.trace[0]
    if not path.is_file():
        raise ValueError(f"no trace {path}")
    with path.open() as lines:
        requests = read_trace(lines, args.trace_format)
    return with_trace(spec, requests, path.name)


def _speculation(args):
    """The decode pool's speculation of ``--spec-tokens`` and ``--spec-accepted`` (None
    without them)."""
    if args.spec_tokens < 0:
        raise ValueError(f"--spec-tokens wants 0 (off) or more, not {args.spec_tokens}")
    given = [name for name, value in (("--spec-accepted", args.spec_accepted),
                                      ("--spec-drafting", args.spec_drafting),
                                      ("--spec-counts", args.spec_counts)) if value is not None]
    if not args.spec_tokens:
        if given:
            raise ValueError(f"{' and '.join(given)} "
                             f"{'needs' if len(given) == 1 else 'need'} --spec-tokens")
        return None
    if args.spec_counts is not None:
        if len(given) > 1 or len(args.spec_counts) != 3:
            raise ValueError("--spec-counts wants DRAFTED,ACCEPTED,GENERATED, alone")
        return from_counts(args.spec_tokens, *args.spec_counts)
    if args.spec_accepted is None:
        raise ValueError("--spec-tokens needs --spec-accepted: the decode pool's accepted "
                         "over drafted tokens, measured (/admin/stats) or assumed")
    return from_accepted_share(args.spec_tokens, args.spec_accepted,
                               1.0 if args.spec_drafting is None else args.spec_drafting)


def base_config(args):
    """The parsed ``--base-config``."""
    return parse_config(yaml.safe_load(args.base_config.read_text()),
                        source=str(args.base_config))


def _router_tier(args, base):
    """The ``base`` config's router replicas (as many per decode replica as it has) and
    one replica's admission, each request asking for ``--max-tokens`` (default: the
    base's ``default_max_tokens``, a client that sets none). ``--no-admission``: (None,
    0)."""
    if not args.admission:
        return None, 0.0
    router = base.router
    tier = RouterTier(replicas=router.replicas,
                      admission=AdmissionPolicy.from_config(router.admission),
                      max_tokens=args.max_tokens or router.default_max_tokens,
                      long_prompt_tokens=router.admission.long_prompt_tokens)
    return tier, router.replicas / base.decode.replicas
