"""The one workaround the async answers need: finding TorchServe's async out-queue
(handlers/servers/torchserve/async_worker.py).

`ts/async_service.py` offers no supported way to it; these tests run the real `AsyncService.call_predict`
and fail loudly when TorchServe's shape changes (a renamed attribute, another coroutine around
`predict`), instead of every async answer silently going out plain.
"""

import asyncio

import pytest
from ts.async_service import AsyncService

from ts_compiled_handlers.servers.torchserve import async_worker


class StandInService:
    """What AsyncService wraps: only `predict` is called by `call_predict`."""

    cl_socket = None


def test_the_out_queue_is_found_from_inside_the_real_call_predict():
    service = AsyncService(StandInService())
    found = []

    async def predict(batch):
        found.append(async_worker.out_queue())
        return "answer"

    service.service.predict = predict

    async def run():
        service.out_queue = asyncio.Queue()
        await asyncio.create_task(service.call_predict([]))  # a task of its own, as fetch_batches makes it
        return service.out_queue

    queue = asyncio.run(run())
    assert found == [queue], "ts/async_service.py changed: AsyncService.call_predict no longer holds out_queue"
    assert queue.get_nowait() == "answer"


def test_outside_the_async_worker_the_lookup_fails_with_a_message():
    async def elsewhere():
        return async_worker.out_queue()

    with pytest.raises(LookupError, match="AsyncService.call_predict"):
        asyncio.run(elsewhere())
