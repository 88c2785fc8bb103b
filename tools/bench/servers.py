"""The servers a benchmark starts (shell): their config files, ``bench compare``'s
setups, their warm-up, and the machine they ran on.

A setup is a callable that starts one server (tools/processes.py), for
``processes.running`` to wait for and stop: so setups run one after the other on the
same cores.
"""

from __future__ import annotations

from pathlib import Path

from cluster.config import PDServeConfig
from tools.bench.defaults import COMPARE_REFERENCE_PORT, REPO, SERVE_LLM_PORT

COMPARE_SETUPS = ("pdserve", "colocated", "serve-llm", "serve-llm-per-token")


def write_config(document: dict, path: Path) -> Path:
    """A config document as the YAML file a benchmark's pdserve is started with."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def warm_up(base_url: str, model: str) -> None:
    """Two short completions, so a run's first requests do not pay for the first ones."""
    import httpx

    for i in range(2):
        httpx.post(f"{base_url}/v1/completions", timeout=120, json={
            "model": model, "prompt": f"warm up {i} " * 20, "max_tokens": 4})


def machine() -> dict:
    """This host's cores, architecture and Python: kept beside the results."""
    import os
    import platform

    return {"cpus": os.cpu_count(), "machine": platform.machine(),
            "processor": platform.processor(), "python": platform.python_version()}


def compare_variants(config_path: Path, variants: list[str],
                     out: Path) -> dict[str, tuple[Path, PDServeConfig]]:
    """Each ``--variant`` of ``bench compare``: its config file (written under ``out``)
    and parsed config, by name."""
    import yaml

    from cluster.config import parse_config
    from tools.bench.variants import apply_overrides, parse_variant

    base = yaml.safe_load(config_path.read_text())
    result = {}
    for variant in map(parse_variant, variants):
        if variant.name in COMPARE_SETUPS:
            raise SystemExit(f"bench compare: variant {variant.name!r} has a setup's name")
        document = apply_overrides(base, variant.overrides)
        result[variant.name] = (
            write_config(document, out / f"variant-{variant.name}.yaml"),
            parse_config(document, source=f"variant {variant.name}"))
    return result


def compare_setup(name: str, config_path: Path, config: PDServeConfig, log_dir: Path,
                  variants: dict[str, tuple[Path, PDServeConfig]]):
    """What starts setup ``name`` of ``bench compare`` (a server ``processes.running``
    waits for): one of ``COMPARE_SETUPS`` or a pdserve variant."""
    from tools import processes

    if name == "pdserve":
        return lambda: processes.start_pdserve(config_path, config, log_dir, REPO)
    if name in variants:
        path, variant_config = variants[name]
        return lambda: processes.start_pdserve(path, variant_config, log_dir, REPO,
                                               name=f"pdserve-{name}")
    if name == "colocated":
        return lambda: processes.start_vllm_server(
            config, COMPARE_REFERENCE_PORT, log_dir, REPO, name="colocated-vllm",
            role="decode", cpu_bind=all_cores_bind(config))
    if name in ("serve-llm", "serve-llm-per-token"):
        return _serve_llm_setup(name, config_path, log_dir)
    raise SystemExit(f"bench compare: unknown setup {name!r} ({', '.join(COMPARE_SETUPS)}, "
                     f"or a --variant's name)")


def _serve_llm_setup(name: str, config_path: Path, log_dir: Path):
    """Ray Serve LLM's PD application with pdserve's engine settings; ``-per-token``
    streams each token without its 50 ms batching."""
    from tools import processes
    from tools.bench import serve_llm

    batching = 0 if name == "serve-llm-per-token" else None

    def start():
        server = processes.start(name, serve_llm.start_args(
            config_path, SERVE_LLM_PORT, batching), f"http://127.0.0.1:{SERVE_LLM_PORT}",
            log_dir, REPO)
        server.ready_line, server.health_path = serve_llm.SERVING_LINE, "/v1/models"
        return server
    return start


def all_cores_bind(config: PDServeConfig) -> str | None:
    """The colocated engine gets every core the two pools use together."""
    cores = []
    for pool in (config.prefill, config.decode):
        bind = pool.env.get("VLLM_CPU_OMP_THREADS_BIND")
        if bind:
            cores.append(bind)
    return ",".join(cores) or None
