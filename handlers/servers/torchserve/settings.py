"""TorchServe's own keys of an archive's model-config.yaml, read here and nowhere below: how the
frontend hands requests over (`asyncCommunication`: one at a time; `continuousBatching`: a decode
loop it drives), and how many workers share the host (`minWorkers`), as a worker's `Placement`."""

import dataclasses
from typing import Any

from ts_compiled_handlers.configuration.config import GENERATION, ConfigError
from ts_compiled_handlers.configuration.placement import Placement


def flag(yaml_config: dict, key: str) -> bool:
    value = yaml_config.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(key, value, "true | false")
    return value


def workers(yaml_config: dict) -> int:
    value = yaml_config.get("minWorkers", 1)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError("minWorkers", value, "an integer >= 1")
    return value


def check_async_batch_size(batch_size: Any) -> None:
    """TorchServe 0.12's AsyncBatchAggregator removes each job from the map it is iterating over, so
    a second request in one message throws ConcurrentModificationException and the worker dies."""
    if batch_size not in (None, 1):
        raise ConfigError("batchSize", batch_size, "1 with asyncCommunication (TorchServe 0.12 fails on more)")


def read(yaml_config: dict, task: str, batch_size: Any = None) -> dict:
    """Placement's `one_at_a_time`, `continuous` and `workers` as TorchServe's keys say them for
    `task`, checked (the build checks an archive's with this too); `batch_size`: a registration's."""
    continuous = flag(yaml_config, "continuousBatching")
    one_at_a_time = flag(yaml_config, "asyncCommunication")
    if continuous and task != GENERATION:
        raise ConfigError("continuousBatching", True, f"false for task {task}: only {GENERATION} runs a loop")
    if one_at_a_time and task == GENERATION:
        raise ConfigError("asyncCommunication", True, f"false for {GENERATION}: it runs continuousBatching")
    if one_at_a_time:
        check_async_batch_size(yaml_config.get("batchSize", 1))
        check_async_batch_size(batch_size)
    return {"one_at_a_time": one_at_a_time, "continuous": continuous, "workers": workers(yaml_config)}


def placed(placement: Placement, task: str) -> Placement:
    """`placement` with what TorchServe's keys say, checked against the task the handler serves."""
    return dataclasses.replace(placement, **read(placement.yaml_config, task, placement.batch_size))
