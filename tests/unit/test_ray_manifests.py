"""The Ray manifests, checked offline: Serve's config files against Ray Serve's own schema, the
RayService's pod templates and the NetworkPolicy against Kubernetes' models (there is no cluster
here, and no KubeRay client: the RayService's own fields are checked by name below)."""

from pathlib import Path

import pytest
import yaml

from ts_compiled_handlers.scripts.validate_manifests import check, validate

schema = pytest.importorskip("ray.serve.schema", reason="the ray extra")

RAY = Path(__file__).resolve().parents[2] / "deploy" / "ray"


def serve_config(text: str) -> dict:
    config = yaml.safe_load(text)
    schema.ServeDeploySchema.model_validate(config)  # raises with the field's path
    return config


def test_the_serve_deploy_file_is_a_valid_serve_config_of_our_builder():
    config = serve_config((RAY / "serve.yaml").read_text())
    (application,) = config["applications"]
    assert application["import_path"] == "ts_compiled_handlers.servers.ray.serve:app"
    assert config["http_options"]["host"] == "127.0.0.1"
    from ts_compiled_handlers.servers.ray.serve import AppArgs

    AppArgs.model_validate(application["args"])  # every argument one the builder takes


def test_the_rayservice_holds_a_valid_serve_config_and_pod_templates():
    service, policy = yaml.safe_load_all((RAY / "rayservice.yaml").read_text())
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    assert set(service["spec"]) == {"serveConfigV2", "rayClusterConfig"}
    config = serve_config(service["spec"]["serveConfigV2"])
    from ts_compiled_handlers.servers.ray.serve import AppArgs

    AppArgs.model_validate(config["applications"][0]["args"])
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == "2.60.0"
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    errors = [error for group in groups for error in check(group["template"], "V1PodTemplateSpec", "template")]
    assert not errors, errors
    labels = {group["template"]["metadata"]["labels"]["app.kubernetes.io/name"] for group in groups}
    assert validate(policy) == [] and labels == {policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"]}
    head_ports = {
        port["containerPort"] for port in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    }
    open_ports = {port["port"] for rule in policy["spec"]["ingress"] if "from" not in rule for port in rule["ports"]}
    assert open_ports == {8000} and {6379, 8265, 10001} <= head_ports  # Ray's own ports: inside only
