"""Config loading: the shipped files load, and every mistake names its field."""

from pathlib import Path

import pytest

from cluster.config import ConfigError, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]
MINIMAL = {"model": {"name": "m", "path": "/models/m"}}


@pytest.mark.parametrize(
    "path", ["ray_configs/local.yaml", "tests/integration/pdserve-test.yaml",
             "ray_configs/bench.yaml"]
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
    ],
)
def test_invalid_field_is_named(data, field, words):
    with pytest.raises(ConfigError) as raised:
        parse_config(data, source="x.yaml")
    message = str(raised.value)
    assert f"{field}:" in message and words in message and "x.yaml" in message


def test_pools_may_not_diverge_in_kv_layout():
    data = {**MINIMAL, "decode": {"engine_overrides": {"block_size": 64}}}
    with pytest.raises(ConfigError, match=r"decode.engine_overrides may not set \['block_size'\]"):
        parse_config(data)


def test_context_must_fit_the_generated_model():
    data = {"model": {**MINIMAL["model"], "generate": {"max_position_embeddings": 4096}},
            "engine": {"max_model_len": 8192}}
    with pytest.raises(ConfigError, match="max_position_embeddings"):
        parse_config(data)


def test_tiny_model_heads_must_divide():
    data = {"model": {**MINIMAL["model"], "generate": {"num_heads": 4, "num_kv_heads": 3}}}
    with pytest.raises(ConfigError, match="num_kv_heads"):
        parse_config(data)


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
