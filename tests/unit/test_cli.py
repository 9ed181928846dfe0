"""The installed `hfserve` command: its commands are there, and bad input gets one line, never a traceback."""

import json
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

HFSERVE = Path(sys.executable).parent / "hfserve"


def hfserve(*argv, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(HFSERVE), *argv], capture_output=True, text=True, cwd=cwd, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert fragment in lines[0], lines[0]


@pytest.mark.heavy  # starts a process
def test_help_lists_every_command_and_each_command_shows_its_defaults():
    result = hfserve("--help")
    assert result.returncode == 0
    for command in ("init", "build", "start", "stop", "register", "list", "describe", "scale", "unregister", "plan"):
        assert f"\n  {command} " in result.stdout, command
    assert "(default: 8080)" in hfserve("start", "--help").stdout
    assert "(default: 1.0)" in hfserve("build", "--help").stdout


@pytest.mark.heavy  # starts a process
def test_a_bare_hfserve_lists_the_commands_and_version_names_the_release():
    from importlib.metadata import version

    bare = hfserve()
    assert bare.returncode == 0 and "\n  build " in bare.stdout and "\n  loadtest " in bare.stdout
    named = hfserve("--version")
    assert (
        named.returncode == 0
        and named.stdout.strip() == f"hfserve (ts-compiled-handlers) {version('ts-compiled-handlers')}"
    )


@pytest.mark.heavy  # starts a process
def test_build_reads_the_task_from_the_model_and_names_the_choices_when_it_cannot(tiny_models, tmp_path):
    built = hfserve("build", "--model", str(tiny_models["cross-encoder"]), "--model-name", "ranker", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    assert "task: text-classification, read from the model's files" in built.stdout
    with zipfile.ZipFile(tmp_path / "model_store" / "ranker.mar") as mar:
        assert json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]["handler"] == "handler.py"  # every task's
        assert yaml.safe_load(mar.read("model-config.yaml"))["handler"]["task"] == "text-classification"
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        source = tiny_models["embedding"] / name
        if source.is_file():
            (bare / name).write_bytes(source.read_bytes())
    assert_one_line_error(hfserve("build", "--model", str(bare), "--model-name", "bare", cwd=tmp_path), "pass --task")


@pytest.mark.heavy  # starts a process
def test_an_unknown_command_is_one_line():
    assert_one_line_error(hfserve("serve-all-the-things"), "unknown command 'serve-all-the-things'")


@pytest.mark.heavy  # starts a process
@pytest.mark.parametrize(
    "config, expected",
    [("handler: {dtype: [unclosed\n", "is not valid YAML"), ("handler: {dtype: int8}\n", "handler.dtype='int8'")],
)
def test_a_config_file_that_does_not_parse_or_has_a_bad_value_is_one_line(tiny_bert, tmp_path, config, expected):
    bad = tmp_path / "bad.yaml"
    bad.write_text(config)
    result = hfserve(
        "build", "--model", str(tiny_bert), "--model-name", "x", "--config", str(bad), "--export-path", str(tmp_path)
    )
    assert_one_line_error(result, expected)


@pytest.mark.heavy  # starts a process
def test_an_existing_archive_is_not_overwritten_without_force(tmp_path, tiny_bert):
    (tmp_path / "minilm.mar").write_bytes(b"an earlier version")
    result = hfserve("build", "--model", str(tiny_bert), "--name", "minilm", "--export-path", str(tmp_path))
    assert_one_line_error(result, "pass --force")
    assert (tmp_path / "minilm.mar").read_bytes() == b"an earlier version"


@pytest.mark.heavy  # starts a process
def test_a_busy_port_is_one_line_naming_the_flag(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = hfserve("start", "--workdir", str(tmp_path), "--inference-port", str(port))
    assert_one_line_error(result, f"port {port} (--inference-port) is in use")


@pytest.mark.heavy  # starts a process
@pytest.mark.parametrize("command", [["register", "missing.mar"], ["list"]])
def test_a_missing_archive_or_server_is_one_line(tmp_path, command):
    store = tmp_path / "store"
    store.mkdir()
    ports = {"INFERENCE_PORT": 1, "MANAGEMENT_PORT": 1, "METRICS_PORT": 1}
    (tmp_path / "ports.json").write_text(json.dumps({"ports": ports, "model_store": str(store)}))
    result = hfserve(command[0], "--workdir", str(tmp_path), *command[1:])
    expected = "missing.mar is not in the model store" if command[0] == "register" else "no TorchServe answers"
    assert_one_line_error(result, expected)


@pytest.mark.heavy  # starts a process
def test_health_finds_a_server_started_by_hand_from_its_config_and_fails_in_one_line_while_it_is_down(tmp_path):
    from ts_compiled_handlers.scripts.serve import TorchServe, init

    init(tmp_path, bind="0.0.0.0", store="model-store")  # what the image's home holds
    written = (tmp_path / "config.properties").read_text()  # its comments say what it sets
    assert "# Inference on 0.0.0.0, metrics on 127.0.0.1; management and gRPC on loopback only" in written
    assert "--model-store model-store --models" in written and "model_store" not in written.replace("model_store=", "")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    config = tmp_path / "config.properties"
    config.write_text(config.read_text().replace("0.0.0.0:8080", f"0.0.0.0:{port}"))
    server = TorchServe.attach(tmp_path)
    assert server.inference_url == f"http://127.0.0.1:{port}" and server.management_url == "http://127.0.0.1:8081"
    assert server.model_store == (tmp_path / "model-store").resolve()
    for flags in ([], ["--live"]):
        assert_one_line_error(hfserve("health", "--workdir", str(tmp_path), *flags), "no TorchServe answers yet")


@pytest.mark.heavy  # starts a process
def test_a_command_without_a_started_server_is_one_line(tmp_path):
    assert_one_line_error(hfserve("describe", "minilm", "--workdir", str(tmp_path)), "no server was started")


@pytest.mark.heavy  # starts a process
def test_any_other_failure_is_one_line_too(tiny_bert, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    result = hfserve(
        "build", "--model", str(tiny_bert), "--model-name", "x", "--plan", str(plan), "--export-path", str(tmp_path)
    )
    assert_one_line_error(result, "JSONDecodeError")


@pytest.mark.heavy  # starts a process
def test_init_writes_the_secure_config_metrics_and_a_model_store_and_keeps_edits(tmp_path):
    result = hfserve("init", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = (tmp_path / "config.properties").read_text()
    assert "disable_token_authorization=false" in config and "0.0.0.0" not in config
    assert "metrics_config=metrics.yaml" in config and (tmp_path / "metrics.yaml").is_file()
    assert "vmargs=-Dlog4j.configurationFile=log4j2.xml" in config and (tmp_path / "log4j2.xml").is_file()
    assert (tmp_path / "model_store").is_dir()
    (tmp_path / "config.properties").write_text(config + "job_queue_size=7\n")
    assert_one_line_error(hfserve("init", cwd=tmp_path), "pass --force to overwrite")
    assert (tmp_path / "config.properties").read_text().endswith("job_queue_size=7\n")


@pytest.mark.heavy  # starts a process
def test_the_repository_config_is_what_init_writes_but_for_where_the_metrics_file_is(tmp_path):
    assert hfserve("init", cwd=tmp_path).returncode == 0
    root = Path(__file__).resolve().parents[2]
    written = (tmp_path / "config.properties").read_text()
    assert (root / "config.properties").read_text() == written.replace(
        "metrics_config=metrics.yaml", "metrics_config=handlers/servers/torchserve/metrics.yaml"
    ).replace("configurationFile=log4j2.xml", "configurationFile=handlers/servers/torchserve/log4j2.xml")


@pytest.mark.heavy  # starts a process
def test_start_runs_a_copy_of_the_folder_config_with_its_metrics_file_else_the_package_ones(tmp_path):
    from ts_compiled_handlers.scripts.serve import DEFAULT_PORTS, LOG_CONFIG, METRICS, TEMPLATE, render_config

    assert hfserve("init", cwd=tmp_path).returncode == 0
    rendered = render_config(tmp_path / "model_store", DEFAULT_PORTS, tmp_path / "config.properties")
    assert f"metrics_config={tmp_path / 'metrics.yaml'}" in rendered
    assert f"vmargs=-Dlog4j.configurationFile={tmp_path / 'log4j2.xml'}" in rendered  # TorchServe runs elsewhere
    assert f"vmargs=-Dlog4j.configurationFile={LOG_CONFIG}" in render_config(tmp_path / "store", DEFAULT_PORTS)
    assert f"model_store={tmp_path / 'model_store'}" in rendered
    (tmp_path / "metrics.yaml").unlink()
    rendered = render_config(tmp_path / "model_store", DEFAULT_PORTS, tmp_path / "config.properties")
    assert f"metrics_config={METRICS}" in rendered
    assert f"metrics_config={METRICS}" in render_config(tmp_path / "model_store", DEFAULT_PORTS)  # TEMPLATE's
    assert TEMPLATE.parent == METRICS.parent


@pytest.mark.heavy  # starts a process
def test_start_serves_the_model_store_its_config_names(tmp_path):
    from ts_compiled_handlers.scripts.serve import TEMPLATE, model_store_of

    assert hfserve("init", "--model-store", "archives", cwd=tmp_path).returncode == 0
    assert model_store_of(tmp_path / "config.properties") == tmp_path / "archives"
    assert model_store_of(TEMPLATE) == Path("model_store")  # the package's own config: ./model_store


def test_start_keeps_the_addresses_its_config_sets_and_bind_moves_inference_alone(tmp_path):
    from ts_compiled_handlers.scripts.serve import DEFAULT_PORTS, TEMPLATE, parse_args, read_setting, render_config

    config = tmp_path / "config.properties"
    text = TEMPLATE.read_text()
    for api, host in (("inference", "0.0.0.0"), ("metrics", "0.0.0.0"), ("management", "127.0.0.1")):
        text = "\n".join(
            f"{api}_address=https://{host}:9999" if line.startswith(f"{api}_address=") else line
            for line in text.splitlines()
        )
    config.write_text(text)
    ports = {**DEFAULT_PORTS, "INFERENCE_PORT": 18080, "METRICS_PORT": 18082}
    kept = render_config(tmp_path / "model_store", ports, config)
    assert read_setting(kept, "inference_address") == "https://0.0.0.0:18080"
    assert read_setting(kept, "metrics_address") == "https://0.0.0.0:18082"
    assert read_setting(kept, "management_address") == f"https://127.0.0.1:{DEFAULT_PORTS['MANAGEMENT_PORT']}"
    moved = render_config(tmp_path / "model_store", ports, config, bind="127.0.0.1")
    assert read_setting(moved, "inference_address") == "https://127.0.0.1:18080"
    assert read_setting(moved, "metrics_address") == "https://0.0.0.0:18082"  # the config's: --bind never moves it
    metrics = render_config(tmp_path / "model_store", ports, config, metrics_bind="127.0.0.1")
    assert read_setting(metrics, "metrics_address") == "https://127.0.0.1:18082"
    assert read_setting(metrics, "inference_address") == "https://0.0.0.0:18080"
    published = render_config(tmp_path / "store", ports, bind="0.0.0.0")  # the package's config
    assert read_setting(published, "inference_address") == "http://0.0.0.0:18080"
    assert read_setting(published, "metrics_address") == "http://127.0.0.1:18082"
    args = parse_args(["start", "--bind", "0.0.0.0", "--metrics-bind", "10.0.0.5"])
    assert (args.bind, args.metrics_bind) == ("0.0.0.0", "10.0.0.5")
    assert read_setting(render_config(tmp_path / "store", ports), "inference_address") == "http://127.0.0.1:18080"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["describe", "m"], ("m", None)),
        (["describe", "--name", "m", "2.0"], ("m", "2.0")),
        (["unregister", "--model-name", "m"], ("m", None)),
        (["scale", "--model-name", "m", "--workers", "2"], ("m", None)),
        (["set-default", "--name", "m", "2.0"], ("m", "2.0")),
    ],
)
def test_management_commands_take_the_name_as_build_does(argv, expected):
    from ts_compiled_handlers.scripts.serve import parse_args

    args = parse_args(argv)
    assert (args.name, args.version) == expected
