"""The image users deploy, as docs/operations.md#container tells them to use it: built by
scripts/build_image.sh, MiniLM's archive built inside it from a mounted folder, served by the
entry point (from another working directory), compiled, probed, answering as
sentence-transformers does; a second archive registered with `docker exec ... hfserve register`;
`docker stop` ending it cleanly. The `image` fixture (tests/integration/conftest.py) builds it;
where Docker cannot run (no daemon, not root) the module is skipped, unless
HFSERVE_REQUIRE_DOCKER=1 (CI sets it: there the script installs and starts Docker)."""

import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
import torch
import yaml
from archives import SMALL_GRID

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOME = "/home/model-server"
TEXTS = ["hello world", "The cat sat on the mat.", "A longer sentence about serving compiled transformer models."]


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 or not check, f"docker {' '.join(args)}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done


def readable_copy(model: Path, folder: Path) -> Path:
    """`model` where the image's user can read it (safetensors writes its files 0600)."""
    copy = Path(shutil.copytree(model, folder / model.name))
    for path in copy.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return copy


@pytest.fixture(scope="module")
def store(tmp_path_factory, image, minilm_dir, tiny_models):
    """A model store on the host holding MiniLM's archive and a tiny classifier's, each built
    inside the image from a mounted model folder, as a user would."""
    store = tmp_path_factory.mktemp("image-store")
    store.chmod(0o777)  # the image's user, model-server, writes the archives
    (store / "small-grid.yaml").write_text(yaml.safe_dump({"handler": SMALL_GRID}))
    builds = [
        (minilm_dir, ["--task", "embedding", "--model-name", "minilm"]),
        (
            readable_copy(tiny_models["text-classification"], tmp_path_factory.mktemp("image-models")),
            ["--model-name", "classifier", "--config", "model-store/small-grid.yaml"],
        ),
    ]
    for model, flags in builds:
        mounts = ["-v", f"{model}:/model:ro", "-v", f"{store}:{HOME}/model-store"]
        command = ["hfserve", "build", "--model", "/model", *flags, "--export-path", "model-store"]
        docker("run", "--rm", *mounts, image, *command, timeout=300)
    assert {path.name for path in store.glob("*.mar")} == {"minilm.mar", "classifier.mar"}
    return store


class Container:
    def __init__(self, name: str):
        self.name = name
        self.inference = f"http://{docker('port', name, '8080/tcp').stdout.split()[0]}"

    def exec(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return docker("exec", self.name, *args, timeout=timeout, check=False)

    def key(self) -> str:
        keys = self.exec("cat", f"{HOME}/key_file.json").stdout
        return json.loads(keys)["inference"]["key"]

    def predict(self, name: str, body) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.key()}"}
        return requests.post(f"{self.inference}/predictions/{name}", json=body, headers=headers, timeout=60)

    def logs(self) -> str:
        done = docker("logs", self.name)
        return done.stdout + done.stderr


def wait_until_healthy(served: "Container", probe: list[str], seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while served.exec(*probe, timeout=30).returncode != 0:
        running = docker("inspect", served.name, "--format", "{{.State.Running}}").stdout.strip()
        assert running == "true", served.logs()[-5000:]
        assert time.monotonic() < deadline, served.logs()[-5000:]
        time.sleep(2)


@pytest.fixture(scope="module")
def container(image, store):
    """The image serving MiniLM, started from /tmp (not its home), published on loopback ports."""
    name = f"hfserve-test-{uuid.uuid4().hex[:8]}"
    ports = ["-p", "127.0.0.1::8080"]
    volume = ["-v", f"{store}:{HOME}/model-store"]
    docker("run", "-d", "--name", name, "-w", "/tmp", *ports, *volume, image, "serve", "--models", "minilm=minilm.mar")
    try:
        served = Container(name)
        wait_until_healthy(served, ["hfserve", "health"])
        yield served
    finally:
        docker("rm", "-f", name, check=False)


def test_minilm_serves_compiled_in_the_image_and_answers_as_sentence_transformers(container, minilm_dir):
    from sentence_transformers import SentenceTransformer

    answers = container.predict("minilm", {"inputs": TEXTS})
    assert answers.status_code == 200, answers.text
    got = torch.tensor([answer["embedding"] for answer in answers.json()])
    expected = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert torch.nn.functional.cosine_similarity(got, expected).min() >= 0.99
    ready = re.search(r"minilm_1\.0-stdout MODEL_LOG - Ready in \S+ from (\w+)", container.logs())
    assert ready and ready[1] == "compiled", container.logs()[-3000:]
    assert "minilm_1.0-stdout MODEL_LOG - Memory allocator: tcmalloc" in container.logs()  # the image's preload
    # TorchServe asks no key for metrics, so the image keeps them on the container's loopback
    read = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8082/metrics').read().decode())"
    metrics = container.exec("python3", "-c", read).stdout
    assert re.search(r'^CompileFallback\{ModelName="minilm",.*\} 0\.0$', metrics, re.MULTILINE), metrics
    assert "EagerFallbacks{" not in metrics


def test_probes_use_the_key_inside_the_container(container):
    assert requests.get(f"{container.inference}/ping", timeout=10).status_code == 400  # no key: refused
    assert container.exec("hfserve", "health", "--live").stdout.strip() == "alive"
    assert container.exec("hfserve", "health").stdout.strip() == "ready"
    deadline = time.monotonic() + 60  # Docker's own HEALTHCHECK runs `hfserve health` every 10 s
    while docker("inspect", container.name, "--format", "{{.State.Health.Status}}").stdout.strip() != "healthy":
        assert time.monotonic() < deadline
        time.sleep(2)


def test_a_second_archive_is_registered_with_docker_exec(container):
    registered = container.exec("hfserve", "register", "classifier.mar")
    assert registered.returncode == 0, registered.stderr
    described = json.loads(container.exec("hfserve", "describe", "classifier").stdout)
    assert [worker["status"] for worker in described["workers"]] == ["READY"]
    answer = container.predict("classifier", {"inputs": "a short text"})
    assert answer.status_code == 200 and set(answer.json()[0]) == {"label", "score"}, answer.text
    listed = json.loads(container.exec("hfserve", "list").stdout)
    assert sorted(model["modelName"] for model in listed) == ["classifier", "minilm"]


def test_docker_stop_stops_torchserve_cleanly_within_15_seconds(container):
    began = time.monotonic()
    docker("stop", "-t", "15", container.name, timeout=60)
    assert time.monotonic() - began < 15
    assert docker("inspect", container.name, "--format", "{{.State.ExitCode}}").stdout.strip() == "0"
    assert "TorchServe has stopped." in container.logs()


def test_the_kubernetes_deployment_runs_as_its_manifest_says(image, store, tmp_path):
    """deploy/kubernetes/hfserve.yaml's container in Docker: its ConfigMap's profile mounted over
    the config, its args, env and volumes, its probes run as the kubelet runs them."""
    manifests = {doc["kind"]: doc for doc in yaml.safe_load_all((ROOT / "deploy/kubernetes/hfserve.yaml").read_text())}
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    spec = pod["containers"][0]
    config = tmp_path / "config.properties"
    config.write_text(manifests["ConfigMap"]["data"]["config.properties"])
    config.chmod(0o644)
    mounts = {"config": str(config), "models": str(store), "compile-cache": str(tmp_path / "cache")}
    (tmp_path / "cache").mkdir(mode=0o777)
    (tmp_path / "cache").chmod(0o777)
    volumes = [arg for mount in spec["volumeMounts"] for arg in ("-v", f"{mounts[mount['name']]}:{mount['mountPath']}")]
    env = [arg for item in spec["env"] for arg in ("-e", f"{item['name']}={item['value']}")]
    user = ["--user", str(pod["securityContext"]["runAsUser"])]
    name = f"hfserve-k8s-{uuid.uuid4().hex[:8]}"
    ports = ["-p", "127.0.0.1::8080"]
    docker("run", "-d", "--name", name, *ports, *user, *env, *volumes, image, *spec["args"])
    try:
        served = Container(name)
        wait_until_healthy(served, spec["startupProbe"]["exec"]["command"])
        assert served.exec(*spec["readinessProbe"]["exec"]["command"]).stdout.strip() == "ready"
        assert served.exec(*spec["livenessProbe"]["exec"]["command"]).stdout.strip() == "alive"
        # no token in this profile: the NetworkPolicy keeps other pods out
        assert requests.get(f"{served.inference}/ping", timeout=10).status_code == 200
        answer = requests.post(f"{served.inference}/predictions/minilm", json={"inputs": TEXTS[0]}, timeout=60)
        assert answer.status_code == 200 and len(answer.json()["embedding"]) == 384
        refused = served.exec("hfserve", "register", "classifier.mar")  # enable_model_api=false
        assert refused.returncode == 1 and re.search(r"HTTP (403|405)", refused.stderr), refused.stderr
    finally:
        docker("rm", "-f", name, check=False)
