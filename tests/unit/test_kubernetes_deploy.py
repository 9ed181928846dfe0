"""deploy/kubernetes and the KServe custom predictor, offline: the manifests against Kubernetes'
and KServe's API models, and what they must agree on. tests/integration/test_image.py runs the
image with this profile and these probes."""

from pathlib import Path

import yaml

from ts_compiled_handlers.scripts.validate_manifests import validate_file

ROOT = Path(__file__).resolve().parents[2]
PLAIN = ROOT / "deploy" / "kubernetes" / "hfserve.yaml"
KSERVE = ROOT / "deploy" / "kserve" / "custom-predictor.yaml"


def documents(path: Path) -> dict[str, dict]:
    return {document["kind"]: document for document in yaml.safe_load_all(path.read_text())}


def profile() -> dict[str, str]:
    text = documents(PLAIN)["ConfigMap"]["data"]["config.properties"]
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_the_manifests_match_the_api_models():
    assert validate_file(PLAIN) == [] and validate_file(KSERVE) == []
    assert set(documents(PLAIN)) == {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler", "NetworkPolicy"}


def test_the_profile_keeps_management_on_loopback_and_says_why_tokens_are_off():
    settings = profile()
    assert settings["management_address"] == "http://127.0.0.1:8081" and settings["enable_model_api"] == "false"
    assert (
        settings["inference_address"] == "http://0.0.0.0:8080" and settings["metrics_address"] == "http://0.0.0.0:8082"
    )
    assert settings["disable_token_authorization"] == "true"
    assert "NetworkPolicy below, not a token" in PLAIN.read_text()
    assert settings["model_store"] == "model-store" and settings["allowed_urls"] == "model-store/[A-Za-z0-9_.-]+[.]mar"


def test_both_run_the_same_container_with_probes_that_wait_for_warm_workers():
    plain = documents(PLAIN)["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    kserve = documents(KSERVE)["InferenceService"]["spec"]["predictor"]["containers"][0]
    for container in (plain, kserve):
        assert container["args"] == ["serve", "--models", "minilm=minilm.mar"]
        assert container["startupProbe"]["exec"]["command"] == ["hfserve", "health"]
        assert container["readinessProbe"]["exec"]["command"] == ["hfserve", "health"]
        assert container["livenessProbe"]["exec"]["command"] == ["hfserve", "health", "--live"]
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= int(profile()["default_startup_timeout"])
        assert container["resources"]["requests"] == container["resources"]["limits"]  # threads = the quota
        mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
        assert {"/home/model-server/config.properties", "/home/model-server/model-store"} <= mounts
    assert plain["resources"] == kserve["resources"]
    hpa = documents(PLAIN)["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == documents(PLAIN)["Deployment"]["metadata"]["name"]
