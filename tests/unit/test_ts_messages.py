"""The worker's message reader gives what TorchServe's gives, value for value and type for type,
however the frontend's bytes arrive; the adapter puts it in TorchServe's place only in TorchServe's
worker."""

import itertools
import json
import random
import socket
import struct
import sys
import threading
import types

import pytest
from ts.protocol import otf_message_handler

from ts_compiled_handlers.servers.torchserve import adapter, messages


def sized(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def request_frame(rng: random.Random, index: int) -> bytes:
    """One request as TorchServe's frontend encodes it: id, headers, parameters."""
    frame = sized(f"request-{index}-{rng.randrange(10**9)}".encode())
    for number in range(rng.randrange(0, 9)):
        frame += sized(f"header-{number}".encode()) + sized(rng.choice([b"", b"keep-alive", "caf\u00e9".encode()]))
    frame += struct.pack("!i", -1)
    parameters = [
        ("body", "application/json", json.dumps({"inputs": ["a text", "caf\u00e9"], "n": 1.5}).encode()),
        ("body", "application/json", b"{not json"),
        ("data", "text/plain", "na\u00efve".encode()),
        ("data", "text/plain; charset=utf-8", b"\xff\xfe not utf-8"),
        ("data", "application/octet-stream", bytes(rng.randrange(256) for _ in range(40))),
        ("url_path", "", b""),
    ]
    for name, content_type, value in rng.sample(parameters, rng.randrange(0, len(parameters) + 1)):
        frame += sized(name.encode()) + sized(content_type.encode()) + sized(value)
    return frame + struct.pack("!i", -1)


def inference_message(rng: random.Random) -> bytes:
    return b"I" + b"".join(request_frame(rng, index) for index in range(rng.randrange(0, 9))) + struct.pack("!i", -1)


def load_message(gpu: int) -> bytes:
    fields = sized(b"minilm") + sized(b"/tmp/models/abc") + struct.pack("!i", 8) + sized(b"handler.py")
    return b"L" + fields + struct.pack("!i", gpu) + sized(b"json") + struct.pack("!?", True)


def read_all(reader, stream: bytes, messages: int, chunk_sizes: list[int]) -> list:
    """`messages` messages read by `reader` from `stream`, sent in chunks of the given sizes."""
    ours, theirs = socket.socketpair()

    def send():
        at, sizes = 0, itertools.cycle(chunk_sizes)
        while at < len(stream):
            size = next(sizes)
            ours.sendall(stream[at : at + size])
            at += size
        ours.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        return [reader(theirs) for _ in range(messages)]
    finally:
        sender.join()
        ours.close()
        theirs.close()


def typed(value):
    """A message with each leaf's type kept, so bytearray and bytes differ."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [typed(item) for item in value]
    return (type(value).__name__, value)


@pytest.mark.parametrize("seed", range(12))
def test_the_same_messages_as_torchserves_reader(seed, monkeypatch):
    rng = random.Random(seed)
    if seed % 4 == 3:
        monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", "false")
    stream = load_message(gpu=seed % 3 - 1) + b"".join(inference_message(rng) for _ in range(5))
    chunks = [rng.choice([1, 3, 7, 64, 4096, 1 << 20]) for _ in range(8)]
    theirs = read_all(otf_message_handler.retrieve_msg, stream, 6, [len(stream)])
    ours = read_all(messages.retrieve_msg, stream, 6, chunks)
    assert typed(ours) == typed(theirs)
    assert any(message for command, message in theirs[1:])


def test_a_field_longer_than_one_receive():
    body = json.dumps({"inputs": "x" * 300_000}).encode()
    request = sized(b"id") + struct.pack("!i", -1) + sized(b"body") + sized(b"application/json") + sized(body)
    stream = b"I" + request + struct.pack("!i", -1) + struct.pack("!i", -1)
    (command, batch), *_ = read_all(messages.retrieve_msg, stream, 1, [70_000])
    assert command == b"I" and batch[0]["parameters"][0]["value"] == body  # whole; as bytes past DECODED_IN_BATCH


def test_the_frontend_gone_ends_the_worker_as_torchserves_does():
    with pytest.raises(SystemExit) as exited:
        read_all(messages.retrieve_msg, b"I" + struct.pack("!i", 5) + b"ab", 1, [3])
    assert exited.value.code == 0


def test_an_unknown_command_is_refused():
    with pytest.raises(ValueError, match="Invalid command"):
        read_all(messages.retrieve_msg, b"X", 1, [1])


def test_installed_only_in_torchserves_worker_in_place_of_its_own_reader(monkeypatch):
    worker_script = types.ModuleType("__main__")
    worker_script.TorchModelServiceWorker = object
    worker_script.retrieve_msg = otf_message_handler.retrieve_msg
    async_loop = types.ModuleType("ts.async_service")
    async_loop.retrieve_msg = otf_message_handler.retrieve_msg
    monkeypatch.setitem(sys.modules, "ts.async_service", async_loop)

    assert not adapter.read_messages_from_memory()  # pytest's __main__ is not TorchServe's worker
    assert async_loop.retrieve_msg is otf_message_handler.retrieve_msg

    monkeypatch.setitem(sys.modules, "__main__", worker_script)
    monkeypatch.setattr(adapter.importlib.metadata, "version", lambda name: "0.11.1")
    assert not adapter.read_messages_from_memory()  # a release whose frames it does not know
    assert worker_script.retrieve_msg is otf_message_handler.retrieve_msg

    monkeypatch.setattr(adapter.importlib.metadata, "version", lambda name: "0.12.0")
    assert adapter.read_messages_from_memory()
    assert worker_script.retrieve_msg is messages.retrieve_msg
    assert async_loop.retrieve_msg is messages.retrieve_msg

    worker_script.retrieve_msg = replaced = object()  # someone else's reader stays
    assert not adapter.read_messages_from_memory()
    assert worker_script.retrieve_msg is replaced
