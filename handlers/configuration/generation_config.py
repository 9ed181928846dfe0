"""The `generation:` section of the handler's configuration (text-generation only): what a request
may ask for and how the decode loop paces it."""

import dataclasses

from ts_compiled_handlers.configuration import config_values as values
from ts_compiled_handlers.configuration.config_values import option as _option


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """text-generation only."""

    max_new_tokens: int = _option(
        values.positive_int,
        64,
        meaning="text-generation: the most tokens a request may ask for; sizes the static KV cache",
        why="the cache is allocated per batch bucket: bigger costs memory for every request",
    )
    default_new_tokens: int | None = _option(
        values.positive_int,
        None,
        shown="min(20, `max_new_tokens`)",
        meaning="text-generation: tokens when a request does not say",
        why="short enough that a request without a budget cannot hold its batch for long",
    )
    max_stop_strings: int = _option(
        values.positive_int,
        8,
        meaning="text-generation: stop strings per request",
        why="each is checked after every token",
    )
    steps_per_call: int = _option(
        values.positive_int,
        8,
        meaning="continuous batching (`continuousBatching: true`, handlers/loops/decode_loop.py): the most decode "
        "steps per handler call (each call is a frontend round trip; a call ends early after a step in which a prompt "
        "finished)",
        why="see [Generation](performance.md#generation)",
    )
    max_request_seconds: int = _option(
        values.positive_int,
        300,
        meaning='continuous batching: a request running longer ends with `finish_reason: "time"`',
        why="TorchServe's `responseTimeout` bounds one call, not a request",
    )
