import pytest

from handlers.config import BucketConfig, ConfigError, parse


def test_defaults_without_a_handler_section():
    config = parse({})
    assert config.task == "embedding"
    assert config.dtype == "auto"
    assert config.threads is None
    assert config.buckets == BucketConfig()
    assert config.compile.enable and config.compile.mode == "default"
    assert config.workers == 1


def test_pt2_compile_section_is_honoured_and_handler_compile_wins():
    config = parse(
        {
            "minWorkers": 2,
            "pt2": {"compile": {"enable": True, "backend": "inductor", "mode": "max-autotune", "dynamic": False}},
            "handler": {"compile": {"mode": "reduce-overhead"}},
        }
    )
    assert config.compile.mode == "reduce-overhead"
    assert config.compile.dynamic == "none"
    assert config.workers == 2


def test_pt2_compile_can_turn_compilation_off():
    assert parse({"pt2": {"compile": {"enable": False}}}).compile.enable is False


@pytest.mark.parametrize(
    "yaml_config, key, value",
    [
        ({"handler": {"colour": "red"}}, "handler.colour", "'red'"),
        ({"handler": {"dtype": "float8"}}, "handler.dtype", "'float8'"),
        ({"handler": {"threads": 0}}, "handler.threads", "0"),
        ({"handler": {"buckets": {"seq_lens": [64, 32]}}}, "handler.buckets.seq_lens", "[64, 32]"),
        ({"handler": {"buckets": {"overflow": "drop"}}}, "handler.buckets.overflow", "'drop'"),
        ({"handler": {"buckets": {"pack_tokens": "on"}}}, "handler.buckets.pack_tokens", "'on'"),
        ({"handler": {"buckets": {"pack_tokens": 0}}}, "handler.buckets.pack_tokens", "0"),
        ({"handler": {"compile": {"mode": "fastest"}}}, "handler.compile.mode", "'fastest'"),
        ({"handler": {"compile": {"fullgraph": "yes"}}}, "handler.compile.fullgraph", "'yes'"),
        ({"handler": {"compile": {"regional": 1}}}, "handler.compile.regional", "1"),
        ({"handler": {"compile": {"cache_dir": "cache"}}}, "handler.compile.cache_dir", "'cache'"),
        ({"handler": {"warmup": {"tolerance": 2}}}, "handler.warmup.tolerance", "2"),
        ({"pt2": {"compile": {"options": {}}}}, "pt2.compile.options", "{}"),
        ({"handler": {"compile": "on"}}, "handler.compile", "'on'"),
    ],
)
def test_bad_keys_and_values_name_key_value_and_allowed(yaml_config, key, value):
    with pytest.raises(ConfigError) as error:
        parse(yaml_config)
    message = str(error.value)
    assert f"{key}={value}" in message
    assert "allowed:" in message


def test_unknown_key_lists_the_allowed_keys():
    with pytest.raises(ConfigError, match="task, dtype, threads"):
        parse({"handler": {"workers": 3}})


def test_config_is_frozen():
    config = parse({})
    with pytest.raises(AttributeError):
        config.dtype = "float32"


def documented_keys() -> set[str]:
    """Keys in the first column of the README's configuration table (`a.b` / `c` means a.b and a.c)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("| key | default |") : readme.index("TorchServe's own `pt2: compile:`")]
    keys = set()
    for row in [line for line in table.splitlines() if line.startswith("| `")]:
        prefix = ""
        for name in re.findall(r"`([\w.]+)`", row.split("|")[1]):
            prefix = name.rsplit(".", 1)[0] + "." if "." in name else prefix
            keys.add(name if "." in name else prefix + name)
    return keys


def test_every_handler_key_is_in_the_readme_configuration_table():
    import dataclasses

    from handlers.config import HandlerConfig

    def keys(cls, prefix=""):
        for field in dataclasses.fields(cls):
            if field.metadata.get("internal"):
                continue
            if dataclasses.is_dataclass(field.default):
                yield from keys(type(field.default), f"{prefix}{field.name}.")
            else:
                yield prefix + field.name

    assert set(keys(HandlerConfig)) == documented_keys()


def test_continuous_batching_is_for_generation_only():
    with pytest.raises(ConfigError, match="continuousBatching"):
        parse({"continuousBatching": True, "handler": {"task": "embedding"}})
    assert parse({"continuousBatching": True, "handler": {"task": "text-generation"}}).task == "text-generation"
