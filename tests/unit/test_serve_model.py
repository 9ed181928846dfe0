"""`hfserve serve`'s flags, read as TEI's and vLLM's names mean them (the command itself runs in
tests/integration/test_serve_command.py)."""

import socket

from ts_compiled_handlers.configuration.config import parse
from ts_compiled_handlers.scripts.serve import DEFAULT_PORTS, TEMPLATE, read_setting, render_config
from ts_compiled_handlers.scripts.serve_model import fingerprint, handler_settings, listeners, parse_args, ports_from


def test_the_flags_become_the_handlers_keys_and_only_those_given():
    assert handler_settings(parse_args(["m"])) == {}
    flags = ["m", "--dtype", "float32", "--max-batch-tokens", "2048", "--max-client-batch-size", "16"]
    settings = handler_settings(parse_args([*flags, "--no-auto-truncate"]))
    assert settings == {"dtype": "float32", "buckets": {"max_tokens": 2048, "overflow": "reject"}, "max_inputs": 16}
    parse({"handler": settings})  # the handler's own check takes them
    assert handler_settings(parse_args(["m", "--auto-truncate"])) == {"buckets": {"overflow": "truncate"}}
    assert handler_settings(parse_args(["m", "--quantize", "int8"])) == {"quantize": "int8"}
    assert parse_args(["m", "--model-name", "x"]).name == "x"


def test_management_and_metrics_take_the_next_ports_unless_given():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]  # free now; the next two are very likely free too
    ports = ports_from(parse_args(["m", "--port", str(base)]))
    assert [ports[key] for key in ("INFERENCE_PORT", "MANAGEMENT_PORT", "METRICS_PORT")] == [base, base + 1, base + 2]
    flags = ["--metrics-port", str(base + 1), "--management-port", "1"]
    given = ports_from(parse_args(["m", "--port", str(base), *flags]))
    assert (given["MANAGEMENT_PORT"], given["METRICS_PORT"]) == (1, base + 1)
    assert given["GRPC_INFERENCE_PORT"] != given["GRPC_MANAGEMENT_PORT"]


def test_hostname_moves_inference_alone_and_the_keyless_metrics_move_only_when_named(tmp_path):
    def addresses(*flags):
        config = render_config(tmp_path / "store", DEFAULT_PORTS, TEMPLATE, **listeners(parse_args(["m", *flags])))
        return [read_setting(config, f"{api}_address") for api in ("inference", "management", "metrics")]

    assert addresses() == ["http://127.0.0.1:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"]
    published = addresses("--hostname", "0.0.0.0")
    assert published == ["http://0.0.0.0:8080", "http://127.0.0.1:8081", "http://127.0.0.1:8082"]
    scraped = addresses("--hostname", "0.0.0.0", "--metrics-hostname", "10.0.0.5")
    assert scraped == ["http://0.0.0.0:8080", "http://127.0.0.1:8081", "http://10.0.0.5:8082"]


def test_the_archive_is_rebuilt_when_a_model_file_or_an_option_changes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    first = fingerprint(tmp_path, "embedding", {"handler": {}})
    assert fingerprint(tmp_path, "embedding", {"handler": {}}) == first
    assert fingerprint(tmp_path, "embedding", {"handler": {"dtype": "float32"}}) != first
    assert fingerprint(tmp_path, "text-classification", {"handler": {}}) != first
    (tmp_path / "config.json").write_text('{"changed": true}')
    assert fingerprint(tmp_path, "embedding", {"handler": {}}) != first
