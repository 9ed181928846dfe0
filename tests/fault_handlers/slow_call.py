"""Test-only handler: a model call over a text `sleep <seconds>` takes that long.

Under `asyncCommunication: true` the call runs in the model's own thread, so requests arriving
meanwhile pile up in its queue: the back-pressure test fills it. Never part of the package.
"""

import time

from ts_compiled_handlers.servers.torchserve.handler import Handler
from ts_compiled_handlers.worker.worker import Worker


def requested_sleep(text: str) -> float:
    return float(text.split()[1]) if text.startswith("sleep ") else 0.0


class SlowCallEmbedding(Handler):
    class worker_class(Worker):  # nested: a handler file defines exactly one class
        def run(self, requests):
            time.sleep(sum(requested_sleep(text) for request in requests for text in request.request.texts))
            return super().run(requests)
