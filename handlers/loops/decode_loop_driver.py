"""Continuous batching where a server hands requests over one at a time (a Ray Serve replica).

TorchServe's frontend drives the decode loop (handlers/loops/decode_loop.py) itself: it calls the worker
again and again with the requests it holds, new ones with their bodies, running ones resent. Here
that driver is a task on the server's event loop: while any request is open it calls
`DecodeLoop.call` in the model thread with every open request (a new one's `Incoming` once, then
`None`), and hands each reply to its request's queue. A request whose client left is simply not
sent again, and the loop frees its slots, as it does under TorchServe.
"""

import asyncio
import itertools
from typing import AsyncIterator

from ts_compiled_handlers.configuration.placement import Loop
from ts_compiled_handlers.loops.decode_loop import DecodeLoop
from ts_compiled_handlers.loops.model_thread import ModelThread
from ts_compiled_handlers.request.outcome import refusal
from ts_compiled_handlers.runtime.json_text import as_json
from ts_compiled_handlers.worker.messages import Incoming, Reply


class ContinuousRequests:
    """Requests one at a time into a worker's decode loop; `serve` yields each one's replies."""

    kind = Loop.DECODE_LOOP
    full = False  # the decode loop takes every request; those beyond its slots wait for one

    def __init__(self, decode_loop: DecodeLoop, model_thread: ModelThread):
        self.decode_loop = decode_loop
        self.model_thread = model_thread
        self.ids = (str(number) for number in itertools.count())
        self.open: dict[str, asyncio.Queue] = {}  # request id: its replies, in order
        self.arrived: dict[str, Incoming] = {}  # requests not yet handed to the loop
        self.routes: dict[str, str] = {}  # each open request's route: its refusal takes its protocol's shape
        self.driver: asyncio.Task | None = None

    async def serve(self, incoming: Incoming) -> AsyncIterator[Reply]:
        """The request's replies: chunks with `last` False, then one with `last` True; or one plain
        reply (`last` None: a refusal, or an answer without the model). Never raises."""
        request_id = next(self.ids)
        replies = self.open[request_id] = asyncio.Queue()
        self.arrived[request_id] = incoming
        self.routes[request_id] = incoming.route
        if self.driver is None or self.driver.done():
            self.driver = asyncio.get_running_loop().create_task(self.drive())
        try:
            while True:
                reply = await replies.get()
                yield reply
                if reply.last is not False:
                    return
        finally:  # done, or the client left: no longer sent to the loop
            self.open.pop(request_id, None)
            self.arrived.pop(request_id, None)
            self.routes.pop(request_id, None)

    async def drive(self) -> None:
        """Call the loop while requests are open; each call's replies to their requests. A defect of
        the driver itself still ends every open request (a plain 500), so none waits forever."""
        try:
            await self.drive_calls()
        except Exception as error:
            failed = refusal(error, "the decode loop's driver")
            for queue in self.open.values():
                queue.put_nowait(Reply(as_json(failed.body()), failed.status))
            self.open.clear()

    async def drive_calls(self) -> None:
        loop = asyncio.get_running_loop()
        while self.open:
            requests = [(request_id, self.arrived.pop(request_id, None)) for request_id in list(self.open)]
            try:
                replies = await loop.run_in_executor(self.model_thread.executor, self.decode_loop.call, requests)
            except Exception as error:  # a defect past the loop's own boundaries: end every open request
                worker = self.decode_loop.worker
                replies = [
                    worker.refused(self.routes.get(request_id, ""), error, "inference") for request_id, _ in requests
                ]
            for (request_id, _), reply in zip(requests, replies, strict=True):
                queue = self.open.get(request_id)
                if queue is None:
                    continue
                if reply.last is not False:  # its last: never sent to the loop again
                    self.open.pop(request_id)
                queue.put_nowait(reply)
