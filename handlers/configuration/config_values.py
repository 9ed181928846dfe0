"""The checks one model-config.yaml value passes (handlers/configuration/config.py names each key's),
and the error that names the key, the value and what is allowed."""

import dataclasses
import re
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from ts_compiled_handlers.request.image_urls import origin_of


class ConfigError(ValueError):
    """A model-config.yaml key with a value the handler cannot use."""

    def __init__(self, key: str, value: Any, allowed: str):
        super().__init__(f"model-config.yaml: {key}={value!r} is not valid; allowed: {allowed}")


def choice(*options: str) -> Callable[[Any, str], str]:
    def check(value, key):
        if value not in options:
            raise ConfigError(key, value, " | ".join(options))
        return value

    return check


def boolean(value, key) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true | false")
    return value


def auto_boolean(value, key) -> bool | None:
    if value == "auto":
        return None
    if not isinstance(value, bool):
        raise ConfigError(key, value, "auto | true | false")
    return value


def positive_int(value, key) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "an integer >= 1")
    return value


def non_negative_int(value, key) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(key, value, "an integer >= 0")
    return value


def threads(value, key) -> int | None:
    return None if value == "auto" else positive_int(value, key)


def tolerance(value, key) -> float | None:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(key, value, "auto | a number between 0 and 1")
    return float(value)


def fraction(value, key) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(key, value, "a number from 0 up to (not including) 1")
    return float(value)


def share(value, key) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigError(key, value, "a number above 0, up to 1")
    return float(value)


def sorted_ints(value, key) -> tuple[int, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(key, value, "a non-empty list of integers >= 1")
    items = tuple(positive_int(item, key) for item in value)
    if list(items) != sorted(set(items)):
        raise ConfigError(key, value, "integers in increasing order, without repeats")
    return items


def seq_lens(value, key) -> str | tuple[int, ...]:
    return value if value == "auto" else sorted_ints(value, key)


def auto_or_positive(value, key) -> str | int:
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "auto | an integer >= 1")
    return value


def pack_tokens(value, key) -> str | int:
    if value in ("auto", "off"):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, value, "auto | off | a token count >= 1")
    return value


def backend(value, key) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "a torch.compile backend name such as inductor")
    return value


def cache_dir(value, key) -> str:
    if value in ("auto", "off") or (isinstance(value, str) and value.startswith("/")):
        return value
    raise ConfigError(key, value, "auto | off | an absolute path")


def archive_file(value, key) -> str:
    if value == "default" or (
        isinstance(value, str) and value and not value.startswith("/") and ".." not in Path(value).parts
    ):
        return value
    raise ConfigError(key, value, "default | a file's path inside the archive")


def origins(value, key) -> tuple[str, ...]:
    """`scheme://host[:port]` each, http or https, nothing after the host: kept as `origin_of` writes them."""
    allowed = "a list of origins, each http(s)://host[:port] with no path"
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(key, value, allowed)
    written = tuple(origin_of(item) for item in value)
    parts = [urlsplit(item.strip()) for item in value]
    if None in written or any(part.path not in ("", "/") or part.query or part.fragment for part in parts):
        raise ConfigError(key, value, allowed)
    return written


def otlp_endpoint(value, key) -> str | None:
    """An OTLP/HTTP traces URL (`http(s)://host[:port]/path`, no credentials in it), or off."""
    if value is None or value == "off":
        return None
    if isinstance(value, str) and origin_of(value) is not None and not urlsplit(value.strip()).fragment:
        return value.strip()
    raise ConfigError(key, value, "off | an OTLP/HTTP URL such as http://127.0.0.1:4318/v1/traces")


def service_name(value, key) -> str:
    if isinstance(value, str) and value.strip() and value.isprintable() and len(value) <= 128:
        return value.strip()
    raise ConfigError(key, value, "a name of 1 to 128 printable characters")


def adapter_names(value, key) -> tuple[str, ...]:
    """Distinct names, each a letter or digit then up to 63 of letters, digits, `_`, `.`, `-`."""
    allowed = "a list of distinct names ([A-Za-z0-9][A-Za-z0-9_.-]{0,63}), each a folder under adapters/"
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value) or len(set(value)) != len(value):
        raise ConfigError(key, value, allowed)
    if not all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name) for name in value):
        raise ConfigError(key, value, allowed)
    return tuple(value)


def option(check: Callable[[Any, str], Any], default: Any, *, meaning: str, why: str, shown: str | None = None):
    """A `handler:` key: its check, its default, what it means and why that default (docs/configuration.md
    is generated from these). `shown`: how a default of None is written in model-config.yaml."""
    return dataclasses.field(default=default, metadata={"check": check, "meaning": meaning, "why": why, "shown": shown})
