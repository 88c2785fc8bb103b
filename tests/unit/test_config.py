"""Config loading: the shipped files load, and every mistake names its field."""

from pathlib import Path

import pytest

from cluster.config import ConfigError, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]
MINIMAL = {"model": {"name": "m", "path": "/models/m"}}


@pytest.mark.parametrize(
    "path", ["ray_configs/local.yaml", "tests/integration/pdserve-test.yaml",
             "ray_configs/bench.yaml", "ray_configs/levers.yaml"]
)
def test_shipped_configs_load(path):
    config = load_config(REPO / path)
    assert config.model.name.startswith("tiny-llama")
    assert config.engine.block_size == 32
    assert config.prefill.replicas == config.decode.replicas == 1


def test_defaults_fill_everything_but_the_model():
    config = parse_config(MINIMAL)
    assert config.router.port == 8000
    assert config.kv_transfer.connector == "NixlConnector"
    assert config.model.generate is None


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"model": {"name": "m"}}, "model.path", "Field required"),
        ({**MINIMAL, "prefill": {"replicas": 0}}, "prefill.replicas", "greater than or equal"),
        ({**MINIMAL, "router": {"port": "http"}}, "router.port", "valid integer"),
        ({**MINIMAL, "engine": {"block_sise": 16}}, "engine.block_sise", "Extra inputs"),
        ({**MINIMAL, "kv_transfer": {"buffer_device": "tpu"}}, "kv_transfer.buffer_device",
         "'cpu' or 'cuda'"),
        # vLLM 0.32 reads VLLM_CPU_KVCACHE_SPACE with int(): a fraction would stop the engine
        ({**MINIMAL, "engine": {"cpu_kvcache_space_gib": 1.5}}, "engine.cpu_kvcache_space_gib",
         "valid integer"),
        # a draft model's KV is not transferred and NIXL wants the same drafter on prefill
        ({**MINIMAL, "decode": {"speculative": {"method": "eagle"}}},
         "decode.speculative.method", "'ngram'"),
        ({**MINIMAL, "decode": {"speculative": {"prompt_lookup_min": 5}}},
         "decode.speculative", "prompt_lookup_min must not exceed"),
        ({**MINIMAL, "model": {"name": "m", "path": "/m", "generate": {"train": {"steps": 0}}}},
         "model.generate.train.steps", "greater than or equal"),
        # a shared store needs its address, and an address means a shared store
        ({**MINIMAL, "router": {"response_cache": {"enabled": True, "store": "redis"}}},
         "router.response_cache", "needs response_cache.redis_url"),
        ({**MINIMAL, "router": {"response_cache": {"redis_url": "redis://cache:6379/0"}}},
         "router.response_cache", "set store: redis"),
        ({**MINIMAL, "router": {"response_cache": {"store": "disk"}}},
         "router.response_cache.store", "'memory' or 'redis'"),
    ],
)
def test_invalid_field_is_named(data, field, words):
    with pytest.raises(ConfigError) as raised:
        parse_config(data, source="x.yaml")
    message = str(raised.value)
    assert f"{field}:" in message and words in message and "x.yaml" in message


def test_pools_may_not_diverge_in_kv_layout():
    data = {**MINIMAL, "decode": {"engine_overrides": {"block_size": 64}}}
    with pytest.raises(ConfigError, match=r"decode\.engine_overrides: .*may not set "
                                          r"\['block_size'\]: both pools"):
        parse_config(data)


def test_pools_may_not_diverge_in_what_computes_the_kv_blocks():
    for name, value in (("kv_cache_dtype", "fp8"), ("quantization", "compressed-tensors")):
        data = {**MINIMAL, "prefill": {"engine_overrides": {name: value}}}
        with pytest.raises(ConfigError, match=rf"may not set \['{name}'\]: both pools"):
            parse_config(data)


def test_kv_cache_dtype_is_typed_and_a_quantized_checkpoint_is_made_one_way():
    with pytest.raises(ConfigError, match=r"engine\.kv_cache_dtype"):
        parse_config({**MINIMAL, "engine": {"kv_cache_dtype": "int4"}})
    with pytest.raises(ConfigError, match=r"engine\.extra: .*engine\.kv_cache_dtype"):
        parse_config({**MINIMAL, "engine": {"extra": {"kv_cache_dtype": "fp8"}}})
    both = {"name": "m", "path": "/m-q", "generate": {}, "quantize": {"source": "/m"}}
    with pytest.raises(ConfigError, match="`generate` or `quantize`, not both"):
        parse_config({"model": both})
    config = parse_config({"model": {"name": "m", "path": "/m-q", "quantize": {"source": "m"}}})
    assert config.model.quantize.source.is_absolute() and config.model.quantize.scheme == "W8A8"


@pytest.mark.parametrize(("data", "field", "instead"), [
    # the prefill router would keep hashing prefixes in engine.block_size blocks
    ({"engine": {"extra": {"block_size": 8}}}, "engine.extra", "engine.block_size"),
    ({"engine": {"extra": {"max_num_batched_tokens": 512}}}, "engine.extra",
     "engine.max_num_batched_tokens"),
    ({"engine": {"extra": {"tensor_parallel_size": 2}}}, "engine.extra",
     "prefill.tensor_parallel_size / decode.tensor_parallel_size"),
    ({"engine": {"extra": {"kv_transfer_config": {}}}}, "engine.extra", "kv_transfer"),
    ({"decode": {"engine_overrides": {"speculative_config": {"method": "ngram"}}}},
     "decode.engine_overrides", "decode.speculative"),
    ({"prefill": {"engine_overrides": {"max_num_batched_tokens": 512}}},
     "prefill.engine_overrides", "this pool's `max_num_batched_tokens`"),
    ({"versions": {"v1": {"path": "/m", "decode": {"engine_overrides": {"model": "/x"}}}},
      "served_models": {"m": {"v1": 100}}}, "versions.v1.decode.engine_overrides",
     "model.path / versions.<version>.path"),
])
def test_escape_hatches_refuse_what_a_typed_field_sets(data, field, instead):
    document = {**MINIMAL, **data}
    if "versions" in data:
        document.pop("model")
    with pytest.raises(ConfigError) as raised:
        parse_config(document)
    assert f"{field}: " in str(raised.value) and f"(set {instead} instead)" in str(raised.value)


def test_escape_hatches_still_pass_what_has_no_typed_field():
    config = parse_config({**MINIMAL, "engine": {"extra": {"max_logprobs": 5}},
                           "decode": {"engine_overrides": {"max_num_seqs": 384},
                                      "max_num_batched_tokens": 1024}})
    assert config.engine.extra == {"max_logprobs": 5}
    assert config.decode.engine_overrides == {"max_num_seqs": 384}


def test_a_canary_ratio_the_gate_would_refuse_is_refused_by_the_config():
    data = {"versions": {"v1": {"path": "/m"}, "v2": {"path": "/m2"}},
            "served_models": {"chat": {"v1": 100, "v2": 0}},
            "canary": {"served_model": "chat", "baseline": "v1", "candidate": "v2",
                       "max_ttft_p95_ratio": 0.9}}
    with pytest.raises(ConfigError, match=r"canary\.max_ttft_p95_ratio: .*greater than or "
                                          r"equal to 1"):
        parse_config(data)
    data["canary"]["max_ttft_p95_ratio"] = 1.0   # as fast as the baseline: allowed
    assert parse_config(data).canary.max_ttft_p95_ratio == 1.0


def test_slo_is_one_section_and_the_old_autoscaling_keys_say_where_it_went():
    config = parse_config({**MINIMAL, "slo": {"ttft_p95_s": 0.3}})
    assert (config.slo.ttft_p95_s, config.slo.itl_p95_s, config.slo.tpot_s) == (0.3, 0.05, 0.1)
    data = {**MINIMAL, "autoscaling": {"decode": {"itl_p95_slo_s": 0.05}}}
    with pytest.raises(ConfigError, match=r"autoscaling\.decode: .*itl_p95_slo_s moved to "
                                          r"slo\.itl_p95_s"):
        parse_config(data)


def test_pool_bounds_resolve_over_autoscaling_and_must_stay_ordered():
    data = {**MINIMAL, "autoscaling": {"prefill": {"min_replicas": 2, "max_replicas": 10}},
            "prefill": {"max_replicas": 4}}
    config = parse_config(data)
    bounds = config.scaling_bounds("v1", "prefill")
    assert (bounds.min_replicas, bounds.max_replicas) == (2, 4)
    assert config.scaling_bounds("v1", "decode") == config.autoscaling.decode.bounds
    assert parse_config(MINIMAL).scaling_bounds("v1", "prefill") is None  # fixed size
    crossed = {**data, "prefill": {"min_replicas": 12}}
    with pytest.raises(ConfigError, match=r"prefill: its replica bounds over "
                                          r"autoscaling\.prefill's: min_replicas \(12\) "
                                          r"exceeds max_replicas \(10\)"):
        parse_config(crossed)
    with pytest.raises(ConfigError, match=r"autoscaling\.decode: .*min_replicas \(9\) exceeds"):
        parse_config({**MINIMAL, "autoscaling": {"decode": {"min_replicas": 9,
                                                            "max_replicas": 3}}})


def test_context_must_fit_the_generated_model():
    data = {"model": {**MINIMAL["model"], "generate": {"max_position_embeddings": 4096}},
            "engine": {"max_model_len": 8192}}
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        parse_config(data)


def test_tiny_model_heads_must_divide():
    data = {"model": {**MINIMAL["model"], "generate": {"num_heads": 4, "num_kv_heads": 3}}}
    with pytest.raises(ConfigError, match="num_kv_heads"):
        parse_config(data)


@pytest.mark.parametrize(("base", "span", "clash"), [
    (15600, 400, "Ray's worker ports"),       # the old default: inside 10002-19999
    (9800, 200, "Ray's worker ports"),        # 9800-10199 ends inside it
    (32000, 400, "ephemeral ports"),          # 32000-32799 runs into 32768
    (29600, 400, "direct-ingress HTTP ports"),  # 29600-30399: a router replica's 30000
])
def test_side_channel_ports_stay_clear_of_ray_workers_and_outgoing_connections(
        base, span, clash):
    data = {**MINIMAL, "kv_transfer": {"side_channel_base_port": base,
                                       "side_channel_port_span": span}}
    with pytest.raises(ConfigError, match=clash) as raised:
        parse_config(data)
    assert "kv_transfer.side_channel_base_port" in str(raised.value)


@pytest.mark.parametrize("path", sorted(
    str(path.relative_to(REPO)) for path in [*REPO.glob("tests/integration/pdserve-*.yaml"),
                                             *REPO.glob("ray_configs/*.yaml")]
    if not path.name.startswith("cluster-")))  # cluster-*.yaml are `ray up` files
def test_every_shipped_pdserve_config_passes_the_checks(path):
    load_config(REPO / path)  # the side-channel range check among them


def test_side_channel_ranges_clear_at_the_default_and_up_to_the_edges():
    assert parse_config(MINIMAL).kv_transfer.side_channel_base_port == 24600
    # one version, two pools of 400 ports: 31200-31999 ends just below 32768
    edge = {"side_channel_base_port": 31200, "side_channel_port_span": 400}
    assert parse_config({**MINIMAL, "kv_transfer": edge}).kv_transfer.side_channel_base_port
    parse_config({**MINIMAL, "kv_transfer": {"side_channel_base_port": 5000}})


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(scalar)


def test_speculation_belongs_to_decode_pools_and_reaches_only_their_engines():
    from cluster.engine.args import engine_kwargs

    config = parse_config({**MINIMAL, "decode": {"speculative": {"num_speculative_tokens": 3}}})
    assert engine_kwargs(config, "decode", None)["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
        "prompt_lookup_max": 4}
    assert "speculative_config" not in engine_kwargs(config, "prefill", None)
    with pytest.raises(ConfigError, match=r"prefill\.speculative: speculative decoding runs "
                                          r"on the decode pool only"):
        parse_config({**MINIMAL, "prefill": {"speculative": {}}})
