"""The Serve config file `pdserve serve-config` writes validates against Ray Serve's schema."""

from pathlib import Path

import yaml
from ray.serve.schema import ServeDeploySchema

from cluster.config import load_config, parse_config
from cluster.serve_config import serve_config

REPO = Path(__file__).resolve().parents[2]


def test_a_coupled_autoscaling_config_gets_the_application_policy(tmp_path):
    document = yaml.safe_load((REPO / "ray_configs/prod-70b.yaml").read_text())
    path = tmp_path / "prod.yaml"
    path.write_text(yaml.safe_dump(document))
    config = parse_config(document)
    schema = ServeDeploySchema.model_validate(serve_config(config, path))
    app = schema.applications[0]
    assert app.import_path == "cluster.app:app_builder"
    assert app.args["config"] == str(path)
    policy = app.autoscaling_policy
    assert policy["policy_function"].endswith(":AppAutoscalingPolicy")
    assert policy["policy_kwargs"]["deployment_pools"] == {"prefill-v1": "prefill",
                                                           "decode-v1": "decode"}
    # an edited file at the same path is a new application version
    before = app.args["config_digest"]
    path.write_text(path.read_text() + "\n# edited\n")
    assert serve_config(config, path)["applications"][0]["args"]["config_digest"] != before


def test_without_autoscaling_there_is_no_application_policy():
    path = REPO / "ray_configs/local.yaml"
    app = serve_config(load_config(path), path)["applications"][0]
    assert "autoscaling_policy" not in app
    ServeDeploySchema.model_validate(serve_config(load_config(path), path))
