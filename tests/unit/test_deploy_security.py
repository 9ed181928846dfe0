"""Every deployment profile closed by default, checked offline: token authorization on, or a
NetworkPolicy that selects exactly the profile's pods, admits no client that a pod of the same
namespace could become by labelling itself, and lets only a named monitoring namespace read the
metrics that ask no key. Ray: its own ports for its pods and KubeRay's operator only, the API key
a mounted Secret's file. (The manifests' fields against the API models: test_kubernetes_deploy.py,
test_kserve_deploy.py, test_ray_manifests.py.)"""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PLAIN = DEPLOY / "kubernetes" / "hfserve.yaml"
KSERVE = DEPLOY / "kserve"
RAY = DEPLOY / "ray" / "rayservice.yaml"
NAMESPACE = "kubernetes.io/metadata.name"
INFERENCE, METRICS = 8080, 8082


def documents(path: Path) -> list[dict]:
    return list(yaml.safe_load_all(path.read_text()))


def of_kind(path: Path, kind: str) -> dict:
    (document,) = [document for document in documents(path) if document["kind"] == kind]
    return document


def properties(text: str) -> dict[str, str]:
    lines = [line.strip() for line in text.splitlines() if "=" in line and not line.lstrip().startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def peers(policy: dict, port: int) -> list[dict | None]:
    """Who the policy admits to `port`: its rules' peers, None for a rule that admits everyone."""
    found = []
    for rule in policy["spec"]["ingress"]:
        if "ports" not in rule or port in {entry["port"] for entry in rule["ports"]}:
            found += rule.get("from") or [None]
    return found


def named_namespace(peer: dict | None) -> str | None:
    """The one namespace a peer names, else None (everyone, or this namespace, or all of them)."""
    if not peer or "namespaceSelector" not in peer:
        return None
    selector = peer["namespaceSelector"]
    return selector.get("matchLabels", {}).get(NAMESPACE) if set(selector) == {"matchLabels"} else None


def check_keyless_ports_are_closed(policy: dict, text: str) -> None:
    """Inference: labelled pods of a named client namespace only (both in one peer); metrics: a named
    monitoring namespace only; both names marked as parameters; the CNI requirement said."""
    (client,) = peers(policy, INFERENCE)
    assert named_namespace(client) == "hfserve-clients" and client["podSelector"]["matchLabels"]
    assert [named_namespace(peer) for peer in peers(policy, METRICS)] == ["monitoring"]
    assert "# PARAMETER CLIENT_NAMESPACE" in text and "# PARAMETER MONITORING_NAMESPACE" in text
    assert "NEEDS A CNI THAT ENFORCES NETWORKPOLICIES" in text


def test_the_default_and_the_image_keep_tokens_on_and_keyless_metrics_on_loopback():
    for config in (ROOT / "config.properties", ROOT / "handlers" / "servers" / "torchserve" / "config.properties"):
        settings = properties(config.read_text())
        assert settings["disable_token_authorization"] == "false"
        assert all(settings[f"{api}_address"].startswith("http://127.0.0.1:") for api in ("management", "metrics"))
    recipe = (ROOT / "Dockerfile").read_text()
    assert "--bind 0.0.0.0" in recipe and "--metrics-bind 127.0.0.1" in recipe and "8082" not in recipe


def test_the_kubernetes_profile_has_no_token_so_its_policy_selects_exactly_its_pods():
    assert properties(of_kind(PLAIN, "ConfigMap")["data"]["config.properties"])["disable_token_authorization"] == "true"
    deployment, policy = of_kind(PLAIN, "Deployment"), of_kind(PLAIN, "NetworkPolicy")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"] == {"matchLabels": labels}
    assert of_kind(PLAIN, "Service")["spec"]["selector"] == labels
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    check_keyless_ports_are_closed(policy, PLAIN.read_text())
    assert "enforce" in (DEPLOY / "kubernetes" / "README.md").read_text()


@pytest.mark.parametrize("manifest", ["custom-predictor.yaml", "inferenceservice.yaml"])
def test_each_kserve_predictor_has_a_policy_that_selects_it_by_kserves_labels(manifest):
    """KServe labels a predictor's pods with its InferenceService's name and `component: predictor`;
    both profiles run without a token (the ConfigMap of ../kubernetes, or deploy/kserve's profile)."""
    service, policy = of_kind(KSERVE / manifest, "InferenceService"), of_kind(KSERVE / manifest, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "serving.kserve.io/inferenceservice": service["metadata"]["name"],
        "component": "predictor",
    }
    check_keyless_ports_are_closed(policy, (KSERVE / manifest).read_text())
    assert properties((KSERVE / "config.properties").read_text())["disable_token_authorization"] == "true"
    assert "enforce" in (KSERVE / "README.md").read_text()


def ray_service() -> tuple[dict, list[dict], dict]:
    service, policy = documents(RAY)
    cluster = service["spec"]["rayClusterConfig"]
    return service, [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]], policy


def test_rays_own_ports_admit_only_its_pods_and_the_operator_and_serve_takes_a_key():
    service, groups, policy = ray_service()
    labels = [group["template"]["metadata"]["labels"] for group in groups]
    assert labels == [labels[0]] * len(groups)
    cluster_pods = {"podSelector": {"matchLabels": labels[0]}}
    assert policy["spec"]["podSelector"] == cluster_pods["podSelector"]
    for port in (6379, 10001, 52365):  # GCS, the Ray client, a node's dashboard agent: the cluster's pods alone
        assert peers(policy, port) == [cluster_pods], port
    operator = [peer for peer in peers(policy, 8265) if peer != cluster_pods]
    assert [named_namespace(peer) for peer in operator] == ["ray-system"]  # PARAMETER OPERATOR_NAMESPACE
    assert operator[0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kuberay-operator"}
    assert [named_namespace(peer) for peer in peers(policy, 8080) if peer != cluster_pods] == ["monitoring"]
    assert peers(policy, 8000) == [cluster_pods, None]  # Serve's port: any client, with the key
    assert service["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}  # Ray's own token too
    text = RAY.read_text()
    assert "# PARAMETER OPERATOR_NAMESPACE" in text and "# PARAMETER MONITORING_NAMESPACE" in text
    assert "NEEDS A CNI THAT ENFORCES NETWORKPOLICIES" in text


def test_rays_api_key_is_a_mounted_secret_file_on_every_pod_never_an_environment_variable():
    service, groups, _ = ray_service()
    (application,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    key_file = Path(application["args"]["key_file"])
    assert "api_key" not in application["args"]  # a key in the config would be kept in Serve's stored config
    for group in groups:
        pod = group["template"]["spec"]
        secrets = {volume["name"]: volume["secret"] for volume in pod["volumes"] if "secret" in volume}
        (container,) = pod["containers"]
        mounted = {mount["mountPath"]: mount for mount in container["volumeMounts"] if mount["name"] in secrets}
        assert str(key_file.parent) in mounted and mounted[str(key_file.parent)]["readOnly"]
        assert secrets[mounted[str(key_file.parent)]["name"]]["secretName"] == "minilm-api-key"
        assert not any("valueFrom" in variable or "KEY" in variable["name"] for variable in container.get("env", []))
    assert "HFSERVE_API_KEY" not in RAY.read_text()


def test_rays_dashboard_listens_beyond_loopback_only_because_the_operator_must_reach_it():
    """KubeRay deploys serveConfigV2 through the dashboard at the head pod's address, so it cannot
    be on loopback; the policy above keeps it to the operator and the cluster's pods."""
    _, (head, *_), policy = ray_service()
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert None not in peers(policy, 8265)
    assert (DEPLOY / "ray" / "serve.yaml").read_text().count("host: 127.0.0.1") == 1  # one host: loopback


@pytest.mark.parametrize(
    "manifest",
    [PLAIN, KSERVE / "custom-predictor.yaml", KSERVE / "inferenceservice.yaml"],
    ids=lambda path: path.name,
)
def test_the_compile_cache_is_a_private_folder_in_an_emptydir_sized_for_workers_plus_one_copies(manifest):
    if manifest == PLAIN:
        pod = of_kind(PLAIN, "Deployment")["spec"]["template"]["spec"]
        container = pod["containers"][0]
    else:
        pod = of_kind(manifest, "InferenceService")["spec"]["predictor"]
        container = pod["containers"][0] if "containers" in pod else pod["model"]
    (mount,) = [mount for mount in container["volumeMounts"] if mount["name"] == "compile-cache"]
    (variable,) = [variable for variable in container["env"] if variable["name"] == "HFSERVE_CACHE_DIR"]
    assert Path(variable["value"]).parent == Path(mount["mountPath"])  # made 0700 by the worker: not the mount
    (volume,) = [volume for volume in pod["volumes"] if volume["name"] == "compile-cache"]
    assert volume["emptyDir"]["sizeLimit"] == "4Gi" and "(workers + 1) x one copy" in manifest.read_text()
