"""Where a worker sits, as its server says it in plain values, and the loop that follows from it.

Each server reads its own settings (TorchServe's model-config.yaml keys in
handlers/servers/torchserve/settings.py, a Ray replica's own choice in handlers/servers/ray/serve.py)
and states them here; `loop_of` decides the loop once for both, and handlers/loops/start.py starts it.
"""

import dataclasses
import enum
from pathlib import Path

from ts_compiled_handlers.configuration.config import GENERATION


class Loop(enum.Enum):
    """The loop that serves a worker's requests (handlers/loops/)."""

    REQUEST_BATCHES = "request batches"  # the server hands over batches; one call per batch
    GENERATION_BATCHES = "generation batches"  # generation in batches: a batch decodes to its end
    SCHEDULED = "scheduled requests"  # requests one at a time, packed into calls by tokens
    DECODE_LOOP = "decode loop"  # generation: requests join and leave a running decode loop


@dataclasses.dataclass(frozen=True)
class Placement:
    """What a server tells a worker about itself, in plain values (TorchServe's context, a Ray
    replica's arguments). `one_at_a_time`: the server hands requests over as they come rather than
    in batches; `continuous`: generation runs as a decode loop; `workers`: this model's workers on
    the host, who share its cores."""

    model_dir: Path
    model_name: str
    yaml_config: dict  # the archive's model-config.yaml; the worker reads its `handler:` section
    model_version: str | None = None
    batch_size: int | None = None  # as registered; None where the server does not batch requests
    gpu_id: int | None = None
    one_at_a_time: bool = False
    continuous: bool = False
    workers: int = 1


class LoopError(ValueError):
    """A server's settings that no loop serves for the task."""


def loop_of(task: str, placement: Placement) -> Loop:
    """The one loop for `task` where `placement` sits."""
    if task != GENERATION:
        if placement.continuous:
            raise LoopError(f"only {GENERATION} runs a decode loop, not {task}")
        return Loop.SCHEDULED if placement.one_at_a_time else Loop.REQUEST_BATCHES
    if placement.continuous:
        return Loop.DECODE_LOOP
    if placement.one_at_a_time:
        raise LoopError(f"{GENERATION} takes requests one at a time only in its decode loop")
    return Loop.GENERATION_BATCHES
