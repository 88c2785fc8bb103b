"""The `ray up` cluster files and the production config, checked without Ray or a cloud.

Cluster files are validated the way Ray itself reads them: the cloud files as `ray up`
does before it contacts the cloud (the provider's defaults filled in, then Ray's JSON
schema and checks), the fake multi-node file as the autoscaler process started by
`ray start --autoscaling-config` reads it. Whether the production pools fit their node
types is decided by the autoscaler's own bin-packing, fed with the placement groups that
pdserve really requests for a replica (``cluster.engine.args.pool_deployment_options``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray.autoscaler
import yaml
from ray.autoscaler._private import resource_demand_scheduler as rds
from ray.autoscaler._private.autoscaler import StandardAutoscaler
from ray.autoscaler._private.fake_multi_node.node_provider import (
    FAKE_HEAD_NODE_TYPE,
    FakeMultiNodeProvider,
)
from ray.autoscaler._private.load_metrics import LoadMetrics
from ray.autoscaler._private.node_provider_availability_tracker import (
    NodeAvailabilitySummary,
)
from ray.autoscaler._private.prom_metrics import AutoscalerPrometheusMetrics
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.core.generated.common_pb2 import Bundle, PlacementStrategy
from ray.core.generated.gcs_pb2 import PlacementGroupTableData

from cluster.config import PDServeConfig, PoolConfig, load_config, parse_config
from cluster.engine.args import pool_deployment_options
from cluster.serve_env import node_env

REPO = Path(__file__).resolve().parents[2]
RAY_CONFIGS = REPO / "ray_configs"
CLUSTER_FILES = sorted(RAY_CONFIGS.glob("cluster-*.yaml"))
FAKE_FILE = RAY_CONFIGS / "cluster-local-fake.yaml"
CLOUD_FILES = [path for path in CLUSTER_FILES if path != FAKE_FILE]
PROD_CONFIG = RAY_CONFIGS / "prod-70b.yaml"
FAKE_PDSERVE_CONFIG = REPO / "tests" / "integration" / "pdserve-multinode.yaml"
# pdserve configs: everything in ray_configs/ but the cluster files (grafana/ is a folder).
SERVE_CONFIGS = [
    *sorted(path for path in RAY_CONFIGS.glob("*.yaml") if not path.name.startswith("cluster-")),
    REPO / "tests" / "integration" / "pdserve-test.yaml",
]
ROLES = ("prefill", "decode")  # each pool runs on the node type of the same name
BUILT_IN_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}
RAY_SCHEMA = json.loads(
    (Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text()
)


def _ids(paths: list[Path]) -> list[str]:
    return [path.name for path in paths]


def _read(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _validated(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` validated as Ray does when it starts a cluster; the config Ray would use.

    Cloud files: what `ray up` runs before it talks to the cloud (prepare_config, then
    validate_config). The fake file is handed to the autoscaler as written (`ray up`
    cannot fill its defaults: the Ray wheel lacks fake_multi_node/example.yaml).
    """
    config = copy.deepcopy(raw)
    if config["provider"]["type"] != "fake_multinode":
        config = prepare_config(config)
    validate_config(config)
    return config


def _custom(resources: dict[str, Any]) -> dict[str, Any]:
    return {name: n for name, n in resources.items() if name not in BUILT_IN_RESOURCES}


def _replica_demands(pool: PoolConfig) -> list[dict[str, float]]:
    """What one replica of ``pool`` asks the autoscaler for, as the autoscaler sees it."""
    options = pool_deployment_options(pool)
    bundles = options.get("placement_group_bundles")
    if bundles is None:
        actor = options["ray_actor_options"]
        demand = {"CPU": actor["num_cpus"], "GPU": actor["num_gpus"], **actor["resources"]}
        return [{name: float(n) for name, n in demand.items() if n}]
    group = PlacementGroupTableData(
        strategy=getattr(PlacementStrategy, options["placement_group_strategy"]),
        bundles=[Bundle(unit_resources=bundle) for bundle in bundles],
    )
    demands, strict_spread = rds.placement_groups_to_resource_demands([group])
    assert not strict_spread
    return [dict(demand) for demand in demands]


def _nodes_to_add(
    cluster: dict[str, Any], demands: list[dict[str, float]]
) -> tuple[dict[str, int], list[dict[str, float]]]:
    """The worker nodes the autoscaler adds to a cluster holding only its head."""
    scorer = partial(
        rds._default_utilization_scorer,
        node_availability_summary=NodeAvailabilitySummary(node_availabilities={}),
    )
    head = cluster["head_node_type"]
    nodes, residual = rds.get_nodes_for(
        cluster["available_node_types"], {head: 1}, head, cluster["max_workers"],
        demands, scorer,
    )
    return dict(nodes), residual


@pytest.fixture(scope="module")
def prod() -> PDServeConfig:
    return load_config(PROD_CONFIG)


def _fake_cluster_config() -> PDServeConfig:
    """The pdserve config the multi-node test serves on the fake cluster."""
    return load_config(FAKE_PDSERVE_CONFIG)


def test_the_cluster_files_exist() -> None:
    assert {"cluster-aws.yaml", "cluster-gcp.yaml", "cluster-local-fake.yaml"} <= set(
        _ids(CLUSTER_FILES)
    )


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=_ids(CLUSTER_FILES))
def test_cluster_file_passes_rays_validation(path: Path) -> None:
    raw = _read(path)
    jsonschema.validate(raw, RAY_SCHEMA)  # the file as written, not only with defaults
    _validated(raw)


BREAKAGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "misspelt top-level key": lambda c: c.update(max_worker=c.pop("max_workers")),
    "fractional resource count": lambda c: c["available_node_types"]["prefill"][
        "resources"
    ].update(GPU=0.5),
    "node type without node_config": lambda c: c["available_node_types"]["decode"].pop(
        "node_config"
    ),
    "undeclared head node type": lambda c: c.update(head_node_type="nowhere"),
    "min_workers beyond max_workers": lambda c: c.update(max_workers=0),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
@pytest.mark.parametrize("path", CLUSTER_FILES, ids=_ids(CLUSTER_FILES))
def test_the_validator_rejects_a_broken_copy(path: Path, breakage: str) -> None:
    raw = copy.deepcopy(_read(path))
    BREAKAGES[breakage](raw)
    with pytest.raises((jsonschema.ValidationError, ValueError)):
        _validated(raw)


@pytest.mark.parametrize("path", CLOUD_FILES, ids=_ids(CLOUD_FILES))
def test_cloud_file_has_a_cpu_head_and_a_gpu_node_type_per_pool(path: Path) -> None:
    cluster = _validated(_read(path))
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    assert set(types) == {cluster["head_node_type"], *ROLES}
    assert head["resources"].get("GPU", 0) == 0
    assert not _custom(head["resources"])
    for role in ROLES:
        node_type = types[role]
        assert node_type["resources"]["GPU"] >= 4
        assert _custom(node_type["resources"]) == {f"{role}_node": 1}
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"]
    assert cluster["idle_timeout_minutes"] > 0


@pytest.mark.parametrize("path", CLOUD_FILES, ids=_ids(CLOUD_FILES))
def test_cloud_file_installs_pdserve_and_exports_metrics(
    path: Path, prod: PDServeConfig
) -> None:
    raw = _read(path)
    assert raw["file_mounts"] == {"~/pdserve": "."}
    assert any("pdserve[gpu]" in command for command in raw["setup_commands"])
    head_start = " ".join(raw["head_start_ray_commands"])
    worker_start = " ".join(raw["worker_start_ray_commands"])
    assert "--num-gpus=0" in head_start
    for start in (head_start, worker_start):
        assert "--metrics-export-port=" in start
        # Serve's processes on every node start with what prod-70b.yaml's Serve settings
        # need: the proxy's middleware that makes its answers OpenAI errors
        # (router/proxy_edge.py) and the gRPC data plane of its router.transport
        for name, value in node_env(prod.router.transport, prod.router.ingress,
                                    prod.router.haproxy).items():
            assert f"export {name}={value};" in start, name


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("path", CLOUD_FILES, ids=_ids(CLOUD_FILES))
def test_a_prod_replica_lands_on_its_own_node_type(
    path: Path, role: str, prod: PDServeConfig
) -> None:
    cluster = _validated(_read(path))
    pool = getattr(prod, role)
    offered = cluster["available_node_types"][role]["resources"]
    assert set(pool.resources) <= set(offered)
    assert offered["GPU"] >= pool.tensor_parallel_size
    nodes, residual = _nodes_to_add(cluster, _replica_demands(pool))
    assert residual == []
    assert nodes == {role: 1}


@pytest.mark.parametrize("path", CLOUD_FILES, ids=_ids(CLOUD_FILES))
def test_the_cluster_can_hold_every_prod_replica(path: Path, prod: PDServeConfig) -> None:
    cluster = _validated(_read(path))
    demands = [
        demand
        for role in ROLES
        for _ in range(getattr(prod, role).replicas)
        for demand in _replica_demands(getattr(prod, role))
    ]
    nodes, residual = _nodes_to_add(cluster, demands)
    assert residual == [], "max_workers too small for prod-70b.yaml's replicas"
    assert set(nodes) == set(ROLES)


POOL_BREAKAGES: dict[str, dict[str, Any]] = {
    "a resource no node type offers": {"resources": {"prefil_node": 0.01}},
    "more GPUs than a node has": {"tensor_parallel_size": 16},
}


@pytest.mark.parametrize("breakage", POOL_BREAKAGES)
@pytest.mark.parametrize("path", CLOUD_FILES, ids=_ids(CLOUD_FILES))
def test_a_pool_no_node_type_fits_is_not_placed(
    path: Path, breakage: str, prod: PDServeConfig
) -> None:
    cluster = _validated(_read(path))
    pool = prod.prefill.model_copy(update=POOL_BREAKAGES[breakage])
    nodes, residual = _nodes_to_add(cluster, _replica_demands(pool))
    assert nodes == {}
    assert residual


def test_prod_config_is_a_gpu_config_that_joins_the_cluster(prod: PDServeConfig) -> None:
    assert prod.model.generate is None
    assert prod.model.path.is_absolute()
    assert prod.engine.dtype == "bfloat16"
    assert prod.engine.max_model_len >= 8192
    for role in ROLES:
        pool = getattr(prod, role)
        assert pool.tensor_parallel_size == 4
        assert pool.num_gpus > 0
        assert set(pool.resources) == {f"{role}_node"}
    assert prod.kv_transfer.buffer_device == "cuda"
    assert prod.kv_transfer.side_channel_host is None
    assert prod.kv_transfer.progress_thread
    assert prod.ray.address == "auto"
    assert (prod.router.host, prod.router.port) == ("0.0.0.0", 8000)


def test_fake_file_imitates_the_cloud_node_types() -> None:
    fake = _validated(_read(FAKE_FILE))
    assert fake["provider"]["type"] == "fake_multinode"
    assert fake["provider"]["use_node_id_as_ip"]  # all fake nodes share one IP
    # The fake provider registers the head under this name; another would not match.
    assert fake["head_node_type"] == FAKE_HEAD_NODE_TYPE
    types = fake["available_node_types"]
    assert set(types) == {FAKE_HEAD_NODE_TYPE, *ROLES}
    for path in CLOUD_FILES:
        cloud = _read(path)["available_node_types"]
        for role in ROLES:
            assert _custom(types[role]["resources"]).keys() == _custom(
                cloud[role]["resources"]
            ).keys()
    for role in ROLES:
        assert types[role]["resources"].get("GPU", 0) == 0  # a CPU-only machine
    assert types["prefill"]["min_workers"] in (0, 1)
    assert types["prefill"]["max_workers"] == 2


def test_the_autoscaler_reads_the_fake_file_and_scales_the_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the autoscaler process of `RAY_FAKE_CLUSTER=1 ray start --head
    # --autoscaling-config=...` builds from the file (no Ray is started here).
    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")
    autoscaler = StandardAutoscaler(
        str(FAKE_FILE), LoadMetrics(), gcs_client=None, session_name="test",
        prom_metrics=AutoscalerPrometheusMetrics(session_name="test"),
    )
    assert isinstance(autoscaler.provider, FakeMultiNodeProvider)
    (head,) = autoscaler.provider.non_terminated_nodes({})
    head_resources = autoscaler.available_node_types[FAKE_HEAD_NODE_TYPE]["resources"]

    # The pools of the config docs/cluster.md serves on this cluster.
    served = _fake_cluster_config()
    assert served.ray.address == "auto"
    replica = {role: _replica_demands(getattr(served, role)) for role in ROLES}

    def launches(demands: list[dict[str, float]]) -> tuple[dict[str, int], list[Any]]:
        nodes, residual = autoscaler.resource_demand_scheduler.get_nodes_to_launch(
            [head], {}, demands, {head: dict(head_resources)}, [],
            {head: dict(head_resources)}, [], NodeAvailabilitySummary(node_availabilities={}),
        )
        return dict(nodes), residual

    assert launches([]) == ({"prefill": 1, "decode": 1}, [])  # min_workers
    assert launches(replica["prefill"] + replica["decode"]) == ({"prefill": 1, "decode": 1}, [])
    two_prefill = 2 * replica["prefill"] + replica["decode"]
    assert launches(two_prefill) == ({"prefill": 2, "decode": 1}, [])
    nodes, residual = launches(3 * replica["prefill"])
    assert nodes["prefill"] == 2  # max_workers
    assert residual


def test_the_serve_configs_are_all_here() -> None:
    assert {"local.yaml", "bench.yaml", "prod-70b.yaml", "pdserve-test.yaml"} <= set(
        _ids(SERVE_CONFIGS)
    )


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=_ids(SERVE_CONFIGS))
def test_serve_config_loads(path: Path) -> None:
    assert isinstance(load_config(path), PDServeConfig)


def test_a_whole_request_deadline_bounds_the_proxy_too() -> None:
    from cluster.serve_config import PROXY_TIMEOUT_MARGIN_S, http_options

    config = parse_config({"model": {"name": "m", "path": "/m"},
                           "router": {"deadlines": {"request_s": 120}}})
    assert http_options(config)["request_timeout_s"] == 120 + PROXY_TIMEOUT_MARGIN_S
    unbounded = parse_config({"model": {"name": "m", "path": "/m"}})
    assert "request_timeout_s" not in http_options(unbounded)
