"""What `hfserve` writes and reads for a server (scripts/serve.py), without starting one: a working
directory no other user can look into (TorchServe writes key_file.json there readable by all, then
makes it 0600), a warning for a key file open to others, and the image's config with the keyless
metrics API kept on loopback."""

import json
import stat

from ts_compiled_handlers.scripts import serve
from ts_compiled_handlers.scripts.serve import DEFAULT_PORTS, TorchServe, init, parse_args, read_setting


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_working_directory_is_made_0700_or_narrowed_to_it(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(serve.subprocess, "run", lambda command, **_: ran.append(command))
    fresh = TorchServe(tmp_path / "runs" / "server", tmp_path / "store")
    fresh.run("--stop")
    assert mode(fresh.workdir) == 0o700 and ran[-1][-1] == "--stop"
    opened = tmp_path / "opened"
    opened.mkdir()
    opened.chmod(0o755)
    TorchServe(opened, tmp_path / "store").run("--stop")
    assert mode(opened) == 0o700


def test_a_key_file_that_others_may_read_is_warned_about(tmp_path, capsys):
    (tmp_path / "ports.json").write_text(json.dumps({"ports": DEFAULT_PORTS, "model_store": str(tmp_path)}))
    key_file = tmp_path / "key_file.json"
    TorchServe.attach(tmp_path)  # no key file (token authorization off): nothing to say
    assert capsys.readouterr().err == ""
    key_file.write_text("{}")
    key_file.chmod(0o644)
    TorchServe.attach(tmp_path)
    warning = capsys.readouterr().err
    assert "WARNING" in warning and "(mode 0644)" in warning and f"chmod 600 {key_file}" in warning
    key_file.chmod(0o600)
    TorchServe.attach(tmp_path)
    assert capsys.readouterr().err == ""


def test_init_publishes_inference_and_keeps_the_keyless_metrics_on_loopback_as_the_image_does(tmp_path):
    image = tmp_path / "image"
    image.mkdir()
    assert parse_args(["init", "--bind", "0.0.0.0"]).metrics_bind == "127.0.0.1"
    serve.main(["init", str(image), "--bind", "0.0.0.0", "--model-store", "model-store"])  # --bind alone
    text = (image / "config.properties").read_text()
    assert read_setting(text, "inference_address") == "http://0.0.0.0:8080"
    assert read_setting(text, "metrics_address") == "http://127.0.0.1:8082"
    assert read_setting(text, "management_address") == "http://127.0.0.1:8081"
    assert read_setting(text, "disable_token_authorization") == "false"
    assert "# Inference on 0.0.0.0, metrics on 127.0.0.1; management and gRPC on loopback only;" in text
    both = tmp_path / "both"
    both.mkdir()
    init(both, bind="0.0.0.0", metrics_bind="0.0.0.0")  # asked for by name
    text = (both / "config.properties").read_text()
    assert read_setting(text, "metrics_address") == "http://0.0.0.0:8082"
    assert "# Inference and metrics on 0.0.0.0; management and gRPC on loopback only;" in text
