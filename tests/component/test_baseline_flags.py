"""The benchmark baseline's command line, read back by vLLM's own server parser, gives the
engine arguments pdserve's engines get (vLLM's flag spelling is checked, nothing starts)."""

from pathlib import Path

import pytest
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

from cluster.config import load_config, parse_config
from cluster.engine.args import baseline_flags, engine_kwargs

REPO = Path(__file__).resolve().parents[2]
EDGE = {
    "model": {"name": "m", "path": "/models/m"},
    "engine": {"dtype": "float32", "block_size": 32, "cpu_kvcache_space_gib": 3,
               "enable_prefix_caching": False,
               "extra": {"max_logprobs": 5, "hf_overrides": {"rope_theta": 10000}}},
    "decode": {"engine_overrides": {"max_num_seqs": 32}, "max_num_batched_tokens": 256},
}


@pytest.mark.parametrize(
    "config", [parse_config(EDGE), load_config(REPO / "ray_configs/bench.yaml")],
    ids=["extra-and-overrides", "bench.yaml"])
def test_vllm_parses_the_baseline_flags_into_the_decode_engines_arguments(config):
    parser = make_arg_parser(FlexibleArgumentParser())
    parsed = parser.parse_args([*baseline_flags(config), "--host", "127.0.0.1", "--port", "1"])
    engine_args = AsyncEngineArgs.from_cli_args(parsed)
    expected = {**engine_kwargs(config, "decode", None), "served_model_name": [config.model.name]}
    assert {name: getattr(engine_args, name) for name in expected} == expected
