"""A batch of hostile bodies costs what one does under TorchServe: the worker's reader decodes only
small bodies with their batch (JSON of `[[],[],...]` is ~21 times its bytes as Python lists), a
larger one is read in its own request's turn, where it fails alone."""

import json
import tracemalloc

from fakes import RecordingSocket, decoded, ready_handler, status
from fuzzing import batch_message, nested_list_batch, nested_lists
from ts.service import Service

from ts_compiled_handlers.servers.torchserve import messages

EAGER = {"buckets": {"seq_lens": [8, 32], "batch_sizes": [1, 4]}, "compile": {"enable": False}}
ORDINARY = [b'{"inputs": "alice walks to paris"}', b'{"inputs": ["bob", "the cat sat"]}']


class Frontend:
    """The worker's socket, holding one message; `recv` hands it on without copying what is left."""

    def __init__(self, message: bytes):
        self.message, self.at = memoryview(message), 0

    def recv(self, size: int) -> bytes:
        chunk = bytes(self.message[self.at : self.at + size])
        self.at += len(chunk)
        return chunk


def read_batch(message: bytes) -> list[dict]:
    command, batch = messages.FrameReader(Frontend(message)).message()
    assert command == messages.PREDICT
    return batch


def test_a_batch_of_megabyte_nested_lists_is_read_without_decoding_them():
    hostile = nested_list_batch(seed=1, count=8, megabytes=1.0)
    bodies = [(case.body, case.content_type) for case in hostile] + [(body, "application/json") for body in ORDINARY]
    message = batch_message(bodies)
    tracemalloc.start()
    try:
        batch = read_batch(message)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    sent = sum(len(case.body) for case in hostile)
    assert peak < 2 * sent, f"{peak / sent:.1f} times the bodies' bytes"  # decoded here: ~21 times
    values = [request["parameters"][0]["value"] for request in batch]
    assert values[: len(hostile)] == [case.body for case in hostile]  # their bytes, undecoded
    assert values[len(hostile) :] == [json.loads(body) for body in ORDINARY]  # as TorchServe's reader gives them


def test_a_hostile_body_of_megabytes_fails_alone_and_its_batch_mates_are_answered(tiny_models):
    handler = ready_handler("embedding", tiny_models["embedding"], **EAGER)
    hostile = [nested_lists(1.0), nested_lists(1.0, wrapped=True)]
    bodies = [ORDINARY[0], hostile[0], ORDINARY[1], hostile[1]]
    batch = read_batch(batch_message([(body, "application/json") for body in bodies]))
    assert batch[1]["parameters"][0]["value"] == hostile[0]  # not decoded with its batch
    headers, data, request_ids = Service.retrieve_data_for_inference(batch)
    context = handler.context
    context.request_processor, context.request_ids, context.cl_socket = headers, request_ids, RecordingSocket()
    answers = decoded(handler.handle(data, context), context)
    statuses = [status(context, index) for index in range(len(bodies))]
    assert statuses[0] == statuses[2] == 200
    assert len(answers[0]["embedding"]) > 0 and len(answers[2]) == 2
    for index in (1, 3):
        assert 400 <= statuses[index] < 500 and set(answers[index]) == {"error", "code"}, answers[index]
        assert "[]" not in answers[index]["error"]  # named, not echoed
