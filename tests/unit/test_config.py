import pytest

from ts_compiled_handlers.configuration.config import BucketConfig, ConfigError, HandlerConfig, parse


def test_defaults_without_a_handler_section():
    config = parse({})
    assert config.task == "embedding"
    assert config.dtype == "auto"
    assert config.threads is None
    assert config.buckets == BucketConfig()
    assert config.compile.enable and config.compile.mode == "default"


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
        ({"handler": {"buckets": {"pack_attention": "flash"}}}, "handler.buckets.pack_attention", "'flash'"),
        ({"handler": {"compile": {"mode": "fastest"}}}, "handler.compile.mode", "'fastest'"),
        ({"handler": {"compile": {"fullgraph": "yes"}}}, "handler.compile.fullgraph", "'yes'"),
        ({"handler": {"compile": {"regional": 1}}}, "handler.compile.regional", "1"),
        ({"handler": {"compile": {"cache_dir": "cache"}}}, "handler.compile.cache_dir", "'cache'"),
        ({"handler": {"warmup": {"tolerance": 2}}}, "handler.warmup.tolerance", "2"),
        ({"handler": {"agreement": 0}}, "handler.agreement", "0"),
        ({"handler": {"agreement": 1.5}}, "handler.agreement", "1.5"),
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


def test_the_configuration_page_holds_exactly_the_generated_table():
    """Keys and defaults come from handlers/configuration/config.py: a changed default without a docs update fails."""
    from ts_compiled_handlers.scripts import config_table

    page = config_table.PAGE.read_text()
    generated = page.split(config_table.BEGIN + "\n", 1)[1].split(config_table.END, 1)[0]
    assert generated == config_table.configuration_table(), "run: python scripts/config_table.py --write"


def test_the_table_has_every_handler_key_with_its_dataclass_default():
    from ts_compiled_handlers.scripts import config_table

    rows = config_table.configuration_table().splitlines()[2:]
    documented = {row.split(" | ")[0].strip("| `"): row.split(" | ")[1] for row in rows}
    defaults = HandlerConfig()
    assert set(documented) == {
        "task", "dtype", "threads", "max_inputs", "max_response_bytes", "max_held_bytes", "cache_bytes", "adapters",
        "quantize",
        "smoothing", "agreement", "calibration",
        "buckets.seq_lens",
        "buckets.batch_sizes", "buckets.max_tokens", "buckets.overflow", "buckets.pack_tokens",
        "buckets.pack_attention",
        "buckets.histogram_every", "embedding.dimensions", "embedding.embed_all", "compile.enable", "compile.backend",
        "compile.mode", "compile.freezing",
        "compile.fullgraph", "compile.dynamic", "compile.regional", "compile.on_failure", "compile.cache_dir",
        "warmup.iterations", "warmup.verify", "warmup.tolerance", "generation.max_new_tokens",
        "images.fetch_from", "images.fetch_seconds", "images.max_urls", "images.max_images", "images.max_pixels",
        "images.max_scans", "images.request_pixels", "images.request_bytes", "images.batch_images",
        "generation.default_new_tokens", "generation.max_stop_strings", "generation.steps_per_call",
        "generation.max_request_seconds", "scheduler.call_tokens", "scheduler.max_queue", "scheduler.fill_ms",
        "tracing.endpoint", "tracing.service_name", "tracing.sample_ratio",
    }  # fmt: skip
    assert documented["buckets.seq_lens"] == f"`{defaults.buckets.seq_lens}`" == "`auto`"
    assert documented["compile.enable"] == "`true`" and documented["threads"] == "`auto`"
    assert documented["compile.freezing"] == "`auto`" and documented["tracing.endpoint"] == "`off`"
    assert documented["generation.max_new_tokens"] == f"`{defaults.generation.max_new_tokens}`"


def test_torchserves_own_keys_are_left_to_its_room():
    """`handler:` is ours under any server; TorchServe's loop keys are read by its adapter
    (handlers/servers/torchserve/settings.py, tests/unit/test_placement.py), never here."""
    assert parse({"continuousBatching": "yes", "asyncCommunication": 3, "minWorkers": 0}) == parse({})


@pytest.mark.parametrize(("value", "parsed"), [("auto", None), (True, True), (False, False)])
def test_freezing_is_auto_or_a_boolean(value, parsed):
    assert parse({"handler": {"compile": {"freezing": value}}}).compile.freezing is parsed


def test_freezing_refuses_anything_else():
    with pytest.raises(ConfigError, match="auto | true | false"):
        parse({"handler": {"compile": {"freezing": "yes"}}})
