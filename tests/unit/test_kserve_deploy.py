"""deploy/kserve offline: the manifests against the KServe and Kubernetes API models, the profile, the layout.

No cluster is reachable here: nothing in this file applies a manifest (see deploy/kserve/README.md).
"""

import copy
import json
import zipfile
from pathlib import Path

import pytest
import yaml

from ts_compiled_handlers.scripts.build_mar import build
from ts_compiled_handlers.scripts.kserve_layout import write_layout
from ts_compiled_handlers.scripts.validate_manifests import validate, validate_file

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kserve"


def properties(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize("manifest", sorted(DEPLOY.glob("*.yaml")), ids=lambda path: path.name)
def test_every_shipped_manifest_matches_the_api_models(manifest):
    assert validate_file(manifest) == []


def test_the_check_catches_misspelt_misplaced_and_mistyped_fields():
    service = next(yaml.safe_load_all((DEPLOY / "inferenceservice.yaml").read_text()))  # then its NetworkPolicy
    broken = copy.deepcopy(service)
    broken["spec"]["predictor"]["minReplica"] = 1
    broken["spec"]["predictor"]["model"]["resources"] = ["cpu"]
    broken["spec"]["predictor"]["model"]["readinessProbe"]["periodSeconds"] = "5s"
    broken["spec"]["predictor"]["model"]["env"][0]["valu"] = "x"
    assert validate(broken) == [
        "InferenceService.spec.predictor.minReplica: no such field in V1beta1PredictorSpec",
        "InferenceService.spec.predictor.model.env[0].valu: no such field in V1EnvVar",
        "InferenceService.spec.predictor.model.resources: an object (V1ResourceRequirements) was expected",
        "InferenceService.spec.predictor.model.readinessProbe.periodSeconds: int expected, got str",
    ]
    assert validate({"apiVersion": "v1", "kind": "Secret"})[0].startswith("('v1', 'Secret'): not a kind")


def test_the_kubernetes_profile_differs_from_the_default_only_where_it_says_why():
    default = properties((ROOT / "config.properties").read_text())
    profile = properties((DEPLOY / "config.properties").read_text())
    assert default["disable_token_authorization"] == "false" and "0.0.0.0" not in json.dumps(default)
    changed = {key for key in default.keys() & profile.keys() if default[key] != profile[key]}
    assert changed == {  # the management API and gRPC keep the default's loopback ports
        "inference_address",
        "metrics_address",
        "disable_token_authorization",
        "enable_model_api",
        "model_store",
        "allowed_urls",
        "metrics_config",
        "vmargs",  # the log4j2.xml beside metrics.yaml in the storage
    }
    assert profile["management_address"].startswith("http://127.0.0.1:")
    assert profile["grpc_inference_address"] == profile["grpc_management_address"] == "127.0.0.1"
    assert profile["enable_envvars_config"] == "false" and profile["install_py_dep_per_model"] == "false"


def test_the_layout_holds_the_archive_the_profile_and_a_snapshot_of_the_models(tiny_bert, tmp_path):
    mar = build(tiny_bert, "embedding", "tiny", tmp_path / "store", {"responseTimeout": 45}, version="3.0")
    out = write_layout([mar], tmp_path / "layout", 4, 10, 2, DEPLOY / "config.properties")
    assert (out / "model-store" / "tiny.mar").read_bytes() == mar.read_bytes()
    assert (out / "config" / "metrics.yaml").read_text() == (
        ROOT / "handlers" / "servers" / "torchserve" / "metrics.yaml"
    ).read_text()  # the package's
    assert (out / "config" / "ready.py").read_text() == (DEPLOY / "ready.py").read_text()
    rendered = (out / "config" / "config.properties").read_text()
    assert "${" not in rendered
    snapshot = json.loads(properties(rendered)["model_snapshot"])
    assert snapshot["modelCount"] == 1
    assert snapshot["models"] == {
        "tiny": {
            "3.0": {
                "defaultVersion": True,
                "marName": "tiny.mar",
                "minWorkers": 2,
                "maxWorkers": 2,
                "batchSize": 4,
                "maxBatchDelay": 10,
                "responseTimeout": 45,
            }
        }
    }
    with zipfile.ZipFile(out / "model-store" / "tiny.mar") as archive:
        assert "ts_compiled_handlers/protocols/kserve_v2.py" in archive.namelist()


def test_the_layout_keeps_each_archives_own_batching_unless_told(tiny_bert, tmp_path):
    mar = build(tiny_bert, "embedding", "tiny", tmp_path / "store", {"batchSize": 16, "maxBatchDelay": 7})
    out = write_layout([mar], tmp_path / "layout", None, None, 1, DEPLOY / "config.properties")
    entry = json.loads(properties((out / "config" / "config.properties").read_text())["model_snapshot"])
    assert {key: entry["models"]["tiny"]["1.0"][key] for key in ("batchSize", "maxBatchDelay")} == {
        "batchSize": 16,
        "maxBatchDelay": 7,
    }
