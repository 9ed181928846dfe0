"""The handler's configuration: one frozen, typed record parsed from model-config.yaml.

TorchServe hands the handler the whole yaml as `context.model_yaml_config`. Its own keys
(`minWorkers`, `batchSize`, ...) stay where TorchServe reads them; the standard `pt2: compile:`
section is honoured; everything of ours lives under `handler:`. Unknown keys and bad values raise
`ConfigError` naming the key, the value and what is allowed, so `initialize` fails loudly.
"""

import dataclasses
from typing import Any, Callable

TASKS = ("embedding", "text-classification", "token-classification", "text-generation")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Which tensor dimensions the compiled graphs treat as dynamic; see README "Shape strategy".
DYNAMIC = ("none", "batch", "all")
OVERFLOW = ("truncate", "reject")
ON_FAILURE = ("eager", "fail")
PT2_COMPILE_KEYS = ("enable", "backend", "mode", "fullgraph", "dynamic")


class ConfigError(ValueError):
    """A model-config.yaml key with a value the handler cannot use."""

    def __init__(self, key: str, value: Any, allowed: str):
        super().__init__(f"model-config.yaml: {key}={value!r} is not valid; allowed: {allowed}")


def _choice(*options: str) -> Callable[[Any, str], str]:
    def check(value, key):
        if value not in options:
            raise ConfigError(key, value, " | ".join(options))
        return value

    return check


def _boolean(value, key) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true | false")
    return value


def _positive_int(value, key) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "an integer >= 1")
    return value


def _threads(value, key) -> int | None:
    return None if value == "auto" else _positive_int(value, key)


def _tolerance(value, key) -> float | None:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(key, value, "auto | a number between 0 and 1")
    return float(value)


def _sorted_ints(value, key) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(key, value, "a non-empty list of integers >= 1")
    items = tuple(_positive_int(item, key) for item in value)
    if list(items) != sorted(set(items)):
        raise ConfigError(key, value, "integers in increasing order, without repeats")
    return items


def _pack_tokens(value, key) -> str | int:
    if value in ("auto", "off"):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "auto | off | a token count >= 1")
    return value


def _backend(value, key) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "a torch.compile backend name such as inductor")
    return value


def _cache_dir(value, key) -> str:
    if value in ("auto", "off") or (isinstance(value, str) and value.startswith("/")):
        return value
    raise ConfigError(key, value, "auto | off | an absolute path")


def _option(check: Callable[[Any, str], Any], default: Any):
    return dataclasses.field(default=default, metadata={"check": check})


@dataclasses.dataclass(frozen=True)
class BucketConfig:
    seq_lens: tuple[int, ...] = _option(_sorted_ints, (16, 32, 64, 128, 256))
    batch_sizes: tuple[int, ...] = _option(_sorted_ints, (1, 2, 4, 8))
    overflow: str = _option(_choice(*OVERFLOW), "truncate")
    # Encoder tasks: texts packed end to end into rows of at most this many tokens (handlers/packing.py);
    # auto: the largest length bucket, at most packing.AUTO_BUDGET; off: length groups.
    pack_tokens: str | int = _option(_pack_tokens, "auto")
    # The histogram of live token lengths is logged every this many texts (for plan_buckets.py).
    histogram_every: int = _option(_positive_int, 1000)


@dataclasses.dataclass(frozen=True)
class CompileConfig:
    enable: bool = _option(_boolean, True)
    backend: str = _option(_backend, "inductor")
    mode: str = _option(_choice(*MODES), "default")
    fullgraph: bool = _option(_boolean, False)
    dynamic: str = _option(_choice(*DYNAMIC), "all")
    regional: bool = _option(_boolean, False)
    on_failure: str = _option(_choice(*ON_FAILURE), "eager")
    # Where workers share compiled kernels (see compile_cache.py); off leaves inductor's default.
    cache_dir: str = _option(_cache_dir, "auto")


@dataclasses.dataclass(frozen=True)
class WarmupConfig:
    iterations: int = _option(_positive_int, 2)
    verify: bool = _option(_boolean, True)
    tolerance: float | None = _option(_tolerance, None)


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """text-generation only. `max_new_tokens` caps requests and sizes the static KV cache."""

    max_new_tokens: int = _option(_positive_int, 64)
    default_new_tokens: int | None = _option(_positive_int, None)  # None: min(20, max_new_tokens)
    max_stop_strings: int = _option(_positive_int, 8)
    # Continuous batching (`continuousBatching: true`, handlers/continuous.py): decode steps per
    # handler call (each call is a frontend round trip), and how long a request may run in all.
    steps_per_call: int = _option(_positive_int, 8)
    max_request_seconds: int = _option(_positive_int, 300)


def _nested(cls):
    return lambda value, key: _parse_section(cls, value, key)


@dataclasses.dataclass(frozen=True)
class HandlerConfig:
    task: str = _option(_choice(*TASKS), "embedding")
    dtype: str = _option(_choice(*DTYPES), "auto")
    threads: int | None = _option(_threads, None)
    max_inputs: int = _option(_positive_int, 64)
    buckets: BucketConfig = _option(_nested(BucketConfig), BucketConfig())
    compile: CompileConfig = _option(_nested(CompileConfig), CompileConfig())
    warmup: WarmupConfig = _option(_nested(WarmupConfig), WarmupConfig())
    generation: GenerationConfig = _option(_nested(GenerationConfig), GenerationConfig())
    # Not a `handler:` key: TorchServe's minWorkers, used to share the cores between workers.
    workers: int = dataclasses.field(default=1, metadata={"internal": True})


def _parse_section(cls, raw: Any, key: str):
    if raw is None:
        raw = {}
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    if not isinstance(raw, dict):
        raise ConfigError(key, raw, f"a mapping with keys {', '.join(fields)}")
    for name in raw:
        if name not in fields:
            raise ConfigError(f"{key}.{name}", raw[name], f"one of the keys {', '.join(fields)}")
    values = {name: fields[name].metadata["check"](value, f"{key}.{name}") for name, value in raw.items()}
    return cls(**values)


def _pt2_compile(yaml_config: dict) -> dict:
    """TorchServe's `pt2: compile:` section as keys of our `compile:` section."""
    pt2 = yaml_config.get("pt2")
    if pt2 is None:
        return {}
    section = pt2.get("compile") if isinstance(pt2, dict) else None
    if not isinstance(section, dict):
        raise ConfigError("pt2", pt2, "a mapping with a compile: section")
    for name, value in section.items():
        if name not in PT2_COMPILE_KEYS:
            raise ConfigError(f"pt2.compile.{name}", value, f"one of the keys {', '.join(PT2_COMPILE_KEYS)}")
    merged = dict(section)
    if "dynamic" in merged:
        merged["dynamic"] = "all" if _boolean(merged["dynamic"], "pt2.compile.dynamic") else "none"
    return merged


def parse(yaml_config: dict | None) -> HandlerConfig:
    """The HandlerConfig for a model-config.yaml; `handler.compile` wins over `pt2.compile`."""
    yaml_config = yaml_config or {}
    handler = yaml_config.get("handler") or {}
    if not isinstance(handler, dict):
        raise ConfigError("handler", handler, "a mapping")
    own_compile = handler.get("compile") or {}
    if isinstance(own_compile, dict):
        own_compile = {**_pt2_compile(yaml_config), **own_compile}
    config = _parse_section(HandlerConfig, {**handler, "compile": own_compile}, "handler")
    if (config.generation.default_new_tokens or 0) > config.generation.max_new_tokens:
        raise ConfigError(
            "handler.generation.default_new_tokens",
            config.generation.default_new_tokens,
            f"at most generation.max_new_tokens ({config.generation.max_new_tokens})",
        )
    if yaml_config.get("continuousBatching") and config.task != "text-generation":
        raise ConfigError("continuousBatching", True, f"false for task {config.task}: only text-generation runs a loop")
    workers = _positive_int(yaml_config.get("minWorkers", 1), "minWorkers")
    return dataclasses.replace(config, workers=workers)
