"""Test-only handler: a request whose text is `sleep <seconds>` holds its batch that long.

Lets the fault tests fill TorchServe's job queue and outlast responseTimeout; never part of the package.
"""

import time

from ts_compiled_handlers.servers.torchserve.handler import Handler


def requested_sleep(request: dict) -> float:
    body = request.get("body") if request.get("data") is None else request.get("data")
    text = body.get("inputs") if isinstance(body, dict) else None
    return float(text.split()[1]) if isinstance(text, str) and text.startswith("sleep ") else 0.0


class SlowEmbedding(Handler):
    def handle(self, data, context):
        time.sleep(sum(requested_sleep(request) for request in data))
        return super().handle(data, context)
