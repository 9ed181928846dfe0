"""TorchServe's messages to its Python worker, parsed from memory instead of one `recv` per field.

TorchServe 0.12's reader (ts/protocol/otf_message_handler.py) calls `recv` for every length and
every field it reads: about fifty system calls for a request with eight HTTP headers, each one
letting the GIL go and taking it back. This reader takes what the socket holds in one `recv` (and
more only when a frame is longer) and walks the frames in memory. It returns what TorchServe's
returns, value for value and type for type (tests/unit/test_ts_messages.py holds the two to it), so
`Service.predict` and any handler see no difference. The adapter (handlers/servers/torchserve/adapter.py,
`read_messages_from_memory`) puts it in place of TorchServe's reader, only in a worker whose loops
still use TorchServe's own, of the release whose frames it knows (0.12).

One difference, for a batch's memory: a JSON or text body longer than `DECODED_IN_BATCH` goes on
as its bytes, as TorchServe's reader forwards a body it cannot decode (and every body under
`TS_DECODE_INPUT_REQUEST=false`); the handler reads it in its own request's turn.
"""

import json
import logging
import os
import struct
import sys
import weakref

LOAD = b"L"
PREDICT = b"I"
END = -1  # a list's end, where a length would be
INT = struct.Struct("!i")
RECV_SIZE = 1 << 16
# The longest JSON or text body decoded here, with its whole batch. JSON costs up to ~21 times its
# bytes in Python objects (`[[],[],...]`: 632 KB made 13 MB), so a batch of 32 hostile 6.5 MB bodies
# decoded together came to ~4.4 GB; the handlers read a longer body from its bytes in its own
# request's turn (protocols.body_value), one at a time, each refused or answered on its own. At this
# size a batch of 32 decodes to 45 MB at most; ordinary bodies are far smaller.
DECODED_IN_BATCH = 64 << 10


class FrameReader:
    """One socket's messages. Bytes received past a message stay for the next one, so every read of
    the socket after the first must go through this reader (TorchServe's worker reads it in one place)."""

    def __init__(self, conn):
        self.conn = conn
        self.data = bytearray()
        self.at = 0  # where the unread bytes of `data` start

    def message(self) -> tuple[bytearray, object]:
        """`(command, message)`, as TorchServe's `retrieve_msg` returns them."""
        command = self.take(1)
        if command == PREDICT:
            return command, self.requests()
        if command == LOAD:
            return command, self.load()
        raise ValueError("Invalid command: {}".format(command))

    # -- the frames -------------------------------------------------------------------------------
    def load(self) -> dict:
        message = {"modelName": self.field(), "modelPath": self.field(), "batchSize": self.int()}
        message["handler"] = self.field()
        gpu = self.int()
        if gpu >= 0:
            message["gpu"] = gpu
        message["envelope"] = self.field()
        message["limitMaxImagePixels"] = struct.unpack("!?", self.take(1))[0]
        return message

    def requests(self) -> list[dict]:
        decode = os.environ.get("TS_DECODE_INPUT_REQUEST") in (None, "true")
        batch = []
        while (length := self.int()) != END:
            request = {"requestId": self.take(length), "headers": [], "parameters": []}
            while (length := self.int()) != END:
                request["headers"].append({"name": self.take(length), "value": self.field()})
            while (length := self.int()) != END:
                name = self.take(length).decode("utf-8")
                content_type = self.field().decode("utf-8")
                value = self.field()
                request["parameters"].append(
                    {"name": name, "contentType": content_type, "value": decoded(value, content_type, decode)}
                )
            batch.append(request)
        return batch

    # -- bytes --------------------------------------------------------------------------------------
    def field(self) -> bytearray:
        return self.take(self.int())

    def int(self) -> int:
        self.fill(INT.size)
        (value,) = INT.unpack_from(self.data, self.at)
        self.at += INT.size
        return value

    def take(self, size: int) -> bytearray:
        size = max(size, 0)  # TorchServe reads a negative length as an empty field
        self.fill(size)
        taken = self.data[self.at : self.at + size]
        self.at += size
        return taken

    def fill(self, size: int) -> None:
        """At least `size` unread bytes in `data`; the frontend gone: the worker exits, as TorchServe's does."""
        if len(self.data) - self.at >= size:
            return
        del self.data[: self.at]
        self.at = 0
        while len(self.data) < size:
            chunk = self.conn.recv(max(RECV_SIZE, size - len(self.data)))
            if not chunk:
                logging.info("Frontend disconnected.")
                sys.exit(0)
            self.data += chunk


def decoded(value: bytearray, content_type: str, decode: bool):
    """A parameter's value as TorchServe hands it on: JSON parsed, text decoded, the rest as bytes;
    what fails to decode goes on as bytes, with TorchServe's warning. A body over `DECODED_IN_BATCH`
    goes on as bytes too, undecoded: its request reads it alone."""
    if not decode or len(value) > DECODED_IN_BATCH:
        return value
    if content_type == "application/json":
        try:
            return json.loads(value.decode("utf-8"))
        except Exception:
            logging.warning("Failed json decoding of input data. Forwarding encoded payload", exc_info=True)
    elif content_type.startswith("text"):
        try:
            return value.decode("utf-8")
        except Exception:
            logging.warning("Failed utf-8 decoding of input data. Forwarding encoded payload", exc_info=True)
    return value


_readers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def retrieve_msg(conn) -> tuple[bytearray, object]:
    """TorchServe's `retrieve_msg`, through the socket's own FrameReader."""
    reader = _readers.get(conn)
    if reader is None:
        reader = _readers[conn] = FrameReader(conn)
    return reader.message()
